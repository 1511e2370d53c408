"""Applying an approved change set to its zone (``approval.write: ask``). Host only.

A worker with ``ask`` writes to a private copy of the zone; the difference became a change
set targeting that zone. Applying it checks every blob, runs the scanners (files that run
code by themselves must each be acknowledged by name: ``--override-scanners`` does not cover
them, as for ``clear``), refuses deletions the zone's approval blocks, refuses any file that
changed in the zone since the run (a conflict is reported, never merged), and writes through
:class:`WorkTree`, which never follows a symlink. Re-running after a crash skips what is
already in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.audit import AuditLog
from orchestrator.staging.errors import StagingError
from orchestrator.staging.manifest import ChangeSet
from orchestrator.staging.scanners import (
    DEFAULT_SCANNERS,
    Scanner,
    acknowledgement_problem,
    blocking,
    run_scanners,
    split_sensitive,
)
from orchestrator.staging.store import ChangeStore
from orchestrator.staging.worktree import UnsafePath, WorkTree, temp_name


@dataclass(frozen=True)
class Applied:
    change_id: str
    zone: str
    written: int
    deleted: int
    already: int


def apply_to_zone(
    store: ChangeStore,
    change_id: str,
    zone_root: Path,
    *,
    allow_delete: bool,
    override_scanners: bool = False,
    acknowledged: Sequence[str] = (),
    scanners: Sequence[Scanner] = DEFAULT_SCANNERS,
    audit: AuditLog | None = None,
) -> Applied:
    """Apply ``change_id`` (a zone target, pending or approved) to ``zone_root``.

    ``acknowledged`` names each file that runs code by itself (the ``sensitive-paths``
    scanner's findings) that the person applying has read: all of them and only those;
    ``override_scanners`` covers the other scanners' findings, never these."""
    change = store.verify_blobs(change_id)
    zone = _zone_of(change)
    if change.status not in ("pending", "approved"):
        raise StagingError(
            f"change set {change_id} is {change.status}; only pending or approved ones apply"
        )
    failing, sensitive = split_sensitive(blocking(run_scanners(change, store, scanners)))
    problem = acknowledgement_problem(change_id, sensitive, acknowledged)
    if problem is not None:
        if audit is not None:
            audit.record(
                "change.refused",
                allowed=False,
                zone=zone,
                reason=problem,
                metadata={"change": change_id, "paths": list(sensitive)},
            )
        raise StagingError(f"change set {change_id}: {problem}")
    if failing and not override_scanners:
        names = ", ".join(r.name for r in failing)
        raise StagingError(
            f"change set {change_id}: scanners {names} failed; review with `orchestrator staged "
            "show`, or pass --override-scanners (audited)"
        )
    deletes = [f.path for f in change.files if f.operation == "delete"]
    if deletes and not allow_delete:
        raise StagingError(
            f"change set {change_id} deletes {len(deletes)} file(s) in zone '{zone}' "
            f"(e.g. {deletes[0]}), but the zone's approval blocks deletes"
        )
    tree = WorkTree(zone_root)
    plan: list[tuple[str, tuple[str, ...]]] = []
    already = 0
    try:
        for item in change.files:
            parts = tuple(item.path.split("/"))
            current = tree.entry(parts)
            if current.holds(item.sha256, item.mode):
                already += 1  # in place: a re-run after a crash
                continue
            if item.operation == "create":
                unchanged = current.kind == "absent"
            elif item.base_sha256 is not None:
                unchanged = current.kind == "file" and current.sha256 == item.base_sha256
            else:
                unchanged = current.kind == "file"
            if not unchanged:
                raise StagingError(
                    f"change set {change_id}: {item.path} changed in zone '{zone}' since the "
                    "run; nothing applied (re-run the worker on the current content)"
                )
            plan.append((item.operation, parts))
        written = deleted = 0
        by_path = {f.path: f for f in change.files}
        for operation, parts in plan:
            item = by_path["/".join(parts)]
            if operation == "delete":
                tree.delete(parts)
                deleted += 1
            else:
                assert item.sha256 is not None
                assert item.mode is not None
                blob = store.blob_path(change_id, item.sha256)
                tree.write(parts, blob, item.sha256, item.mode, temp_name(change_id, item.path))
                written += 1
    except UnsafePath as exc:
        raise StagingError(f"change set {change_id}: {exc}; nothing more applied") from None
    if sensitive and audit is not None:
        audit.record(
            "change.acknowledged",
            allowed=True,
            zone=zone,
            reason="files that run code by themselves acknowledged by name",
            metadata={"change": change_id, "paths": list(sensitive)},
        )
    if failing and audit is not None:
        audit.record("change.override", allowed=True, zone=zone, metadata={"change": change_id})
    store.set_status(change_id, "applied", reason=f"applied to zone {zone}", expect=change.status)
    if audit is not None:
        audit.record(
            "change.applied",
            worker=change.worker,
            run_id=change.run_id,
            session_id=change.session_id,
            trust_level=change.trust,
            zone=zone,
            metadata={"change": change_id, "written": written, "deleted": deleted},
        )
    return Applied(change_id, zone, written, deleted, already)


def _zone_of(change: ChangeSet) -> str:
    if change.target.kind != "zone" or change.target.name is None:
        raise StagingError(
            f"change set {change.id} targets the repo; use `orchestrator clear {change.id}`"
        )
    return change.target.name
