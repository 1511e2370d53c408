"""The label namespace stamped on every object the orchestrator creates.

Each container, network and volume carries the run id, the worker and its owner process
(pid, the process's start time and its pid namespace), so that leftovers of a crashed or
SIGKILLed orchestrator can be found and removed by ``gc`` even without any local state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

PREFIX = "io.orchestrator"
MANAGED = f"{PREFIX}.managed"
RUN_ID = f"{PREFIX}.run-id"
WORKER = f"{PREFIX}.worker"
TRUST = f"{PREFIX}.trust"
#: The session a run works in: ``gc`` never prunes a session a live container uses.
SESSION = f"{PREFIX}.session"
#: Objects shared between runs (egress proxies, networks): no owner process.
SHARED = f"{PREFIX}.shared"
OWNER_PID = f"{PREFIX}.owner-pid"
OWNER_START = f"{PREFIX}.owner-start"
OWNER_NS = f"{PREFIX}.owner-pidns"
#: A role some containers carry (a credential proxy, a spare): read by ``gc``'s listing.
ROLE = f"{PREFIX}.role"

#: Every label ``gc`` (and the listings it calls) reads on a container, with the value a
#: container the orchestrator makes carries when it has no other: each is set explicitly
#: on every container it makes. The engine merges an image's labels into a container's
#: (the container's own win), so an image carrying ``io.orchestrator.shared=true`` or a
#: dead owner's pid would otherwise decide what ``gc`` does with the container.
NEUTRAL = {
    MANAGED: "false",
    SHARED: "false",
    OWNER_PID: "",
    OWNER_START: "",
    OWNER_NS: "",
    RUN_ID: "",
    WORKER: "",
    TRUST: "",
    SESSION: "",
    ROLE: "",
}


def explicit(given: dict[str, str]) -> dict[str, str]:
    """``given`` with every label of :data:`NEUTRAL` it lacks set to its neutral value."""
    return {**NEUTRAL, **given}


def is_orchestrator_label(name: str) -> bool:
    """Whether ``name`` is in the orchestrator's label namespace (any case)."""
    return name.lower().startswith(f"{PREFIX}.")


@dataclass(frozen=True)
class Owner:
    """A process, identified robustly against pid reuse."""

    pid: int
    start: str
    pid_ns: str

    def labels(self) -> dict[str, str]:
        return {
            MANAGED: "true",
            OWNER_PID: str(self.pid),
            OWNER_START: self.start,
            OWNER_NS: self.pid_ns,
        }


def _start_time(pid: int) -> str:
    """The process start time in clock ticks since boot ('' when unknown or gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[:1] == [b"Z"]:  # exited; only its exit status waits for its parent
        return ""
    return fields[19].decode() if len(fields) > 19 else ""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@cache
def current_owner() -> Owner:
    """This process as an owner."""
    pid = os.getpid()
    return Owner(pid=pid, start=_start_time(pid), pid_ns=_pid_namespace())


def owner_state(labels: dict[str, str]) -> str:
    """``alive``, ``gone``, or ``foreign`` (another pid namespace: not ours to judge)."""
    pid_text = labels.get(OWNER_PID, "")
    if labels.get(OWNER_NS, "") != current_owner().pid_ns:
        return "foreign"
    if not pid_text.isdigit():
        return "gone"
    start = _start_time(int(pid_text))
    if not start or start != labels.get(OWNER_START, ""):
        return "gone"
    return "alive"
