"""Audit entries for one clearance: every commit, push, credential use and refusal.

Operations: ``clearance.committed``, ``clearance.pushed``, ``clearance.push_failed``
(allowed=False), ``clearance.refused`` (allowed=False), ``clearance.override`` (scanner
findings overridden) and ``credential.used`` (by name; a value never reaches the log, which
redacts every registered secret).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.clearance.store import ChangeSet

if TYPE_CHECKING:
    from orchestrator.audit import AuditLog

__all__ = ["Events"]


class Events:
    """Records entries for one change set (nothing is recorded without a log)."""

    def __init__(self, audit: AuditLog | None, change_id: str, repo: Path) -> None:
        self.audit = audit
        self.change_id = change_id
        self.repo = repo
        self.worker: str | None = None
        self.run_id: str | None = None
        self.session_id: str | None = None
        self.trust: str | None = None

    def bind(self, changeset: ChangeSet) -> None:
        """Name the change set's worker, run, session and trust level in later entries."""
        self.worker = str(changeset.worker)
        self.run_id = None if changeset.run_id is None else str(changeset.run_id)
        session = getattr(changeset, "session_id", None)
        self.session_id = None if session is None else str(session)
        self.trust = str(getattr(changeset.trust, "value", changeset.trust))

    def record(
        self,
        operation: str,
        *,
        allowed: bool = True,
        reason: str | None = None,
        metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Append one entry (durably) when there is a log."""
        if self.audit is None:
            return
        self.audit.record(
            operation,
            allowed=allowed,
            reason=reason,
            worker=self.worker,
            run_id=self.run_id,
            session_id=self.session_id,
            trust_level=self.trust,
            path=str(self.repo),
            metadata={"change_id": self.change_id, **(metadata or {})},
        )
