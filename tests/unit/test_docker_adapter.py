"""The Docker adapter without a daemon: error mapping and bounded retries of transient errors."""

from __future__ import annotations

import pytest
import requests
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.docker.client import is_transient
from orchestrator.docker.engine import DockerEngine
from orchestrator.errors import EngineError, EngineUnreachable, ImageMissing
from orchestrator.plan import ContainerSpec


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
        image="img", command=["true"], user="1000:1000", working_dir="/tmp", env={}, mounts=[],
        network_mode="none", read_only_rootfs=True, cap_drop=["ALL"], cap_add=[],
        security_opt=["no-new-privileges:true"], pids_limit=64, mem_limit=1 << 26,
        memswap_limit=1 << 26, nano_cpus=10**9, tmpfs={}, labels={labels.RUN_ID: "r1"},
        run_id="r1", worker="w",
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


def test_permanent_errors_fail_at_once():
    api = FakeAPI([api_error(400, "invalid mount config")])
    with pytest.raises(EngineError, match="invalid mount config"):
        DockerEngine(client=api).start("c1")
    assert api.calls == ["start"]


def test_missing_image_and_unreachable_engine_are_named():
    api = FakeAPI([docker_errors.ImageNotFound("no such image")])
    with pytest.raises(ImageMissing, match="orchestrator images build"):
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


def test_remove_of_a_missing_container_is_success():
    api = FakeAPI([docker_errors.NotFound("gone")])
    assert DockerEngine(client=api).remove("c1") is True
