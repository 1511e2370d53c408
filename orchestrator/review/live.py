"""The project's live sessions as the console sees them, through their control sockets.

Every session started with ``orchestrator session start`` has an owner process answering
on ``<sandbox root>/control/<id>.sock`` (:mod:`orchestrator.runtime.session_server`): the
console asks each one for its description and its calls waiting for approval, answers
those, and stops sessions, with the same requests as ``orchestrator session list``,
``session answer`` and ``session stop``. Nothing here imports the web stack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.config import Project

__all__ = ["LiveSession", "answer_approval", "live_sessions", "stop_session", "waiting_call"]


@dataclass(frozen=True)
class LiveSession:
    """One live session: its owner's ``info`` and the calls waiting for a person."""

    id: str
    run_id: str
    worker: str
    trust: str
    age_s: float
    idle_s: float
    pending: tuple[dict[str, Any], ...]


def live_sessions(project: Project) -> list[LiveSession]:
    """The sessions whose owner answers, oldest first (a dead owner's socket is skipped)."""
    from orchestrator.runtime.session_server import SUFFIX, control_dir

    found: list[LiveSession] = []
    with control_dir(project) as fd:
        if fd is None:
            return []
        for name in sorted(n for n in os.listdir(fd) if n.endswith(SUFFIX)):
            session_id = name.removesuffix(SUFFIX)
            pending: list[Any] = []
            try:
                info = _ask(fd, session_id, {"op": "info"})
                if info is not None:
                    pending = _ask(fd, session_id, {"op": "approvals"}) or []
            except (OrchestratorError, OSError, ValueError):
                continue
            if not isinstance(info, dict) or info.get("closed"):
                continue
            found.append(
                LiveSession(
                    id=str(info["id"]),
                    run_id=str(info.get("run_id") or ""),
                    worker=str(info.get("worker") or ""),
                    trust=str(info.get("trust") or ""),
                    age_s=float(info.get("age_s") or 0.0),
                    idle_s=float(info.get("idle_s") or 0.0),
                    pending=tuple(p for p in pending if isinstance(p, dict)),
                )
            )
    found.sort(key=lambda s: (-s.age_s, s.id))
    return found


def _ask(fd: int, session_id: str, message: dict[str, Any]) -> Any:
    from orchestrator.runtime.session_server import connect, request

    sock = connect(fd, session_id)
    if sock is None:
        return None
    with sock:
        sock.settimeout(30)
        return request(sock, message)


def _one(project: Project, session_id: str, message: dict[str, Any], *, wait: float) -> Any:
    from orchestrator.runtime.session_server import connect, control_dir, request

    with control_dir(project) as fd:
        ok_name = "/" not in session_id and session_id not in ("", ".", "..")
        sock = connect(fd, session_id) if fd is not None and ok_name else None
    if sock is None:
        raise OrchestratorError(
            f"no live session '{session_id}' (it ended, or its owner stopped answering); "
            "reload the page"
        )
    with sock:
        sock.settimeout(wait)
        return request(sock, message)


def waiting_call(
    project: Project, session_id: str, request_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The owner's ``info`` of ``session_id`` and its call ``request_id`` waiting for a
    person; an error when no such call waits (answered, or the session gone)."""
    info = _one(project, session_id, {"op": "info"}, wait=30)
    waiting = _one(project, session_id, {"op": "approvals"}, wait=30)
    for call in waiting if isinstance(waiting, list) else []:
        if isinstance(call, dict) and call.get("id") == request_id and isinstance(info, dict):
            return info, call
    raise OrchestratorError(
        f"no call '{request_id}' of session '{session_id}' waits for approval (answered "
        "already, or its caller went away); reload the Approvals page"
    )


def answer_approval(
    project: Project, session_id: str, request_id: str, *, approve: bool, by: str, via: str
) -> None:
    """Answer one waiting call of ``session_id``: the owner runs it, or declines it, and
    audits the answer (``tool.approval`` with ``by`` and ``via``)."""
    _one(
        project,
        session_id,
        {"op": "answer", "id": request_id, "approve": approve, "by": by, "via": via},
        wait=30,
    )


def stop_session(project: Project, session_id: str) -> dict[str, Any]:
    """Stop ``session_id`` as ``orchestrator session stop`` does; the closed run's result."""
    result: dict[str, Any] = _one(project, session_id, {"op": "stop"}, wait=300)
    return result
