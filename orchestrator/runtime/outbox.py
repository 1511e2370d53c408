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
from functools import cached_property
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from orchestrator.audit import AuditLog
from orchestrator.config import Project
from orchestrator.config.models import OutboxLimits
from orchestrator.plan import ContainerSpec
from orchestrator.prepare import Prepared
from orchestrator.runtime.host_folders import pristine_of

if TYPE_CHECKING:
    from orchestrator.staging import ChangeStore, Collected

# orchestrator.staging is imported where a change set is stored, not here: a run whose
# outbox is empty (or that has none) does not pay for importing it.

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
    """The project's change store, checked with its sandbox root, and reached through the
    descriptors the check opened from then on (never through the folders' names)."""
    from orchestrator.runtime.state_root import open_state_folder
    from orchestrator.staging import ChangeStore

    folder = open_state_folder(project, CHANGES_FOLDER)
    return ChangeStore(project.sandbox_root / CHANGES_FOLDER, folder=folder)


class StagingReader:
    """An outbox reader that stores each run's outbox as a pending change set."""

    def __init__(self, project: Project, audit: AuditLog) -> None:
        self.project = project
        self.audit = audit

    @cached_property
    def store(self) -> ChangeStore:
        return change_store(self.project)

    def outbox(
        self, spec: ContainerSpec, stream: IO[bytes], *, message: str | None = None
    ) -> OutboxResult:
        """Store one tar stream of a run's results (its outbox, or files a session stages)
        as a pending change set targeting the repo."""
        from orchestrator.staging import collect_tar

        limits = self.project.config.sandbox.outbox
        with (
            self.store.scratch() as tmp,
            collect_tar(stream, limits=limits, tmp_dir=tmp) as found,  # type: ignore[arg-type]
        ):
            return self._store(spec, found, message)

    def outbox_dir(
        self, spec: ContainerSpec, folder: Path, *, message: str | None = None
    ) -> OutboxResult:
        """The same for a host folder a worker wrote its results into (an engine that
        cannot hand the outbox over as a tar stream, e.g. a swarm task's results folder):
        collected by :func:`orchestrator.staging.collect_dir`, by the same rules."""
        from orchestrator.staging import collect_dir

        limits = self.project.config.sandbox.outbox
        with (
            self.store.scratch() as tmp,
            collect_dir(folder, limits=limits, tmp_dir=tmp) as found,
        ):
            return self._store(spec, found, message)

    def _store(self, spec: ContainerSpec, found: Collected, message: str | None) -> OutboxResult:
        from orchestrator.staging import ChangeMeta, ChangeTarget, create_and_audit

        rejected = [{"path": r.path, "reason": r.reason} for r in found.rejected]
        if not found.files and not found.rejected:
            return OutboxResult(change_id=None, files=0)
        meta = ChangeMeta(
            worker=spec.worker,
            trust=spec.trust,
            target=ChangeTarget.repo(),
            run_id=spec.run_id,
            session_id=spec.session_id,
            message=message or f"{spec.worker}: results of run {spec.run_id}",
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
        from orchestrator.staging import ChangeMeta, ChangeTarget, collect_dir, create_and_audit

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
