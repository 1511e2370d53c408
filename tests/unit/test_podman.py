"""Podman's differences, without an engine: recognising it, translating what the adapter
sends, and the one-line refusals (docker/podman.py). tests/integration/test_podman.py
tries the same against a real Podman."""

from __future__ import annotations

import os
import stat

import pytest
import requests

from orchestrator import labels
from orchestrator.docker import networks, podman
from orchestrator.docker.client import DockerClient
from orchestrator.errors import EngineError
from orchestrator.plan import ContainerSpec, Limits, Network

PODMAN_VERSION = {
    "Platform": {"Name": "linux/amd64/debian-12"},
    "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}, {"Name": "Conmon"}],
    "Version": "4.3.1",
}
DOCKER_VERSION = {
    "Platform": {"Name": "Docker Engine - Community"},
    "Components": [{"Name": "Engine", "Version": "20.10.24"}, {"Name": "containerd"}],
    "Version": "20.10.24",
}


def libpod_info(*, rootless: bool, cgroup: str, controllers: list[str]) -> dict[str, object]:
    return {
        "host": {
            "security": {"rootless": rootless},
            "cgroupVersion": cgroup,
            "cgroupControllers": controllers,
        }
    }


class FakePodmanApi:
    """/version, /v1.41/libpod/info and the session's response hooks."""

    base_url = "http+docker://fake-podman"

    def __init__(self, info: dict[str, object]) -> None:
        self.info = info
        self.hooks: dict[str, list[object]] = {"response": []}
        self.asked: list[str] = []

    def version(self) -> dict[str, object]:
        self.asked.append("version")
        return PODMAN_VERSION

    def get(self, url: str) -> requests.Response:
        self.asked.append(url)
        response = requests.Response()
        response.status_code = 200
        response._content = __import__("json").dumps(self.info).encode()
        return response


@pytest.fixture(autouse=True)
def fresh_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podman, "_KINDS", {})


def client(rootless: bool = False, cgroup: str = "v1", controllers: list[str] | None = None):
    wanted = ["cpuset", "cpu", "memory", "pids"] if controllers is None else controllers
    api = FakePodmanApi(libpod_info(rootless=rootless, cgroup=cgroup, controllers=wanted))
    return DockerClient(api)  # type: ignore[arg-type]


def spec(**changes: object) -> ContainerSpec:
    fields: dict[str, object] = dict(
        image="img", command=["true"], uid=1000, gid=1000,
        limits=Limits(memory=1 << 26, cpus=1.0, pids=64, timeout_s=600.0),
        labels={labels.RUN_ID: "r1"}, run_id="r1", worker="w",
    )  # fmt: skip
    fields.update(changes)
    return ContainerSpec(**fields)  # type: ignore[arg-type]


def test_docker_and_podman_are_told_apart_by_version():
    assert not podman.kind_from_version(DOCKER_VERSION).podman
    kind = podman.kind_from_version(PODMAN_VERSION)
    assert kind.podman and kind.version == "4.3.1"


def test_podman_is_asked_once_per_process_and_its_own_info_says_rootless():
    engine = client(rootless=True, controllers=[])
    first = podman.engine_kind(engine)
    assert podman.engine_kind(engine) is first
    assert engine.api.asked == ["version", "http+docker://fake-podman/v1.41/libpod/info"]
    assert first.rootless and first.cgroup_version == "1"
    assert first.label == "rootless Podman 4.3.1"


@pytest.mark.parametrize(
    ("rootless", "cgroup", "controllers", "missing"),
    [
        (False, "v1", ["cpu", "memory", "pids", "blkio"], []),
        (True, "v1", [], ["cpu", "memory", "pids"]),
        (True, "v1", ["cpu", "memory", "pids"], ["cpu", "memory", "pids"]),  # v1: never
        (True, "v2", ["cpu", "memory", "pids"], []),  # delegated
        (True, "v2", ["cpu", "io"], ["memory", "pids"]),
    ],
)
def test_limits_are_refused_exactly_where_podman_would_drop_them(
    rootless, cgroup, controllers, missing
):
    engine = client(rootless=rootless, cgroup=cgroup, controllers=controllers)
    assert podman.engine_kind(engine).missing_controllers == missing
    if not missing:
        podman.check_spec(engine, spec())
        return
    with pytest.raises(EngineError) as refused:
        podman.check_spec(engine, spec())
    message = str(refused.value)
    assert "\n" not in message
    assert f"needs its {'/'.join(missing)} limits" in message
    assert "Delegate=yes" in message and "rootless Podman" in message


def test_gvisor_and_a_full_network_are_refused_in_one_line():
    engine = client()
    with pytest.raises(EngineError, match=r"gVisor.*rootful Podman.*untrusted: runc"):
        podman.check_spec(engine, spec(isolation="gvisor", trust="untrusted"))
    with pytest.raises(EngineError, match=r"network: full.*enable_icc.*allowlist"):
        podman.check_spec(engine, spec(network=Network("full", project="0123456789ab")))
    podman.check_spec(engine, spec(network=Network("allowlist")))  # allowlists work


def test_docker_gets_everything_unchanged():
    class DockerApi:
        base_url = "http+docker://fake-docker"

        def version(self):
            return DOCKER_VERSION

    engine = DockerClient(DockerApi())  # type: ignore[arg-type]
    tmpfs = {"/staged": "rw,size=1m,mode=0700,uid=1000,gid=1000"}
    assert podman.tmpfs_for(engine, tmpfs, read_only=True) is tmpfs
    options = ['seccomp={"defaultAction":"SCMP_ACT_ERRNO"}']
    assert podman.security_opt_for(engine, options) is options
    assert podman.ulimits_for(engine, []) == []
    assert podman.outside_bridge(engine, "oeg-outside") == "oeg-outside"
    podman.check_spec(engine, spec(isolation="gvisor", network=Network("full", project="x")))


def test_tmpfs_options_keep_their_meaning_on_podman():
    converted = podman.tmpfs(
        {
            "/tmp": "rw,nosuid,nodev,size=1m,mode=1777",
            "/staged": "rw,nosuid,nodev,noexec,size=1m,mode=0700,uid=1000,gid=1000",
            "/repo/.sandbox": "ro,nosuid,nodev,noexec,size=4k,mode=0555",
        },
        read_only=True,
    )
    assert converted["/tmp"] == "rw,nosuid,nodev,size=1m,mode=1777,notmpcopyup"
    assert converted["/staged"] == "rw,nosuid,nodev,noexec,size=1m,mode=1777,notmpcopyup"
    assert converted["/repo/.sandbox"].endswith(",notmpcopyup")  # a mask shows nothing
    assert converted["/var/tmp"].startswith("ro,")
    # Not with a writable root, nor where something is mounted at or under /var/tmp.
    assert "/var/tmp" not in podman.tmpfs({}, read_only=False)
    assert "/var/tmp" not in podman.tmpfs({}, read_only=True, binds=["/var/tmp/in"])


def test_rootful_podman_gets_an_explicit_nproc_and_rootless_does_not():
    names = [u["Name"] for u in podman.ulimits_for(client(), [])]
    assert names == ["nproc"]
    podman._KINDS.clear()  # another engine at the same (fake) address
    assert podman.ulimits_for(client(rootless=True, cgroup="v2"), []) == []


def test_the_seccomp_profile_becomes_a_private_file(tmp_path):
    options = ["no-new-privileges:true", 'seccomp={"defaultAction":"SCMP_ACT_ERRNO"}']
    folder = tmp_path / "profiles"
    path = podman.profile_file(options[1].removeprefix("seccomp="), folder)
    assert path.read_text() == '{"defaultAction":"SCMP_ACT_ERRNO"}'
    assert stat.S_IMODE(os.stat(folder).st_mode) & 0o022 == 0
    assert podman.profile_file(path.read_text(), folder) == path  # reused, not rewritten
    path.write_text("tampered")
    assert podman.profile_file('{"defaultAction":"SCMP_ACT_ERRNO"}', folder).read_text() != (
        "tampered"
    )
    folder.chmod(0o777)
    with pytest.raises(EngineError, match="only it may write"):
        podman.profile_file("{}", folder)


def test_podman_s_exec_failures_read_like_docker_s():
    not_found = (
        b'Error: runc: exec failed: unable to start container process: exec: "/x": stat /x: '
        b"no such file or directory: OCI runtime attempted to invoke a command that was not found"
    )
    frames = list(podman.exec_frames(iter([("stderr", not_found)])))
    assert frames[0][0] == "stdout"
    assert frames[0][1].startswith(b"OCI runtime exec failed: runc: exec failed")
    # A worker's own later output is never touched.
    later = [("stdout", b"hi\n"), ("stderr", b"Error: exec failed\n")]
    assert list(podman.exec_frames(iter(later))) == later


def test_catatonit_s_failure_becomes_docker_s_exit_code():
    assert (
        podman.init_failure(
            b"ERROR (catatonit:6): failed to exec pid1: No such file or directory\n"
        )
        == 127
    )
    assert (
        podman.init_failure(b"ERROR (catatonit:6): failed to exec pid1: Permission denied\n") == 126
    )
    assert (
        podman.init_failure(b"some output\nERROR (catatonit:6): failed to exec pid1: x\n") is None
    )
    # Two writes, which the log may hold as two lines, or (its tail) only the second.
    split = b"ERROR (catatonit:6): \nfailed to exec pid1: No such file or directory\n"
    assert podman.init_failure(split) == 127
    assert podman.init_failure(b"failed to exec pid1: No such file or directory\n") == 127


def test_the_exit_code_waits_for_catatonit_s_whole_line(monkeypatch):
    engine = client()
    said = [b"", b"ERROR (catatonit:6): failed to exec pid1: No su", b"ERROR (catatonit:6): "
            b"failed to exec pid1: No such file or directory\n"]  # fmt: skip
    monkeypatch.setattr(engine.api, "logs", lambda *_a, **_k: said.pop(0), raising=False)
    monkeypatch.setattr(podman.time, "sleep", lambda _s: None)
    assert podman.exit_code_for(engine, "c1", 1) == 127
    assert said == []
    assert podman.exit_code_for(engine, "c1", 3) == 3  # only an exit of 1 is looked at


def test_podman_s_500_conflicts_become_409():
    response = requests.Response()
    response.status_code = 500
    response._content = b'{"message": "that name is already in use"}'
    podman._conflict_status(response)
    assert response.status_code == 409
    other = requests.Response()
    other.status_code = 500
    other._content = b'{"message": "something else broke"}'
    podman._conflict_status(other)
    assert other.status_code == 500


def test_a_podman_run_network_has_no_dns_and_the_worker_finds_its_proxy_in_etc_hosts():
    engine = client()
    posted: list[tuple[str, dict[str, object]]] = []

    def post(url: str, json: dict[str, object]) -> requests.Response:
        posted.append((url, json))
        response = requests.Response()
        response.status_code = 200
        return response

    engine.api.post = post  # type: ignore[attr-defined]
    podman.create_run_network(engine, "orchestrator-run-r1", labels={"a": "b"}, bridge="oeg-1")
    url, body = posted[0]
    assert url.endswith("/libpod/networks/create")
    assert body["dns_enabled"] is False and body["internal"] is True
    assert body["network_interface"] == "oeg-1"

    attached = {"orchestrator-run-r1": {"IPAddress": "10.89.3.1"}}
    engine.api.containers = lambda filters: [{"Id": "proxy-id"}]  # type: ignore[attr-defined]
    engine.api.inspect_container = lambda _id: {"NetworkSettings": {"Networks": attached}}  # type: ignore[attr-defined]
    allowlisted = spec(network=Network("allowlist", allow=["example.test"]))
    assert networks.run_hosts(engine, allowlisted) == {"proxy": "10.89.3.1"}
    assert networks.run_hosts(engine, spec()) is None
