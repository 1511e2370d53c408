"""The client side of a session owner's control socket (no session imported here).

``<sandbox root>/control/<session id>.sock`` is served by the session's owner
(:mod:`orchestrator.runtime.session_server`, which documents the protocol); this module
finds the folder, connects and sends one request. The command line, the review console and
:mod:`orchestrator.runtime.owners` use it without importing the server's session machinery.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError
from orchestrator.exits import Exit
from orchestrator.hostfs.flags import DIR_FLAGS

if TYPE_CHECKING:
    from orchestrator.config import Project

__all__ = ["CONTROL", "SUFFIX", "ControlError", "connect", "control_dir", "request", "socket_name"]

CONTROL = "control"
SUFFIX = ".sock"


class ControlError(OrchestratorError):
    """The control folder or socket cannot be used, or the owner answered wrongly."""


@contextlib.contextmanager
def control_dir(project: Project, *, create: bool = False) -> Iterator[int | None]:
    """A descriptor of ``<sandbox root>/control`` (None when missing and not ``create``),
    opened from the checked sandbox root's descriptor (never through its name again).

    The folder must be a real folder (no link), owned by this uid, mode 0700. Socket paths
    are used through ``/proc/self/fd/<fd>/<name>``: short, and never via a swapped link.
    """
    from orchestrator.runtime.state_root import open_state_root

    path = project.sandbox_root / CONTROL
    root = open_state_root(project)
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(CONTROL, 0o700, dir_fd=root)
        try:
            fd = os.open(CONTROL, DIR_FLAGS, dir_fd=root)
        except FileNotFoundError:
            if create:
                raise
            fd = -1
        except OSError as exc:
            raise ControlError(
                f"{path} is not a usable folder ({exc.strerror}); remove it"
            ) from None
    finally:
        os.close(root)
    if fd < 0:
        yield None
        return
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise ControlError(
                f"{path} must belong to uid {os.geteuid()} with mode 0700; remove it or "
                "chmod 700 it"
            )
        yield fd
    finally:
        os.close(fd)


def _at(fd: int, name: str) -> str:
    return f"/proc/self/fd/{fd}/{name}"


def socket_name(session_id: str) -> str:
    return session_id + SUFFIX


def connect(fd: int, session_id: str) -> socket.socket | None:
    """A connection to a live owner, or None (no socket, or nobody listening)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_at(fd, socket_name(session_id)))
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def request(
    sock: socket.socket,
    message: dict[str, Any],
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Send one request, pass events to ``on_event``, return the final result (or raise
    :class:`ControlError` with the owner's one-line error and its exit code)."""
    sock.sendall(json.dumps(message).encode() + b"\n")
    with sock.makefile("rb") as answers:
        for line in answers:
            answer = json.loads(line)
            if "event" in answer:
                if on_event is not None:
                    on_event(answer)
                continue
            if answer.get("ok"):
                return answer.get("result")
            error = ControlError(str(answer.get("error", "the session's owner failed")))
            error.exit_code = int(answer.get("exit_code", Exit.ERROR))
            raise error
    raise ControlError("the session's owner closed the connection without an answer")
