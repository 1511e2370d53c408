"""What the console shows of change sets and the audit log, read with the library only.

Nothing here imports the web stack: the views in :mod:`orchestrator.review.app` turn these
plain records into pages. Worker-made strings are returned as they are stored; the page
templates escape every string they print (terminal escapes, then HTML).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.audit import AuditEntry, AuditFilter, AuditLog, VerifyResult
from orchestrator.audit.timeutil import format_timestamp

if TYPE_CHECKING:
    from orchestrator.config import Project
    from orchestrator.staging import ChangeFile, ChangeSet, ChangeStore, Scanner, ScanResult

__all__ = [
    "AUDIT_LIMIT",
    "FINDINGS",
    "ChangeRow",
    "ChangeView",
    "DiffLine",
    "FileDiff",
    "SplitRow",
    "annotated",
    "audit_entries",
    "change_rows",
    "change_view",
    "finding_line",
    "scanners_for_change",
    "sensitive_paths",
    "side_by_side",
    "target_root",
]

#: At most this many audit entries are shown on one page (the most recent ones).
AUDIT_LIMIT = 500


@dataclass(frozen=True)
class ChangeRow:
    """One line of the change-set list."""

    change: ChangeSet
    files: int
    size: int
    findings: int | None
    """Scanner findings, or None when the change set was never scanned (open it to scan)."""


@dataclass(frozen=True)
class DiffLine:
    """One line of a file's diff as the page shows it."""

    colour: str
    text: str
    """Already escaped for the terminal (the staging diff's own text)."""
    number: int | None
    """Its line in the new file (context and added lines), else None."""
    findings: tuple[str, ...] = ()
    """The scanner findings about that line of the new file."""
    old: int | None = None
    """Its line in the current file (context and removed lines), else None."""


@dataclass(frozen=True)
class SplitRow:
    """One row of the side-by-side view: the current file's line on the left, the new
    file's on the right (either may be missing); ``whole`` spans both (headers, notes)."""

    left: DiffLine | None
    right: DiffLine | None
    whole: DiffLine | None = None


@dataclass(frozen=True)
class FileDiff:
    """One file of a change set: its diff lines and the findings about it."""

    item: ChangeFile
    index: int
    """Its position in the change set's files (the raw download's address)."""
    lines: list[DiffLine]
    findings: tuple[str, ...]
    """Findings about the file as a whole, or at a line the diff does not show."""


@dataclass(frozen=True)
class ChangeView:
    """Everything the page of one change set shows."""

    change: ChangeSet
    scans: tuple[ScanResult, ...]
    blocking: tuple[str, ...]
    sensitive: tuple[str, ...]
    root: Path | None
    files: list[FileDiff]
    trail: list[AuditEntry] = field(default_factory=list)
    trail_clipped: bool = False
    """Whether older entries of the trail than :data:`AUDIT_LIMIT` were left out."""


def target_root(project: Project, change: ChangeSet) -> Path | None:
    """The folder ``change`` would be written into: the repository, or its zone's folder."""
    if change.target.kind == "repo":
        return project.repo
    zone = project.zones.get(change.target.name or "")
    return zone.host_path if zone is not None else None


def scanners_for_change(project: Project, change: ChangeSet) -> tuple[Scanner, ...]:
    """The scanners ``staged show`` runs on ``change``: its zone's suffixes and file size."""
    from orchestrator.staging import scanners_for

    limits = project.config.sandbox.outbox
    suffixes = None
    zone = project.config.zones.get(change.target.name or "")
    if change.target.kind == "zone" and zone is not None:
        suffixes = zone.suffixes
        if zone.max_file_size is not None:
            limits = limits.model_copy(update={"max_file_size": zone.max_file_size})
    sensitive = project.config.clearance.sensitive_paths
    return scanners_for(limits=limits, suffixes=suffixes, sensitive=sensitive)


def sensitive_paths(scans: tuple[ScanResult, ...]) -> tuple[str, ...]:
    """The paths that run code by themselves: clearing wants each acknowledged by name."""
    from orchestrator.staging import SENSITIVE

    return tuple(f.path for s in scans if s.name == SENSITIVE for f in s.findings if f.path)


#: The ``findings`` filter of the list: anything, some, none (scanned, clean), never scanned.
FINDINGS = ("yes", "no", "unscanned")


def change_rows(
    store: ChangeStore,
    status: str | None = None,
    *,
    worker: str | None = None,
    run: str | None = None,
    findings: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[ChangeRow]:
    """The change sets, newest first; only those with ``status``, made by ``worker`` and
    by run (or session) ``run``, with ``findings`` (one of :data:`FINDINGS`), created at
    ``since`` or later and before ``until``, for each one given."""
    low = format_timestamp(since) if since is not None else None
    high = format_timestamp(until) if until is not None else None
    rows = [
        ChangeRow(
            change=change,
            files=len(change.files),
            size=sum(f.size for f in change.files),
            findings=None
            if change.scans is None
            else sum(len(scan.findings) for scan in change.scans),
        )
        for change in store.list(status=status)
        if (worker is None or change.worker == worker)
        and (run is None or run in (change.run_id, change.session_id))
        and (low is None or change.created_at >= low)
        and (high is None or change.created_at < high)
    ]
    if findings == "yes":
        rows = [row for row in rows if row.findings]
    elif findings == "no":
        rows = [row for row in rows if row.findings == 0]
    elif findings == "unscanned":
        rows = [row for row in rows if row.findings is None]
    rows.sort(key=lambda row: (row.change.created_at, row.change.id), reverse=True)
    return rows


def scanned_change(
    project: Project, store: ChangeStore, change_id: str
) -> tuple[ChangeSet, tuple[ScanResult, ...]]:
    """The change set ``change_id`` names and its scans: those recorded, or run now (and
    recorded while it is still open) when it was never scanned."""
    from orchestrator.staging import OPEN, run_scanners

    change = store.get(store.resolve(change_id))
    if change.scans is not None:
        return change, change.scans
    results = run_scanners(change, store, scanners_for_change(project, change))
    if change.status in OPEN:
        change = store.record_scans(change.id, results)
    return change, tuple(results)


def change_view(
    project: Project, store: ChangeStore, audit: AuditLog, change_id: str
) -> ChangeView:
    """One change set with its diff, scans (run and recorded now if never run, as ``staged
    show`` does) and the audit trail of the run or session that made it."""
    from orchestrator.staging import blocking, diff_files

    change, scans = scanned_change(project, store, change_id)
    root = target_root(project, change)
    trail: list[AuditEntry] = []
    clipped = False
    if change.run_id or change.session_id:
        trail, clipped = _recent(
            audit, AuditFilter(run=change.run_id, session=change.session_id, limit=AUDIT_LIMIT + 1)
        )
    return ChangeView(
        change=change,
        scans=tuple(scans),
        blocking=tuple(result.name for result in blocking(scans)),
        sensitive=sensitive_paths(tuple(scans)),
        root=root,
        files=annotated(change, diff_files(change, store, root), scans),
        trail=trail,
        trail_clipped=clipped,
    )


def _recent(audit: AuditLog, wanted: AuditFilter) -> tuple[list[AuditEntry], bool]:
    """The last :data:`AUDIT_LIMIT` entries ``wanted`` (asked with one more), oldest
    first, and whether any older one was left out."""
    entries = audit.query(wanted)
    clipped = len(entries) > AUDIT_LIMIT
    return (entries[-AUDIT_LIMIT:] if clipped else entries), clipped


#: A hunk header of a unified diff: where its lines start in the new file.
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
#: How the scanners name the line of a finding (``SecretScanner``: "AWS key on line 3").
_ON_LINE = re.compile(r" on line (\d+)$")


def finding_line(message: str) -> int | None:
    """The line of the new file a finding's message names, or None."""
    found = _ON_LINE.search(message)
    return int(found.group(1)) if found else None


def annotated(
    change: ChangeSet,
    files: list[tuple[ChangeFile, list[tuple[str, str]]]],
    scans: tuple[ScanResult, ...] | list[ScanResult],
) -> list[FileDiff]:
    """The diff of each file with the new file's line numbers, and every finding either
    at its line (when the diff shows that line) or with the file."""
    by_path: dict[str, list[tuple[int | None, str]]] = {}
    for scan in scans:
        for finding in scan.findings:
            if finding.path:
                said = f"{scan.name}: {finding.message}"
                by_path.setdefault(finding.path, []).append((finding_line(finding.message), said))
    positions = {item.path: i for i, item in enumerate(change.files)}
    result = []
    for item, lines in files:
        at_line: dict[int, list[str]] = {}
        whole: list[str] = []
        for line, said in by_path.get(item.path, []):
            (at_line.setdefault(line, []) if line is not None else whole).append(said)
        shown: list[DiffLine] = []
        number: int | None = None
        old = 0
        for colour, text in lines:
            hunk = _HUNK.match(text) if colour == "cyan" else None
            if hunk is not None:
                old, number = int(hunk.group(1)), int(hunk.group(2))
                shown.append(DiffLine(colour, text, None))
                continue
            if number is None or text.startswith("\\"):
                shown.append(DiffLine(colour, text, None))
                continue
            if text.startswith("-"):
                shown.append(DiffLine(colour, text, None, old=old))
                old += 1
                continue
            found = tuple(at_line.pop(number, ()))
            shown.append(DiffLine(colour, text, number, found, None if text[:1] == "+" else old))
            old += 0 if text[:1] == "+" else 1
            number += 1
        whole += [said for left in at_line.values() for said in left]  # lines not shown
        result.append(FileDiff(item, positions.get(item.path, -1), shown, tuple(whole)))
    return result


def side_by_side(lines: list[DiffLine]) -> list[SplitRow]:
    """``lines`` of a unified diff as rows of two columns: context on both sides, each run
    of removed lines next to the run of added lines that follows it, the rest (headers,
    hunk markers, notes) across both."""
    rows: list[SplitRow] = []
    removed: list[DiffLine] = []
    added: list[DiffLine] = []

    def flush() -> None:
        for i in range(max(len(removed), len(added))):
            rows.append(
                SplitRow(
                    removed[i] if i < len(removed) else None, added[i] if i < len(added) else None
                )
            )
        removed.clear()
        added.clear()

    for line in lines:
        if line.old is not None and line.number is None:
            if added:
                flush()
            removed.append(line)
        elif line.number is not None and line.old is None:
            added.append(line)
        else:
            flush()
            if line.number is not None:
                rows.append(SplitRow(line, line))
            else:
                rows.append(SplitRow(None, None, line))
    flush()
    return rows


def audit_entries(
    audit: AuditLog,
    *,
    run: str | None = None,
    operation: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[list[AuditEntry], bool, VerifyResult]:
    """The most recent :data:`AUDIT_LIMIT` entries matching ``run`` and ``operation``
    (``run.*`` is a prefix), from ``since`` (inclusive) to ``until`` (exclusive), newest
    first; whether older ones were left out; the verification of the whole chain."""
    entries, clipped = _recent(
        audit,
        AuditFilter(run=run, operation=operation, since=since, until=until, limit=AUDIT_LIMIT + 1),
    )
    entries.reverse()
    return entries, clipped, audit.verify()
