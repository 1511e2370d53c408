"""Session owners: the detached processes that hold live sessions between commands.

``orchestrator session start`` and ``session fork``, and the ``branch`` tool an agent calls
from inside its own session, all start sessions that must outlive whoever asked: each is
opened by an owner process of its own (the hidden ``orchestrator session serve``), started
in a new process session, which serves the session's control socket
(:mod:`orchestrator.runtime.session_server`) until it is stopped, idles out or reaches its
maximum lifetime. This module starts such owners and waits until each is ready; it is the
one implementation the command line and the tools share (it runs the owner as a program,
and imports nothing of the command line).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.config import Project

__all__ = [
    "BRANCH_AT_ONCE",
    "BRANCH_LIMIT",
    "FORKS_AT_ONCE",
    "START_WAIT_S",
    "OwnerError",
    "start_forks",
    "start_owner",
    "stop",
]

#: How many forks' owners :func:`start_forks` starts at once.
FORKS_AT_ONCE = 4
#: How many sessions one ``branch`` call starts at most (:meth:`Session.branch`).
BRANCH_AT_ONCE = 4
#: How many sessions one session may branch into over its life: an agent cannot fill the
#: machine with sandboxes (each fork still idles out and has a maximum lifetime).
BRANCH_LIMIT = 16
#: How long a start waits for the owner to open the session (image start, zone checks).
START_WAIT_S = 300.0


class OwnerError(OrchestratorError):
    """A session's owner could not be started, or said why it could not open the session."""


def start_owner(
    project: Project,
    worker: str,
    options: Mapping[str, Any],
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Spawn a session's owner process (``session serve``) for ``project`` and wait until it
    is ready; what it says of the session (id, run id, worker, trust, zones, pid).

    ``options`` are ``session start``'s (``trust``, ``idle_timeout``, ...): a None timeout
    means none (``never``); ``extra`` are more arguments (``("--fork", SNAPSHOT)``)."""
    from orchestrator.runtime.control import control_dir
    from orchestrator.runtime.state_root import checked_state_root

    root = checked_state_root(project)
    args = [sys.executable, "-m", "orchestrator", "session", "serve", worker,
            "--project", str(project.root)]  # fmt: skip
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if name == "session_id":
            flag = "--session"
        if isinstance(value, bool):
            args += [flag] if value else []
        elif value is not None:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
        elif name in {"idle_timeout", "max_lifetime"}:
            args += [flag, "never"]
    with control_dir(project, create=True):
        pass
    log_path = root / "control" / f"owner-{os.getpid()}-{time.monotonic_ns()}.log"
    read_end, write_end = os.pipe()
    try:
        with open(log_path, "ab") as log_file:
            os.chmod(log_path, 0o600)
            owner = subprocess.Popen(
                [*args, *extra, "--ready-fd", str(write_end), "--log", str(log_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                pass_fds=(write_end,),
                start_new_session=True,
                close_fds=True,
            )
    finally:
        os.close(write_end)
    try:
        answer = wait_ready(read_end, owner, log_path)
    finally:
        os.close(read_end)
    if "error" in answer:
        with contextlib.suppress(FileNotFoundError):
            log_path.unlink()
        raise OwnerError(str(answer["error"]))
    # Reap the owner when it ends (a zombie would look alive to gc's owner check).
    threading.Thread(target=owner.wait, name="owner-reaper", daemon=True).start()
    ready: dict[str, Any] = answer["ready"]
    return ready


def start_forks(
    project: Project,
    worker: str,
    snapshot_id: str,
    count: int,
    options: Mapping[str, Any],
) -> list[str]:
    """Start ``count`` sessions from snapshot ``snapshot_id`` (of ``worker``), each held by
    an owner of its own (up to :data:`FORKS_AT_ONCE` starting at once); their ids. Each
    owner opens its fork through :meth:`~orchestrator.runner.Orchestrator.fork` (the
    snapshot's grant, never more; audited there as ``session.fork``). All or none: if one
    fails, those started are stopped and the first failure is raised."""
    made: list[str] = []
    failed: list[BaseException] = []

    def start_one(_: int) -> None:
        try:
            info = start_owner(project, worker, options, ("--fork", snapshot_id))
            made.append(str(info["id"]))
        except BaseException as exc:  # noqa: BLE001 - raised below, after the others
            failed.append(exc)

    with ThreadPoolExecutor(min(count, FORKS_AT_ONCE)) as pool:  # their owners start at once
        list(pool.map(start_one, range(count)))
    if failed:
        for fork_id in made:
            with contextlib.suppress(OrchestratorError, OSError, ValueError):
                stop(project, fork_id)
        raise failed[0]
    return made


def stop(project: Project, session_id: str) -> Any:
    """Ask the owner of live session ``session_id`` to close it; the closed session's
    result (raises :class:`OwnerError` when no owner answers)."""
    from orchestrator.runtime.control import connect, control_dir, request

    with control_dir(project) as fd:
        sock = connect(fd, session_id) if fd is not None and "/" not in session_id else None
    if sock is None:
        raise OwnerError(f"no live session '{session_id}' in {project.root}")
    with sock:
        return request(sock, {"op": "stop"})


def wait_ready(fd: int, owner: subprocess.Popen[bytes], log_path: Path) -> dict[str, Any]:
    """The owner's first line on ``fd``: ``{"ready": ...}`` or ``{"error": ...}`` (also
    when it exits first, with the last line of its log, or does not open in time)."""
    deadline = time.monotonic() + START_WAIT_S
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            owner.terminate()  # its handler closes the session and removes the container
            return {"error": f"the session did not open within {START_WAIT_S:g} s; stopped"}
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    if b"\n" not in data:
        code = owner.wait()
        reason = last_line(log_path)
        return {"error": f"the session's owner exited with code {code} before it was ready"
                + (f": {reason}" if reason else "")}  # fmt: skip
    answer: dict[str, Any] = json.loads(data.split(b"\n", 1)[0])
    if "error" in answer:
        owner.wait()
    return answer


def last_line(log_path: Path) -> str:
    """The owner's last word in its log (an error it could not send), on one line."""
    try:
        with open(log_path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 4096))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1].removeprefix("orchestrator: ").removeprefix("error: ") if lines else ""
