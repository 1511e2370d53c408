"""The Docker adapter without a daemon: error mapping and bounded retries of transient errors."""

from __future__ import annotations

import pytest
import requests
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.docker.client import is_transient
from orchestrator.docker.engine import DockerEngine
from orchestrator.errors import EngineError, EngineUnreachable, ImageMissing
from orchestrator.plan import ContainerSpec, Limits


def api_error(status: int, explanation: str) -> docker_errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker_errors.APIError("boom", response=response, explanation=explanation)


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (requests.exceptions.ConnectionError("Connection reset by peer"), True),
        (
            requests.exceptions.ConnectionError(ConnectionRefusedError(111, "Connection refused")),
            False,
        ),
        (
            requests.exceptions.ConnectionError(FileNotFoundError(2, "No such file or directory")),
            False,
        ),
        (api_error(500, "Internal Server Error"), True),
        (api_error(503, "engine busy"), True),
        (api_error(500, 'OCI runtime create failed: exec: "x": executable file not found'), False),
        (api_error(400, "bad parameter"), False),
        (api_error(409, "conflict"), False),
        (ValueError("not docker"), False),
    ],
)
def test_transient_classification(exc, transient):
    assert is_transient(exc) is transient


class FakeAPI:
    """Just enough of docker.APIClient for create/start/remove."""

    def __init__(self, failures):
        self.failures = list(failures)
        self.calls = []

    def create_host_config(self, **kwargs):
        return kwargs

    def version(self):
        return {"Version": "20.10.24", "Components": [{"Name": "Engine"}]}

    def _maybe_fail(self, name):
        self.calls.append(name)
        if self.failures:
            raise self.failures.pop(0)

    def create_container(self, **kwargs):
        self._maybe_fail("create")
        self.labels = kwargs["labels"]
        return {"Id": "c1"}

    def start(self, container_id):
        self._maybe_fail("start")

    def remove_container(self, container_id, force, v):
        self._maybe_fail("remove")


def spec() -> ContainerSpec:
    return ContainerSpec(
        image="img", command=["true"], uid=1000, gid=1000, seccomp=None,
        limits=Limits(memory=1 << 26, cpus=1.0, pids=64, timeout_s=600.0),
        labels={labels.RUN_ID: "r1"}, run_id="r1", worker="w",
    )  # fmt: skip


def test_transient_errors_are_retried_a_bounded_number_of_times():
    api = FakeAPI([requests.exceptions.ConnectionError("reset"), api_error(502, "bad gateway")])
    assert DockerEngine(client=api).create(spec()) == "c1"
    assert api.calls == ["create", "create", "create"]


def test_retries_give_up_and_map_to_engine_error():
    api = FakeAPI([api_error(500, "Internal Server Error")] * 5)
    with pytest.raises(EngineError, match="Docker refused creating the container"):
        DockerEngine(client=api).create(spec())
    assert api.calls == ["create"] * 3


def test_retries_wait_0_1_then_0_2_s(monkeypatch):
    from orchestrator.docker import client

    waits: list[float] = []
    monkeypatch.setattr(client.time, "sleep", waits.append)
    api = FakeAPI([api_error(503, "busy")] * 5)
    with pytest.raises(EngineError, match="busy"):
        DockerEngine(client=api).create(spec())
    assert api.calls == ["create"] * 3
    assert waits == [0.1, 0.2]


def test_no_retry_starts_10_s_after_the_first_attempt(monkeypatch):
    from orchestrator.docker import client

    clock = iter([0.0, 10.0])  # the first attempt's start, then its failure
    monkeypatch.setattr(client.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(client.time, "sleep", lambda _s: pytest.fail("waited for a retry"))
    calls = []

    def slow_failure() -> None:
        calls.append(1)
        raise requests.exceptions.ConnectionError("Connection reset by peer")

    with pytest.raises(requests.exceptions.ConnectionError, match="reset by peer"):
        client.retrying(slow_failure)
    assert calls == [1]


def test_permanent_errors_fail_at_once():
    api = FakeAPI([api_error(400, "invalid mount config")])
    with pytest.raises(EngineError, match="invalid mount config"):
        DockerEngine(client=api).start("c1")
    assert api.calls == ["start"]


def test_missing_image_and_unreachable_engine_are_named():
    api = FakeAPI([docker_errors.ImageNotFound("no such image")])
    with pytest.raises(ImageMissing, match="'img' is not on this machine: .*docker build -t img"):
        DockerEngine(client=api).create(spec())
    api = FakeAPI(
        [requests.exceptions.ConnectionError(ConnectionRefusedError(111, "Connection refused"))]
    )
    with pytest.raises(EngineUnreachable, match="Docker engine unreachable"):
        DockerEngine(client=api).create(spec())


def test_every_created_container_carries_the_owner_labels():
    api = FakeAPI([])
    DockerEngine(client=api).create(spec())
    owner = labels.current_owner()
    assert api.labels[labels.RUN_ID] == "r1"
    assert api.labels[labels.OWNER_PID] == str(owner.pid)
    assert api.labels[labels.MANAGED] == "true"
    # Every label gc reads is set, so that none of an image's stands (the engine merges an
    # image's labels into a container's, the container's own winning).
    assert set(labels.NEUTRAL) <= set(api.labels)
    assert api.labels[labels.SHARED] == "false"


def test_gc_lists_managed_containers_but_not_one_whose_owner_is_its_images():
    forged = {labels.MANAGED: "true", labels.OWNER_PID: "999999", labels.OWNER_START: "1",
              labels.OWNER_NS: labels.current_owner().pid_ns}  # fmt: skip

    class Listing:
        def __init__(self):
            self.filters = []

        def images(self, all, filters):
            self.filters.append(filters)
            return [{"Id": "sha256:forged", "Labels": forged}]

        def containers(self, all, filters):
            self.filters.append(filters)
            if filters.get("name"):
                return []
            return [
                {"Id": "theirs", "Names": ["/theirs"], "ImageID": "sha256:forged",
                 "Labels": dict(forged)},
                {"Id": "ours", "Names": ["/ours"], "ImageID": "sha256:forged",
                 "Labels": {**forged, labels.OWNER_PID: "4242", labels.RUN_ID: "r2"}},
            ]  # fmt: skip

        def networks(self, filters):
            return []

        def volumes(self, filters):
            return {"Volumes": []}

    api = Listing()
    found = DockerEngine(client=api).list_managed()
    assert [o.name for o in found] == ["ours"]
    assert {"label": f"{labels.MANAGED}=true"} in api.filters  # managed=false is not ours


def test_the_plan_s_seccomp_profile_and_ulimits_reach_the_engine():
    import dataclasses
    import json

    from orchestrator.plan import SECCOMP_PROFILE, WORKER_ULIMITS

    class Recording(FakeAPI):
        def create_container(self, **kwargs):
            self.host_config = kwargs["host_config"]
            return super().create_container(**kwargs)

    api = Recording([])
    planned = dataclasses.replace(spec(), seccomp=SECCOMP_PROFILE, ulimits=list(WORKER_ULIMITS))
    DockerEngine(client=api).create(planned)
    new_privs, seccomp = api.host_config["security_opt"]
    assert new_privs == "no-new-privileges:true"
    profile = json.loads(seccomp.removeprefix("seccomp="))
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {n for rule in profile["syscalls"] for n in rule["names"]}
    assert {"read", "openat", "clone", "execve"} <= allowed
    assert not {"io_uring_setup", "io_uring_enter", "io_uring_register"} & allowed
    assert [dict(u) for u in api.host_config["ulimits"]] == [
        {"Name": "core", "Soft": 0, "Hard": 0},
        {"Name": "nofile", "Soft": 1024, "Hard": 4096},
    ]


def test_an_unknown_seccomp_profile_is_named():
    from orchestrator.docker.seccomp import security_opt
    from orchestrator.errors import OrchestratorError

    with pytest.raises(OrchestratorError, match="unknown seccomp profile 'nope'"):
        security_opt(["seccomp=nope"])


def test_remove_of_a_missing_container_is_success():
    api = FakeAPI([docker_errors.NotFound("gone")])
    assert DockerEngine(client=api).remove("c1") is True


def test_a_reply_cut_short_by_a_restarting_engine_is_a_lost_connection():
    class Cut(FakeAPI):
        def wait(self, container_id, timeout):
            raise requests.exceptions.ChunkedEncodingError("Response ended prematurely")

    with pytest.raises(EngineError, match="connection to the Docker engine lost while waiting"):
        DockerEngine(client=Cut([])).wait("c1", timeout=5)


class Exited(FakeAPI):
    """A stopped container whose OOM event may reach the engine after its exit event."""

    def __init__(self, code, flag, events):
        super().__init__([])
        self.state = {"Status": "exited", "ExitCode": code, "OOMKilled": flag,
                      "StartedAt": "2026-11-23T20:40:01.123456789Z"}  # fmt: skip
        self.events_given = events
        self.asked = []

    def inspect_container(self, container_id):
        return {"State": self.state}

    def events(self, since, until, filters, decode):
        self.asked.append((since, filters))
        return Stream(self.events_given)


class Stream(list):
    closed = False

    def close(self):
        self.closed = True


@pytest.mark.parametrize(
    ("code", "flag", "events", "oom", "asks"),
    [
        (137, True, [], True, False),  # the engine saw the OOM first: no need to ask
        (137, False, [{"status": "oom"}], True, True),  # the OOM event came after the exit
        (137, False, [], False, True),  # killed, but not for memory
        (1, False, [{"status": "oom"}], False, False),  # only a SIGKILL can be an OOM kill
    ],
)
def test_an_oom_event_after_the_exit_still_counts(code, flag, events, oom, asks):
    api = Exited(code, flag, events)
    state = DockerEngine(client=api).exit_state("c1")
    assert (state.exit_code, state.oom_killed) == (code, oom)
    assert bool(api.asked) is asks
    if asks:
        since, filters = api.asked[0]
        assert filters == {"container": "c1", "event": "oom"}
        assert since == 1795466401  # the container's start, to the second


def test_a_missing_image_names_the_fix_for_that_image():
    from orchestrator.credproxy import CREDPROXY_IMAGE
    from orchestrator.docker.images import ORCHESTRATOR_IMAGE, WORKER_IMAGE
    from orchestrator.egress import PROXY_IMAGE
    from orchestrator.errors import OWN_IMAGES

    # Every image `orchestrator images build` makes, and only those, is named as its.
    made = {WORKER_IMAGE, PROXY_IMAGE, CREDPROXY_IMAGE, ORCHESTRATOR_IMAGE}
    assert {image.rsplit(":", 1)[0] for image in made} == set(OWN_IMAGES)
    for image in (WORKER_IMAGE, PROXY_IMAGE, CREDPROXY_IMAGE):
        assert str(ImageMissing(image)).endswith(
            "build it with `orchestrator images build` (no registry is consulted)"
        )
    assert "`orchestrator images build --with-orchestrator`" in str(
        ImageMissing(ORCHESTRATOR_IMAGE)
    )
    for image in ("python:3.12", "localhost:5000/team/agent", "orchestrator/workers:latest"):
        text = str(ImageMissing(image))
        assert f"`docker build -t {image} DIR`" in text and "images build" not in text, text
