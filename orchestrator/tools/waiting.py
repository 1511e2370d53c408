"""Tool calls waiting for a person: a live session's pending approval requests.

A call that :func:`~orchestrator.tools.approval.decide` says ``needs_approval``, made on a
live session's control socket (``{"op": "tool"}``, see
:mod:`orchestrator.runtime.session_server`), is held here until somebody answers it
(``{"op": "answer"}``: the review console's *Approvals* page, or
``orchestrator session answer``) or it times out. The waiting call then runs, or is
refused as ``declined`` (:meth:`~orchestrator.tools.toolset.Toolset.decline`).

Standard library only: the owner process and its tests use it without the web stack.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from orchestrator.escaping import json_safe

__all__ = ["Answered", "Pending", "PendingApprovals"]


@dataclass(frozen=True)
class Answered:
    """A person's answer to one request: ``approve``, who gave it and through what."""

    approve: bool
    by: str
    via: str


@dataclass
class Pending:
    """One call waiting for a person."""

    id: str
    tool: str
    args: dict[str, Any]
    description: str
    asked_at: str
    answer: Answered | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the arguments with lone surrogates shown as ``\\xNN``)."""
        shown: dict[str, Any] = json_safe(
            {
                "id": self.id,
                "tool": self.tool,
                "args": self.args,
                "description": self.description,
                "asked_at": self.asked_at,
            }
        )
        return shown


class PendingApprovals:
    """The requests of one session; every method is safe to call from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, Pending] = {}

    def ask(
        self,
        tool: str,
        args: Mapping[str, Any],
        description: str,
        *,
        timeout: float,
        on_waiting: Callable[[Pending], None] | None = None,
        still_wanted: Callable[[], bool] | None = None,
    ) -> tuple[Pending, Answered | None]:
        """Hold a request until it is answered (the answer), ``timeout`` seconds pass or
        ``still_wanted`` (asked about once a second) says the caller went away (None). The
        request is listed while it waits (``on_waiting`` hears it once it is), and gone
        after."""
        pending = Pending(
            id=secrets.token_hex(8),
            tool=tool,
            args=dict(args),
            description=description,
            asked_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        with self._lock:
            self._waiting[pending.id] = pending
        try:
            if on_waiting is not None:
                on_waiting(pending)
            deadline = time.monotonic() + timeout
            while not pending.done.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break
                if still_wanted is not None and not still_wanted():
                    break
        finally:
            with self._lock:
                self._waiting.pop(pending.id, None)
        return pending, pending.answer

    def waiting(self) -> list[Pending]:
        """The requests waiting now, oldest first."""
        with self._lock:
            return sorted(self._waiting.values(), key=lambda p: (p.asked_at, p.id))

    def answer(self, request_id: str, answer: Answered) -> Pending | None:
        """Answer one waiting request; None when there is none by that id (answered
        already, timed out, or never asked)."""
        with self._lock:
            pending = self._waiting.pop(request_id, None)
            if pending is None:
                return None
            pending.answer = answer
        pending.done.set()
        return pending

    def cancel_all(self) -> None:
        """Decline every waiting request (the session is closing): nobody waits forever."""
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for pending in waiting:
            pending.answer = Answered(False, "nobody", "the session closed")
            pending.done.set()
