"""Who is at the other end of the fork server's socket, read from the kernel.

A command forked by the server runs with the server's credentials, not its client's. So the
server serves a client only when what confines a process is the same on both sides:
:func:`confinement` reads it from ``/proc/PID`` (user, groups, capabilities, NoNewPrivs,
seccomp, the LSM label, the namespaces, the cgroup, the root directory) and
:func:`differences` names what differs. What a
command can simply take over from its client is read too (:class:`Taken`: the umask and the
resource limits), and the forked child applies it (:func:`apply`).

Race-free: the caller holds a pidfd of the client (:func:`peer_pidfd`: the kernel's own
``SO_PEERPIDFD``, the process that connected, or ``pidfd_open`` of its pid on older
kernels) and checks with :func:`still_running` after reading that the process it read is
still the one that connected (a pid is not reused while its process runs).

Standard library only, like :mod:`orchestrator.cli.wire`.
"""

from __future__ import annotations

import os
import resource
import select
import socket
from dataclasses import dataclass

#: ``getsockopt`` option for a pidfd of a unix socket's peer (Linux 6.5; not in Python 3.11).
SO_PEERPIDFD = 77
#: Lines of ``/proc/PID/status`` that must be the same in client and server.
STATUS_FIELDS = (
    "Uid",
    "Gid",
    "Groups",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
)
#: Namespaces that must be the same (``/proc/PID/ns/NAME``).
NAMESPACES = ("user", "mnt", "net", "pid", "ipc", "uts", "cgroup")
#: The resource limits a command takes from its client, and their names.
LIMITS = {
    getattr(resource, name): name
    for name in (
        "RLIMIT_AS",
        "RLIMIT_CORE",
        "RLIMIT_CPU",
        "RLIMIT_DATA",
        "RLIMIT_FSIZE",
        "RLIMIT_LOCKS",
        "RLIMIT_MEMLOCK",
        "RLIMIT_MSGQUEUE",
        "RLIMIT_NICE",
        "RLIMIT_NOFILE",
        "RLIMIT_NPROC",
        "RLIMIT_RSS",
        "RLIMIT_RTPRIO",
        "RLIMIT_RTTIME",
        "RLIMIT_SIGPENDING",
        "RLIMIT_STACK",
    )
    if hasattr(resource, name)
}
_CAP_SYS_RESOURCE = 24
_NAMES = {
    "Uid": "user ids",
    "Gid": "group ids",
    "Groups": "supplementary groups",
    "NoNewPrivs": "NoNewPrivs",
    "Seccomp": "seccomp mode",
    "Seccomp_filters": "seccomp filters",
    "CapInh": "inheritable capabilities",
    "CapPrm": "permitted capabilities",
    "CapEff": "effective capabilities",
    "CapBnd": "capability bounding set",
    "CapAmb": "ambient capabilities",
    "lsm": "security label",
    "cgroup": "cgroup",
    "root": "root directory",
}


class Unreadable(Exception):
    """The client's credentials could not be read (the message says which)."""


@dataclass(frozen=True)
class Taken:
    """What a command takes over from its client."""

    umask: int
    limits: dict[int, tuple[int, int]]


def peer_pidfd(sock: socket.socket, pid: int) -> int:
    """A pidfd of the process that connected ``sock`` (whose SO_PEERCRED pid is ``pid``)."""
    try:
        fd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:  # an older kernel: the pid's process now, checked by the caller
        return os.pidfd_open(pid)
    if _pidfd_pid(fd) != pid:
        os.close(fd)
        raise Unreadable(f"the process that connected (pid {pid}) is gone")
    return fd


def still_running(pidfd: int) -> bool:
    """Whether the pidfd's process has not exited (its pid is still its own)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)


def _pidfd_pid(pidfd: int) -> int:
    with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name == "Pid":
                return int(value)
    return -1


def confinement(pid: int | str) -> dict[str, str]:
    """What confines process ``pid`` (``self`` for this one), as comparable strings."""
    found: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name in STATUS_FIELDS:
                    found[name] = " ".join(value.split())
        for name in NAMESPACES:
            found[f"ns/{name}"] = os.readlink(f"/proc/{pid}/ns/{name}")
    except OSError as exc:
        raise Unreadable(f"cannot read /proc/{pid}: {exc.strerror or exc}") from None
    if "Groups" in found:
        found["Groups"] = " ".join(sorted(found["Groups"].split(), key=int))
    try:
        with open(f"/proc/{pid}/attr/current", "rb") as handle:
            found["lsm"] = handle.read().rstrip(b"\0\n").decode("utf-8", "replace")
    except OSError:
        pass  # no LSM that labels processes
    try:  # the command runs in the server's cgroup, below the server's root directory
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            found["cgroup"] = " ".join(sorted(handle.read().split()))
        root = os.stat(f"/proc/{pid}/root")  # the folder it sees as /, whatever its path
        seen = os.readlink(f"/proc/{pid}/root")
        found["root"] = f"{seen} (device {root.st_dev}, inode {root.st_ino})"
    except OSError as exc:
        raise Unreadable(f"cannot read /proc/{pid}: {exc.strerror or exc}") from None
    return found


def differences(client: dict[str, str], server: dict[str, str]) -> list[str]:
    """What differs between two :func:`confinement` readings, one phrase each."""
    found = []
    for key in sorted(server.keys() | client.keys(), key=_order):
        ours, theirs = server.get(key), client.get(key)
        if ours != theirs:
            name = f"{key[3:]} namespace" if key.startswith("ns/") else _NAMES.get(key, key)
            found.append(f"its {name} ({theirs or 'none'}; the server's: {ours or 'none'})")
    return found


def _order(key: str) -> tuple[int, str]:
    order = [*STATUS_FIELDS, *(f"ns/{name}" for name in NAMESPACES), "lsm", "cgroup", "root"]
    return (order.index(key) if key in order else len(order), key)


def taken(pid: int) -> Taken:
    """The umask and resource limits of process ``pid``."""
    umask = None
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name == "Umask":
                    umask = int(value, 8)
        limits = {limit: resource.prlimit(pid, limit) for limit in LIMITS}
    except (OSError, ValueError) as exc:
        raise Unreadable(f"cannot read the limits of pid {pid}: {exc}") from None
    if umask is None:
        raise Unreadable(f"no umask in /proc/{pid}/status")
    return Taken(umask, limits)


def unmatched_limits(client: Taken, capabilities: str) -> list[str]:
    """The limits whose hard value the server's child could not raise to the client's."""
    if int(capabilities or "0", 16) >> _CAP_SYS_RESOURCE & 1:
        return []
    found = []
    for limit, (_soft, hard) in client.limits.items():
        ours = resource.getrlimit(limit)[1]
        if ours != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > ours):
            found.append(f"its hard {LIMITS[limit]} above the server's ({hard} > {ours})")
    return found


def apply(client: Taken) -> None:
    """In the forked child: take the client's umask and resource limits."""
    os.umask(client.umask)
    for limit, value in client.limits.items():
        resource.setrlimit(limit, value)
