"""Mount sources as the engine sees them: the orchestrator in a container, and the socket.

No daemon here: the engine's inspect of the orchestrator's own container is a fake; the
real thing runs in tests/integration/test_compose.py.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest
import requests
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.docker import engine as engine_module
from orchestrator.docker.engine import DockerEngine
from orchestrator.docker.hostpaths import (
    HostView,
    engine_sockets,
    mapping_problem,
    own_container_id,
    socket_problem,
)
from orchestrator.errors import OrchestratorError
from orchestrator.plan import ContainerSpec, Limits, Mount

ID = "b2a9d5cc07afc779fc8e490321b95b618be2afea3eb931cab4d2617cb5c220cf"

DOCKER_MOUNTINFO = f"""\
74 48 0:39 / / rw,nodev,noatime master:2 - overlay overlay rw
75 74 0:42 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
92 78 0:48 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k
93 74 254:0 /home/me/proj /home/me/proj rw,relatime - ext4 /dev/vda rw
96 74 254:0 /var/lib/docker/containers/{ID}/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/vda rw
97 74 254:0 /var/lib/docker/containers/{ID}/hostname /etc/hostname rw,relatime - ext4 /dev/vda rw
98 74 254:0 /var/lib/docker/containers/{ID}/hosts /etc/hosts rw,relatime - ext4 /dev/vda rw
"""

# /var/lib/docker on a file system of its own: the root field starts below it.
SEPARATE_FS_MOUNTINFO = (
    f"97 74 8:17 /containers/{ID}/hostname /etc/hostname rw - xfs /dev/sdb1 rw\n"
)

PODMAN_MOUNTINFO = (
    "50 40 0:33 /containers/storage/overlay-containers/"
    f"{ID}/userdata/hostname /etc/hostname rw,nosuid,nodev - tmpfs tmpfs rw\n"
)

HOST_MOUNTINFO = """\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
23 22 0:5 / /dev rw,nosuid - devtmpfs udev rw
"""


@pytest.mark.parametrize("text", [DOCKER_MOUNTINFO, SEPARATE_FS_MOUNTINFO, PODMAN_MOUNTINFO])
def test_own_container_is_found_from_the_files_docker_mounts_into_it(tmp_path, text):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(text)
    assert own_container_id(mountinfo) == ID


def test_outside_a_container_there_is_no_own_container(tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(HOST_MOUNTINFO)
    assert own_container_id(mountinfo) is None
    assert own_container_id(tmp_path / "missing") is None
    # A /etc/hostname bound from somewhere else names no container.
    mountinfo.write_text("97 74 254:0 /srv/names/web /etc/hostname rw - ext4 /dev/vda rw\n")
    assert own_container_id(mountinfo) is None


def inspected(*pairs: tuple[str, str]) -> dict:
    return {
        "Mounts": [
            {"Type": "bind", "Source": source, "Destination": target, "RW": True}
            for source, target in pairs
        ]
    }


def test_host_path_follows_the_most_specific_mount():
    view = HostView.from_inspect(
        ID,
        inspected(("/srv/ci", "/work"), ("/srv/other", "/work/inner"), ("/dev/shm", "/dev/shm")),
    )
    assert view.host_path("/work/a/b") == PurePosixPath("/srv/ci/a/b")
    assert view.host_path("/work") == PurePosixPath("/srv/ci")
    assert view.host_path("/work/inner/x") == PurePosixPath("/srv/other/x")
    assert view.host_path("/workshop") is None  # a prefix of the name is not a parent
    assert view.host_path("/opt/project") is None  # the container's own file system


def test_same_path_mapping_passes_and_others_are_refused_with_the_fix():
    view = HostView.from_inspect(
        ID, inspected(("/home/me/proj", "/home/me/proj"), ("/home/me/proj", "/project"))
    )
    assert mapping_problem(view, "/home/me/proj/downloads", "/input") is None

    moved = mapping_problem(view, "/project/downloads", "/input")
    assert moved is not None and "\n" not in moved
    assert "mount source /project/downloads (for /input)" in moved
    assert "is /home/me/proj/downloads on the engine's host" in moved
    assert '-v "$PWD:$PWD" -w "$PWD"' in moved and "docs/ci.md" in moved

    inside = mapping_problem(view, "/dev/shm/orchestrator-secrets-1", "/run/secrets")
    assert inside is not None and "inside the orchestrator's own container b2a9d5cc07af" in inside


def test_a_socket_file_and_folders_holding_the_engine_socket_are_refused(tmp_path, monkeypatch):
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    sock_path = engine_dir / "docker.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock_path))
        (tmp_path / "link").symlink_to(sock_path)
        monkeypatch.setenv("DOCKER_HOST", f"unix://{sock_path}")
        sockets = engine_sockets()
        assert sock_path in sockets and Path("/var/run/docker.sock") in sockets

        assert "is a socket" in socket_problem(str(sock_path), "/x", sockets)
        assert "is a socket" in socket_problem(str(tmp_path / "link"), "/x", sockets)
        for holder in (engine_dir, tmp_path, Path("/"), Path("/var/run"), Path("/run")):
            problem = socket_problem(str(holder), "/x", sockets)
            assert problem is not None and "engine's socket" in problem, holder
        plain = tmp_path / "zone"
        plain.mkdir()
        assert socket_problem(str(plain), "/zone", sockets) is None


class InspectingAPI:
    """The engine's answers the mount check uses, and a record of what was asked."""

    def __init__(self, answer):
        self.answer = answer
        self.calls: list[str] = []

    def inspect_container(self, container_id):
        self.calls.append(f"inspect {container_id}")
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def create_host_config(self, **kwargs):  # pragma: no cover - must not be reached
        self.calls.append("create_host_config")
        return kwargs

    def create_container(self, **kwargs):  # pragma: no cover - must not be reached
        self.calls.append("create_container")
        return {"Id": "c1"}


def spec_with(*mounts: Mount) -> ContainerSpec:
    return ContainerSpec(
        image="img", command=["true"], uid=1000, gid=1000, mounts=list(mounts),
        limits=Limits(memory=1 << 26, cpus=1.0, pids=64, timeout_s=600.0),
        labels={labels.RUN_ID: "r1"}, run_id="r1", worker="w",
    )  # fmt: skip


def test_create_refuses_a_project_mounted_at_another_path_before_anything_exists(
    tmp_path, monkeypatch
):
    zone = tmp_path / "downloads"
    zone.mkdir()
    api = InspectingAPI(inspected(("/srv/checkout", str(tmp_path))))
    monkeypatch.setattr(engine_module, "own_container_id", lambda: ID)
    engine = DockerEngine(client=api)
    spec = spec_with(Mount(source=str(zone), target="/input", read_only=True))

    with pytest.raises(OrchestratorError, match="is /srv/checkout/downloads on the engine's host"):
        engine.create(spec)
    assert api.calls == [f"inspect {ID}"]  # nothing was created

    # Asked once per engine object: a second run does not inspect again.
    with pytest.raises(OrchestratorError):
        engine.create(replace(spec, run_id="r2"))
    assert api.calls == [f"inspect {ID}"]


def test_same_path_mapping_passes_the_check(tmp_path, monkeypatch):
    zone = tmp_path / "downloads"
    zone.mkdir()
    monkeypatch.setattr(engine_module, "own_container_id", lambda: ID)
    engine = DockerEngine(client=InspectingAPI(inspected((str(tmp_path), str(tmp_path)))))
    engine.check_mounts(spec_with(Mount(source=str(zone), target="/input", read_only=True)))


def test_outside_a_container_or_in_one_the_engine_does_not_know_nothing_is_mapped(
    tmp_path, monkeypatch
):
    zone = tmp_path / "downloads"
    zone.mkdir()
    spec = spec_with(Mount(source=str(zone), target="/input", read_only=True))

    monkeypatch.setattr(engine_module, "own_container_id", lambda: None)
    api = InspectingAPI(inspected(("/elsewhere", str(tmp_path))))
    DockerEngine(client=api).check_mounts(spec)
    assert api.calls == []

    response = requests.Response()
    response.status_code = 404
    monkeypatch.setattr(engine_module, "own_container_id", lambda: ID)
    api = InspectingAPI(docker_errors.NotFound("no such container", response=response))
    DockerEngine(client=api).check_mounts(spec)  # docker-in-docker, a remote engine
    assert api.calls == [f"inspect {ID}"]


def test_create_refuses_the_engine_socket_whatever_the_plan_says(monkeypatch):
    monkeypatch.setattr(engine_module, "own_container_id", lambda: None)
    api = InspectingAPI({})
    engine = DockerEngine(client=api)
    for source in ("/var/run/docker.sock", "/run", "/"):
        spec = spec_with(Mount(source=source, target="/mnt", read_only=True))
        with pytest.raises(OrchestratorError, match="engine's socket|is a socket"):
            engine.create(spec)
    assert api.calls == []
