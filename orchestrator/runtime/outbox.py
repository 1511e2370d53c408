"""From what a run produced to pending change sets on the host.

The outbox tar stream (see :mod:`orchestrator.runtime.supervised`) is parsed as hostile
data by :func:`orchestrator.staging.collect_tar`; what survives becomes a ``pending``
change set targeting the trusted repo. For zones with ``approval.write: ask``, the run's
private copy is compared with the zone (:func:`orchestrator.staging.collect_dir`) and the
difference becomes a change set targeting that zone. Every rejected entry is audited with
its reason; nothing reaches the repo or a zone until a person approves it on the host.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.audit import AuditLog
from orchestrator.config import Project
from orchestrator.config.models import OutboxLimits
from orchestrator.plan import ContainerSpec
from orchestrator.runtime.preparation import Prepared, pristine_of
from orchestrator.staging import (
    ChangeMeta,
    ChangeStore,
    ChangeTarget,
    collect_dir,
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
    zone: str | None = None
    """For an ``ask`` zone's change set: the zone it targets (None: the repo)."""

    def summary(self) -> dict[str, Any]:
        return {
            "change_id": self.change_id,
            "files": self.files,
            "rejected": self.rejected,
            "zone": self.zone,
        }


def zone_limits(project: Project, zone: str) -> OutboxLimits:
    """The outbox caps, with the zone's own per-file cap where it is smaller."""
    limits = project.config.sandbox.outbox
    cap = project.zones[zone].config.max_file_size
    if cap is None:
        return limits
    return limits.model_copy(update={"max_file_size": min(limits.max_file_size, cap)})


def change_store(project: Project) -> ChangeStore:
    return ChangeStore(project.sandbox_root / CHANGES_FOLDER)


class StagingReader:
    """An outbox reader that stores each run's outbox as a pending change set."""

    def __init__(self, project: Project, audit: AuditLog) -> None:
        self.project = project
        self.audit = audit
        self.store = change_store(project)

    def outbox(self, spec: ContainerSpec, stream: IO[bytes]) -> OutboxResult:
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

    def zones(self, prepared: Prepared) -> list[OutboxResult]:
        """Each ``ask`` zone's private copy, compared with the zone, as a change set."""
        results = []
        for zone in prepared.grant.zones:
            if zone.ask_base is None:
                continue
            try:
                results.append(self._zone(prepared, zone.name, zone.host_path))
            finally:
                shutil.rmtree(zone.host_path, ignore_errors=True)
                shutil.rmtree(pristine_of(zone.host_path), ignore_errors=True)
        return results

    def _zone(self, prepared: Prepared, name: str, copy: Path) -> OutboxResult:
        spec = prepared.spec
        zone = prepared.project.zones[name].config
        limits = zone_limits(self.project, name)
        with (
            self.store.scratch() as tmp,
            collect_dir(
                copy, base=pristine_of(copy), limits=limits, suffixes=zone.suffixes, tmp_dir=tmp
            ) as found,
        ):
            rejected = [{"path": r.path, "reason": r.reason} for r in found.rejected]
            if not found.files and not found.rejected:
                return OutboxResult(change_id=None, files=0, zone=name)
            meta = ChangeMeta(
                worker=spec.worker,
                trust=spec.trust,
                target=ChangeTarget.zone(name),
                run_id=spec.run_id,
                session_id=spec.session_id,
                message=f"{spec.worker}: changes to zone {name} from run {spec.run_id}",
            )
            change = create_and_audit(self.store, found, meta, self.audit)
        return OutboxResult(change.id, len(change.files), rejected, zone=name)
