"""From a run's outbox to a pending change set on the host.

The outbox tar stream (see :mod:`orchestrator.runtime.supervised`) is parsed as hostile
data by :func:`orchestrator.staging.collect_tar`; what survives becomes a ``pending``
change set targeting the trusted repo, and every rejected entry is audited with its reason.
Nothing reaches the repo until a person clears it (``orchestrator clear``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, Any

from orchestrator.audit import AuditLog
from orchestrator.config import Project
from orchestrator.plan import ContainerSpec
from orchestrator.staging import (
    ChangeMeta,
    ChangeStore,
    ChangeTarget,
    collect_tar,
    create_and_audit,
)

CHANGES_FOLDER = "changes"


@dataclass(frozen=True)
class OutboxResult:
    """What one run's outbox became: a change set (when anything was there), and refusals."""

    change_id: str | None
    files: int
    rejected: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"change_id": self.change_id, "files": self.files, "rejected": self.rejected}


def change_store(project: Project) -> ChangeStore:
    return ChangeStore(project.sandbox_root / CHANGES_FOLDER)


class StagingReader:
    """An outbox reader that stores each run's outbox as a pending change set."""

    def __init__(self, project: Project, audit: AuditLog) -> None:
        self.project = project
        self.audit = audit
        self.store = change_store(project)

    def __call__(self, spec: ContainerSpec, stream: IO[bytes]) -> OutboxResult:
        limits = self.project.config.sandbox.outbox
        with (
            self.store.scratch() as tmp,
            collect_tar(stream, limits=limits, tmp_dir=tmp) as found,  # type: ignore[arg-type]
        ):
            rejected = [{"path": r.path, "reason": r.reason} for r in found.rejected]
            if not found.files and not found.rejected:
                return OutboxResult(change_id=None, files=0)
            meta = ChangeMeta(
                worker=spec.worker,
                trust=spec.trust,
                target=ChangeTarget.repo(),
                run_id=spec.run_id,
                session_id=spec.session_id,
                message=f"{spec.worker}: results of run {spec.run_id}",
            )
            change = create_and_audit(self.store, found, meta, self.audit)
        return OutboxResult(change_id=change.id, files=len(change.files), rejected=rejected)
