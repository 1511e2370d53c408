"""Tools bound to one session: definitions, approval decisions and calls.

::

    tools = Toolset(session)
    definitions = tools.definitions()              # [{"name", "description", "input_schema"}]
    decision = tools.needs_approval("delete", {"path": "/data/old.txt"})
    answer = tools.call("delete", {"path": "/data/old.txt"}, approved=person_said_yes)
    # {"ok": True, "result": {...}}  or  {"ok": False, "error": "...", "status": "..."}

A call is checked against its schema, then decided (:mod:`orchestrator.tools.approval`):
``blocked`` calls and ``needs_approval`` calls without ``approved=True`` are refused, and
each refusal is written to the audit log as ``tool.refused``. The session's own operations
audit themselves, allowed or refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, cast

from orchestrator.audit import AuditLog
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.escaping import json_safe
from orchestrator.sandbox import as_dict
from orchestrator.tools.approval import Decision, decide
from orchestrator.tools.schemas import BY_NAME, SPECS, InvalidArguments, validate

log = logging.getLogger(__name__)

Answer = dict[str, Any]


class _HasToDict(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


class _Files(Protocol):
    audit: AuditLog | None
    worker: str | None


class ToolSession(Protocol):
    """What the tools need of a session (``orchestrator.runtime.session.Session`` has it)."""

    @property
    def id(self) -> str: ...

    @property
    def files(self) -> Any: ...

    def read(self, path: str, offset: int | None = None, limit: int | None = None) -> Any: ...
    def write(self, path: str, content: str | bytes, append: bool = False) -> Any: ...
    def delete(self, path: str) -> Any: ...
    def list(self, path: str = "/") -> Any: ...
    def stat(self, path: str) -> Any: ...
    def security_context(self) -> dict[str, Any]: ...
    def stage(self, files: Sequence[str], message: str) -> str: ...
    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
    ) -> _HasToDict: ...


Refusal = Literal["invalid_arguments", "blocked", "needs_approval", "declined", "failed"]


def refusal(message: str, status: Refusal, decision: Decision | None = None) -> Answer:
    answer: Answer = {"ok": False, "error": message, "status": status}
    if decision is not None:
        answer["approval"] = decision.to_dict()
    return answer


class Toolset:
    """The sandbox tools for one session. ``audit`` defaults to the session's own log."""

    def __init__(self, session: ToolSession, *, audit: AuditLog | None = None) -> None:
        self.session = session
        files = getattr(session, "files", None)
        self.audit = audit if audit is not None else getattr(files, "audit", None)
        self.worker: str | None = getattr(session, "worker", None) or getattr(files, "worker", None)

    # -- definitions ----------------------------------------------------------------------

    @staticmethod
    def definitions() -> list[dict[str, Any]]:
        """``[{"name", "description", "input_schema"}]``, the shape most LLM APIs take."""
        return [spec.to_dict() for spec in SPECS]

    @staticmethod
    def openai_definitions() -> list[dict[str, Any]]:
        """``[{"type": "function", "function": {"name", "description", "parameters"}}]``."""
        return [spec.to_openai() for spec in SPECS]

    # -- approvals ------------------------------------------------------------------------

    def needs_approval(self, name: str, args: Mapping[str, Any] | None = None) -> Decision:
        """``pre_approved``, ``needs_approval`` (with a one-line description) or
        ``blocked`` (with the reason). Raises :class:`InvalidArguments` for a bad call."""
        checked = validate(name, dict(args) if args is not None else {})
        return decide(name, checked, self.session.security_context())

    # -- calls ----------------------------------------------------------------------------

    def call(
        self, name: str, args: Mapping[str, Any] | None = None, *, approved: bool = False
    ) -> Answer:
        """Run one tool call and answer JSON-ready data; refusals and failures are answers
        too (``ok: false`` with a message that says what to do instead), never exceptions.

        Every string of the answer is valid UTF-8: a lone surrogate (a worker's file name
        that is not UTF-8) is shown as ``\\xNN`` (:func:`~orchestrator.escaping.json_safe`).
        An unexpected failure is a ``failed`` answer too (the session's own operations
        have audited it)."""
        try:
            answer = self._call(name, args, approved)
        except Exception as exc:  # a bug or an unforeseen failure: still an answer
            log.exception("tool %r failed unexpectedly", name)
            answer = refusal(f"{name} failed unexpectedly: {type(exc).__name__}: {exc}", "failed")
        return cast(Answer, json_safe(answer))

    def _call(self, name: str, args: Mapping[str, Any] | None, approved: bool) -> Answer:
        try:
            checked = validate(name, dict(args) if isinstance(args, Mapping) else args)
        except InvalidArguments as exc:
            self._refused(name, "invalid_arguments", str(exc), None, args)
            return refusal(str(exc), "invalid_arguments")
        decision = decide(name, checked, self.session.security_context())
        if decision.status == "blocked":
            reason = decision.reason or f"{decision.description}: blocked"
            self._refused(name, "blocked", reason, decision, checked)
            return refusal(reason, "blocked", decision)
        if decision.status == "needs_approval" and not approved:
            message = f"needs approval: {decision.description}"
            self._refused(name, "needs_approval", message, decision, checked)
            return refusal(message, "needs_approval", decision)
        try:
            result = self._run(name, checked)
        except ConfigError as exc:  # PolicyError: the session refused it, and audited it
            return refusal("; ".join(exc.problems) or str(exc), "blocked")
        except OrchestratorError as exc:
            return refusal(str(exc), "failed")
        return {"ok": True, "result": result}

    def _run(self, name: str, args: dict[str, Any]) -> Any:
        session = self.session
        handlers: dict[str, Callable[[], Any]] = {
            "list": lambda: as_dict(session.list(args["path"])),
            "read": lambda: as_dict(
                session.read(args["path"], args.get("offset"), args.get("limit"))
            ),
            "write": lambda: as_dict(
                session.write(args["path"], args["content"], append=args["append"])
            ),
            "delete": lambda: as_dict(session.delete(args["path"])),
            "stat": lambda: as_dict(session.stat(args["path"])),
            "exec": lambda: session.exec(
                args["command"],
                cwd=args.get("cwd"),
                env=args.get("env"),
                timeout=args.get("timeout"),
                stdin=args.get("stdin"),
            ).to_dict(),
            "stage": lambda: {"change_set": session.stage(args["files"], args["message"])},
            "context": session.security_context,
            "checkpoint": lambda: _checkpoint(session),
            "branch": lambda: _branch(session, args),
        }
        return handlers[name]()

    def decline(self, name: str, args: Mapping[str, Any] | None, decision: Decision) -> Answer:
        """The answer (audited as ``tool.refused``) when the person asked said no."""
        message = f"not approved: {decision.description}; the person asked declined it"
        self._refused(name, "declined", message, decision, args)
        return cast(Answer, json_safe(refusal(message, "declined", decision)))

    def _refused(
        self, name: str, status: Refusal, reason: str, decision: Decision | None, args: Any
    ) -> None:
        if self.audit is None:
            return
        path = args.get("path") if isinstance(args, Mapping) else None
        self.audit.record(
            "tool.refused",
            allowed=False,
            reason=reason,
            worker=self.worker,
            run_id=getattr(self.session, "run_id", None),
            session_id=self.session.id,
            trust_level=self.session.security_context().get("trust"),
            path=path if isinstance(path, str) else None,
            metadata={
                "tool": name,
                "status": status,
                **({"description": decision.description} if decision else {}),
            },
        )


__all__ = ["BY_NAME", "Answer", "ToolSession", "Toolset"]


def _checkpoint(session: Any) -> dict[str, Any]:
    """The ``checkpoint`` tool: the session's :meth:`snapshot`, as its id, size and time."""
    snap = session.snapshot()
    return {"snapshot": snap.id, "bytes": snap.bytes, "seconds": snap.seconds}


def _branch(session: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    """The ``branch`` tool: the session's :meth:`branch` (forks held by owners of their
    own, outliving this call), as their ids, the snapshot's id and the time it took."""
    branch = getattr(session, "branch", None)
    if branch is None:
        raise OrchestratorError("this session cannot branch: open it with orchestrator")
    result: dict[str, Any] = branch(args["count"], args.get("snapshot"))
    return result
