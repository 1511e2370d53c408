"""Mount sources as the engine sees them, and the one socket no container may get.

The engine resolves a bind mount's source on its own host, not in the caller's filesystem.
When the orchestrator itself runs in a container of that engine (compose/compose.yaml, a
CI job container given the socket), a folder it checks and prepares at ``/a/b`` is the
same folder the engine mounts only if its container has the host's ``/a/b`` mounted at
``/a/b``. Otherwise the worker would get a missing folder, or worse a different host folder
that happens to live at that path. :class:`HostView` answers "where is this path on the
host?" from the engine's inspect of the orchestrator's own container (one request per
process), and :func:`mapping_problem` turns a mismatch into a one-line refusal.

Finding that container: Docker bind-mounts ``/etc/hostname``, ``/etc/hosts`` and
``/etc/resolv.conf`` from ``.../containers/<id>/`` on the host, which
``/proc/self/mountinfo`` shows. No such line: not in a container, nothing to map. A
container the engine does not know (docker-in-docker, a remote engine) cannot be checked;
the rule in docs/ci.md still applies there.

:func:`socket_problem` is the last guard before a worker's container is created: no mount
source may be, or hold, the engine's socket, whatever the plan says (the project loader
refuses such zones first; this holds for every path into ``create``).
"""

from __future__ import annotations

import os
import re
import socket as sockets_
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

#: Files Docker bind-mounts into every container from its own folder on the host.
_MARKERS = frozenset({"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"})
_CONTAINER_FOLDER = re.compile(r"containers/([0-9a-f]{64})/")

#: Where engines put their sockets when nothing else is said.
DEFAULT_SOCKETS = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
)

FIX = 'mount it at the same path on both sides (`-v "$PWD:$PWD" -w "$PWD"`; see docs/ci.md)'


def own_container_id(mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """The id of the container this process runs in, or None outside a container."""
    try:
        lines = mountinfo.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 4 and fields[4] in _MARKERS:
            found = _CONTAINER_FOLDER.search(fields[3])
            if found:
                return found.group(1)
    return None


@dataclass(frozen=True)
class HostView:
    """The orchestrator's container and what it has mounted from the engine's host."""

    container: str
    mounts: tuple[tuple[PurePosixPath, PurePosixPath], ...]
    """(path in the container, path on the host), longest container path first."""

    @classmethod
    def from_inspect(cls, container: str, inspected: Mapping[str, Any]) -> HostView:
        pairs = []
        for mount in inspected.get("Mounts") or []:
            target, source = mount.get("Destination"), mount.get("Source")
            if target and source:
                pairs.append((PurePosixPath(target), PurePosixPath(source)))
        pairs.sort(key=lambda pair: len(pair[0].parts), reverse=True)
        return cls(container=container, mounts=tuple(pairs))

    def host_path(self, path: str) -> PurePosixPath | None:
        """Where ``path`` (in this container) lies on the host; None when it lies in the
        container's own filesystem, which no other container can mount."""
        inside = PurePosixPath(path)
        for target, source in self.mounts:
            if inside == target or target in inside.parents:
                return source / inside.relative_to(target)
        return None


def mapping_problem(view: HostView, source: str, target: str) -> str | None:
    """Why the engine would not mount the folder the orchestrator means, or None."""
    host = view.host_path(source)
    if host == PurePosixPath(source):
        return None
    where = f"mount source {source} (for {target})"
    container = view.container[:12]
    if host is None:
        return (
            f"{where} lies inside the orchestrator's own container {container}, not in a "
            f"folder mounted from the engine's host, so the engine cannot mount it; {FIX}"
        )
    return (
        f"{where} is {host} on the engine's host: the orchestrator's container {container} "
        f"mounts that folder at another path, and the engine would mount whatever is at "
        f"{source} on the host; {FIX}"
    )


def engine_socket() -> Path | None:
    """The unix socket of the engine in use (None: a TCP or SSH engine)."""
    named = os.environ.get("DOCKER_HOST", "")
    if not named:
        return Path(DEFAULT_SOCKETS[0])
    return Path(named.removeprefix("unix://")) if named.startswith("unix://") else None


def same_mount_namespace(socket_path: Path) -> bool:
    """Whether the process serving ``socket_path`` shares this process's mount namespace
    (under socket activation the listener is init: the engine's pid file names it)."""
    try:
        with sockets_.socket(sockets_.AF_UNIX, sockets_.SOCK_STREAM) as conn:
            conn.settimeout(2)
            conn.connect(str(socket_path))
            creds = conn.getsockopt(
                sockets_.SOL_SOCKET, sockets_.SO_PEERCRED, struct.calcsize("3i")
            )
        pid = struct.unpack("3i", creds)[0]
        if pid == 1:  # a socket systemd activated: the engine is not its listener
            pid = int(Path("/run/docker.pid").read_text().strip() or "0")
        ours = os.stat("/proc/self/ns/mnt")
        theirs = os.stat(f"/proc/{pid}/ns/mnt")
        return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)
    except (OSError, ValueError):
        return False


def engine_sockets(docker_host: str | None = None) -> list[Path]:
    """The engine sockets to keep out of containers: the one in use and the usual ones."""
    named = os.environ.get("DOCKER_HOST", "") if docker_host is None else docker_host
    sockets = [Path(path) for path in DEFAULT_SOCKETS]
    if named.startswith("unix://"):
        sockets.append(Path(named.removeprefix("unix://")))
    return sockets


def socket_problem(source: str, target: str, sockets: Iterable[Path]) -> str | None:
    """Why ``source`` must not be mounted into a worker: it is a socket, or it is, or
    holds, an engine socket (checked both as named and with links resolved)."""
    path = Path(source)
    real = Path(os.path.realpath(path))
    try:
        is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        is_socket = False
    if is_socket:
        return f"mount source {source} (for {target}) is a socket; no worker gets one"
    for socket in sockets:
        for candidate in {socket, Path(os.path.realpath(socket))}:
            if candidate in (path, real) or path in candidate.parents or real in candidate.parents:
                return (
                    f"mount source {source} (for {target}) would give the container the "
                    f"engine's socket {socket}, which is root on the host; no worker gets it"
                )
    return None
