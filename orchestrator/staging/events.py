"""Audit entries for change sets: creation (with one entry per refused entry) and review.

Operations written: ``change.created``; ``change.entry_rejected`` (``allowed`` false, the
printable path and the reason) once per rejection; and, from the review commands,
``change.reviewed``, ``change.discarded`` and ``change.rejected``. Every entry carries the
change set id in ``metadata.change_id``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

from orchestrator.audit import AuditLog
from orchestrator.staging.collected import Collected
from orchestrator.staging.errors import StagingError
from orchestrator.staging.manifest import ChangeMeta, ChangeSet
from orchestrator.staging.store import ChangeStore

__all__ = ["create_and_audit", "record_change"]


def record_change(
    audit: AuditLog,
    operation: str,
    change: ChangeSet,
    *,
    allowed: bool = True,
    reason: str | None = None,
    path: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> None:
    """Append one ``change.*`` entry about ``change`` to ``audit``."""
    audit.record(
        operation,
        allowed=allowed,
        reason=reason,
        worker=change.worker,
        run_id=change.run_id,
        session_id=change.session_id,
        trust_level=change.trust,
        zone=change.target.name,
        path=path,
        metadata={"change_id": change.id, "target": str(change.target), **(metadata or {})},
    )


def create_and_audit(
    store: ChangeStore, collected: Collected, meta: ChangeMeta, audit: AuditLog
) -> ChangeSet:
    """Store ``collected`` as a change set and audit it, with every rejected entry.

    When the audit log cannot be written, the new change set is discarded (it must not be
    reviewed or cleared unaudited) and the :class:`~orchestrator.errors.AuditError` is
    raised.
    """
    change = store.create(collected, meta)
    operations = Counter(f.operation for f in change.files)
    try:
        record_change(
            audit,
            "change.created",
            change,
            metadata={
                "files": len(change.files),
                "bytes": sum(f.size for f in change.files),
                "operations": dict(operations),
                "rejected": len(change.rejected),
                "truncated": change.truncated,
            },
        )
        for rejection in change.rejected:
            record_change(
                audit,
                "change.entry_rejected",
                change,
                allowed=False,
                reason=rejection.reason,
                path=rejection.path,
            )
    except BaseException:
        with contextlib.suppress(StagingError):
            store.set_status(change.id, "discarded", reason="its creation could not be audited")
        raise
    return change
