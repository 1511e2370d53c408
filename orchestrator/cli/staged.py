"""``orchestrator staged``: list, show, discard and reject change sets awaiting review.

The group is meant to be attached to the main command with ``cli.add_command(staged)``.
Errors are :class:`~orchestrator.errors.OrchestratorError`\\ s, left for the main command
to turn into one line and exit code 125. Every review action is written to the project's
audit log (``change.reviewed``, ``change.discarded``, ``change.rejected``). Worker-made
text (paths, messages, file content) is always shown escaped; the diff is coloured only
when stdout is a terminal and ``--no-color`` is not given.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from orchestrator.cli.options import json_option, project_option
from orchestrator.review.changes import scanned_change, sensitive_paths, target_root

if TYPE_CHECKING:
    from orchestrator.config import Project
    from orchestrator.staging import ChangeSet, ChangeStore, ScanResult

__all__ = ["open_store", "staged"]

F = TypeVar("F", bound=Callable[..., Any])
STATUSES = ("pending", "approved", "rejected", "discarded", "committed", "applied")


def _json_option(function: F) -> F:
    return json_option()(function)


def _say(message: str) -> None:
    click.echo(f"orchestrator: {message}", err=True)


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False))


def open_store(project_dir: Path) -> tuple[Project, ChangeStore]:
    """The project in ``project_dir`` and its change-set store."""
    from orchestrator.config import load_project
    from orchestrator.runtime.outbox import change_store

    project = load_project(project_dir)
    return project, change_store(project)


def _record(project: Project, operation: str, change: ChangeSet, **extra: Any) -> None:
    from orchestrator.runtime.host_folders import open_audit
    from orchestrator.staging import record_change

    with open_audit(project) as audit:
        record_change(audit, operation, change, **extra)


def _summary(change: ChangeSet) -> dict[str, Any]:
    return {
        "id": change.id,
        "status": change.status,
        "target": change.target.to_dict(),
        "worker": change.worker,
        "trust": change.trust,
        "run_id": change.run_id,
        "session_id": change.session_id,
        "created_at": change.created_at,
        "files": len(change.files),
        "bytes": sum(f.size for f in change.files),
        "rejected": len(change.rejected),
        "message": change.message,
    }


def _first_line(text: str, width: int) -> str:
    from orchestrator.staging import escape

    line = escape(text.strip().split("\n", 1)[0])
    return line if len(line) <= width else line[: width - 1] + "…"


@click.group()
def staged() -> None:
    """Review change sets: worker output held back until a person clears it."""


@staged.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only change sets with this status.")
@_json_option
@project_option
def list_changes(status: str | None, as_json: bool, project_dir: Path) -> None:
    """List change sets, oldest first."""
    _, store = open_store(project_dir)
    changes = store.list(status=status)
    if as_json:
        _emit([_summary(change) for change in changes])
        return
    if not changes:
        _say("no change sets" + (f" with status {status}" if status else ""))
        return
    click.echo(f"{'ID':<12}  {'STATUS':<9}  {'TARGET':<16}  {'WORKER':<16}  FILES  CREATED")
    for change in changes:
        count = f"{len(change.files)}" + (f"+{len(change.rejected)}r" if change.rejected else "")
        click.echo(
            f"{change.id:<12}  {change.status:<9}  {str(change.target)[:16]:<16}  "
            f"{change.worker[:16]:<16}  {count:<5}  {change.created_at[:19]}  "
            f"{_first_line(change.message, 40)}"
        )


def _describe(
    change: ChangeSet,
    scans: tuple[ScanResult, ...],
    conflicts: list[tuple[str, list[str]]],
    root: Path | None,
) -> list[str]:
    from orchestrator.staging import escape

    kinds = Counter(f.operation for f in change.files)
    operations = ", ".join(f"{n} {op}" for op, n in sorted(kinds.items())) or "none"
    lines = [
        f"change set  {change.id}  ({change.status})",
        f"target      {change.target}" + (f" -> {escape(str(root))}" if root else " (not found)"),
        f"worker      {escape(change.worker)} ("
        + ", ".join(
            f"{name} {value}"
            for name, value in (
                ("trust", change.trust),
                ("run", change.run_id),  # none for a batch's: its manifest names every run
                ("session", change.session_id),
            )
            if value
        )
        + ")",
        f"created     {change.created_at}",
        f"message     {_first_line(change.message, 200) or '(none)'}",
        f"files       {len(change.files)} ({operations}), "
        f"{sum(f.size for f in change.files)} bytes"
        + ("; the output was cut short: not everything was collected" if change.truncated else ""),
    ]
    lines += [f"history     {h.at}  {h.status}: {escape(h.reason)}" for h in change.history]
    lines.append(f"rejected    {len(change.rejected)} entries")
    # Rejections are stored already escaped: escape again, but leave their backslashes.
    lines += [
        f"  - {escape(r.path, keep=chr(92))}: {escape(r.reason, keep=chr(92))}"
        for r in change.rejected
    ]
    lines.append(
        "scans       " + "; ".join(f"{s.name} {'ok' if s.ok else 'FAILED'}" for s in scans)
    )
    for scan in scans:
        lines += [
            f"  ! {scan.name}: {escape(f.path) or '(all)'}: {escape(f.message)}"
            for f in scan.findings
        ]
    sensitive = sensitive_paths(scans)
    if sensitive:
        lines.append(
            ("clearing    needs " if change.target.kind == "repo" else "applying    needs ")
            + " ".join(f"--ack-sensitive {shlex.quote(escape(p))}" for p in sensitive)
        )
    lines.append(
        "conflicts   " + ("none" if not conflicts else f"{len(conflicts)} open change sets")
    )
    lines += [f"  - {other}: {', '.join(map(escape, paths))}" for other, paths in conflicts]
    return lines


def _blocked_deletes(project: Project, change: ChangeSet) -> list[str]:
    """The deletions ``staged apply`` would refuse (a zone whose approval blocks them)."""
    from orchestrator.cli.apply import deletes_allowed
    from orchestrator.config import load_worker
    from orchestrator.errors import OrchestratorError

    deletes = [f.path for f in change.files if f.operation == "delete"]
    zone = change.target.name
    if not deletes or change.target.kind != "zone" or zone is None:
        return []
    try:
        worker = load_worker(project, change.worker)
    except OrchestratorError:  # its file is gone or broken: apply would say so itself
        return []
    return [] if deletes_allowed(project, worker, zone) else deletes


@staged.command("show")
@click.argument("change_id")
@click.option("--no-color", is_flag=True, help="Never colour the diff.")
@_json_option
@project_option
def show(change_id: str, no_color: bool, as_json: bool, project_dir: Path) -> None:
    """Show CHANGE_ID: summary, rejected entries, scans, conflicts and the diff."""
    from orchestrator.staging import blocking, render_diff

    project, store = open_store(project_dir)
    change, scans = scanned_change(project, store, change_id)
    conflicts = store.conflicts(change.id)
    blocked = _blocked_deletes(project, change)
    root = target_root(project, change)
    color = not no_color and not as_json and sys.stdout.isatty()
    diff = render_diff(change, store, root, color=color)
    _record(project, "change.reviewed", change, metadata={"status": change.status})
    if as_json:
        data = change.to_dict()
        data["conflicts"] = [{"id": other, "paths": paths} for other, paths in conflicts]
        data["blocking"] = [result.name for result in blocking(scans)]
        data["sensitive"] = list(sensitive_paths(scans))
        data["deletes_blocked"] = blocked
        data["diff"] = diff
        _emit(data)
        return
    lines = _describe(change, scans, conflicts, root)
    if blocked:
        lines.append(
            f"deletes     {len(blocked)} file(s) in zone '{change.target.name}', whose approval "
            "blocks deletes: `staged apply` refuses this change set; reject it"
        )
    click.echo("\n".join(lines))
    if diff:
        click.echo("")
        click.echo(diff, nl=False, color=color)


@staged.command("discard")
@click.argument("change_id")
@project_option
def discard(change_id: str, project_dir: Path) -> None:
    """Discard CHANGE_ID: it will never be cleared (its files stay for inspection)."""
    project, store = open_store(project_dir)
    change = store.set_status(store.resolve(change_id), "discarded", reason="discarded by reviewer")
    _record(project, "change.discarded", change)
    _say(f"change set {change.id} discarded")


@staged.command("reject")
@click.argument("change_id")
@click.option("--reason", required=True, help="Why (kept in the change set and the audit log).")
@project_option
def reject(change_id: str, reason: str, project_dir: Path) -> None:
    """Reject CHANGE_ID with a reason: it will never be cleared."""
    project, store = open_store(project_dir)
    change = store.set_status(store.resolve(change_id), "rejected", reason=reason)
    _record(project, "change.rejected", change, reason=reason)
    _say(f"change set {change.id} rejected")
