"""``orchestrator audit``: read, export, verify and prune the project's audit log.

The group is meant to be attached to the main command with ``main.add_command(audit)``.
Errors are :class:`~orchestrator.errors.OrchestratorError`\\ s, left for the main command
to turn into one line and exit code 125. Heavy imports (the project loader, rich) happen
inside the commands so that start-up stays fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from orchestrator.audit import (
    AuditEntry,
    AuditFilter,
    AuditLog,
    parse_duration,
    parse_time,
)
from orchestrator.cli.options import json_option
from orchestrator.errors import AuditError

__all__ = ["DEFAULT_LIMIT", "audit", "audit_log_path"]

#: How many of the most recent entries the listing shows unless ``--limit`` says otherwise.
DEFAULT_LIMIT = 100

#: The log's file name inside the project's sandbox root.
LOG_NAME = "audit.jsonl"

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:  # click < 8.2 has no generic ParamType at run time
    _TimeBase = click.ParamType[datetime]
    _DurationBase = click.ParamType[timedelta]
else:
    _TimeBase = _DurationBase = click.ParamType


class TimeType(_TimeBase):
    """A point in time: ISO 8601, or a duration meaning that long ago (``10m``, ``7d``)."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        """Return an aware UTC datetime."""
        if isinstance(value, datetime):
            return value
        try:
            return parse_time(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class DurationType(_DurationBase):
    """A length of time such as ``30s``, ``10m``, ``2h``, ``7d``, ``1w`` or ``1h30m``."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> timedelta:
        """Return a timedelta."""
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _project_option(function: F) -> F:
    return click.option(
        "--project",
        "project_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Project folder (holding orchestrator.yaml)  [default: .]",
    )(function)


def _json_option(function: F) -> F:
    return json_option("Print one JSON object a line.")(function)


def _filter_options(function: F) -> F:
    options = [
        click.option("--session", help="Only entries of this session id."),
        click.option("--run", help="Only entries of this run id."),
        click.option("--operation", help="Only this operation; 'run.*' matches a prefix."),
        click.option("--zone", help="Only entries about this zone."),
        click.option("--trust", help="Only entries with this trust level."),
        click.option("--denied", is_flag=True, help="Only denials."),
        click.option("--since", type=TimeType(), help="From this time: ISO 8601 or 2h (ago)."),
        click.option("--until", type=TimeType(), help="Before this time: ISO 8601 or 10m (ago)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def audit_log_path(project_dir: Path | None) -> Path:
    """Return the audit log of the project in ``project_dir`` (default: the current one)."""
    from orchestrator.config import load_project
    from orchestrator.runtime.state_root import checked_state_root

    return checked_state_root(load_project(project_dir or Path("."))) / LOG_NAME


def _open_log(ctx: click.Context, project_dir: Path | None) -> AuditLog:
    """Open the log of ``--project``, given here or to the ``audit`` group."""
    from orchestrator.config import load_project
    from orchestrator.runtime.host_folders import open_audit

    if project_dir is None and ctx.parent is not None:
        project_dir = ctx.parent.params.get("project_dir")
    return open_audit(load_project(project_dir or Path(".")))


def _make_filter(params: dict[str, Any], limit: int | None) -> AuditFilter:
    return AuditFilter(
        session=params.get("session"),
        run=params.get("run"),
        operation=params.get("operation"),
        zone=params.get("zone"),
        trust=params.get("trust"),
        denied_only=bool(params.get("denied")),
        since=params.get("since"),
        until=params.get("until"),
        limit=limit,
    )


def _print_entries(entries: Sequence[AuditEntry], as_json: bool, empty: str) -> None:
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry.to_dict(), ensure_ascii=False))
        return
    if not entries:
        click.echo(empty)
        return
    if not sys.stdout.isatty():
        _print_lines(entries)
        return
    from rich import box
    from rich.console import Console
    from rich.markup import escape as markup
    from rich.table import Table

    from orchestrator.cli.terminal import shown

    def escape(text: str) -> str:  # paths, hosts and reasons may be a worker's choice
        return markup(shown(text, sys.stdout))

    with_reason = any(entry.reason for entry in entries)
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    table.add_column("time (UTC)", no_wrap=True)
    table.add_column("operation", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("context", overflow="fold", ratio=3)
    if with_reason:
        table.add_column("reason", overflow="fold", ratio=2)
    for entry in entries:
        row = [
            entry.timestamp.strftime("%Y-%m-%d %H:%M:%S"),
            escape(entry.operation),
            "allowed" if entry.allowed else "DENIED",
            escape(_context(entry)),
        ]
        if with_reason:
            row.append(escape(entry.reason or ""))
        table.add_row(*row, style=None if entry.allowed else "red")
    Console(highlight=False).print(table)


def _print_lines(entries: Sequence[AuditEntry]) -> None:
    """Not to a terminal: one whole line per entry (no wrapping, so ids stay greppable),
    every field escaped, so no worker-chosen text can start a line of its own."""
    from orchestrator.escaping import escape

    for entry in entries:
        fields = [
            entry.timestamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
            escape(entry.operation),
            "allowed" if entry.allowed else "DENIED",
            escape(_context(entry)),
        ]
        if entry.reason:
            fields.append("reason=" + escape(entry.reason))
        click.echo("  ".join(fields))


#: What each operation is read for: the metadata the listing shows after the identifying
#: fields (``--json`` has all of it). A key ending in ``.`` is an operation prefix.
ESSENTIAL: dict[str, tuple[str, ...]] = {
    "session.exec": ("argv", "exit_code", "timed_out"),
    "session.stage": ("files", "change_id"),
    "egress.decision": ("method", "host", "port"),
    "egress.credential": ("event", "credential", "method", "host", "port", "path", "status"),
    "plan.compiled": ("image", "isolation", "network"),
    "run.started": ("image", "isolation", "network"),
    "run.ended": ("status", "exit_code", "duration_s"),
    "run.inputs": ("inputs",),
    "credential.used": ("credential", "use", "remote"),
    "tool.refused": ("tool", "status"),
    "tool.approval": ("tool", "decision", "by", "via"),
    "session.stopped": ("by", "via"),
    "gc.removed": ("kind", "name"),
    "zone.": ("old_mode", "new_mode", "when"),
    "broker.": ("child", "child_run"),
    "change.": ("change_id", "files", "written", "deleted", "status"),
    "clearance.": ("change_id", "commit", "branch", "remote"),
}


def _context(entry: AuditEntry) -> str:
    """The entry's identifying fields, then the metadata its operation is read for (the
    command run, the host asked for, the change set), as ``key=value`` pairs; unset ones
    are left out, lists and mappings written as JSON."""
    pairs: list[tuple[str, object]] = [
        ("worker", entry.worker),
        ("run", entry.run_id),
        ("session", entry.session_id),
        ("trust", entry.trust_level),
        ("zone", entry.zone),
        ("path", entry.path),
    ]
    keys = ESSENTIAL.get(entry.operation) or next(
        (
            keys
            for op, keys in ESSENTIAL.items()
            if op.endswith(".") and entry.operation.startswith(op)
        ),
        (),
    )
    pairs += [(key, entry.metadata.get(key)) for key in keys]
    return " ".join(f"{key}={_value(value)}" for key, value in pairs if value is not None)


def _value(value: object) -> str:
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


@click.group("audit", invoke_without_command=True)
@_filter_options
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Show the most recent N matching entries; 0 shows them all.",
)
@_json_option
@_project_option
@click.pass_context
def audit(
    ctx: click.Context, /, limit: int, as_json: bool, project_dir: Path | None, **_: Any
) -> None:
    """Show the audit log (most recent last), filtered by the options."""
    if ctx.invoked_subcommand is not None:
        return
    log = _open_log(ctx, project_dir)
    # One more than asked for tells whether older matches were left out.
    entries = log.query(_make_filter(ctx.params, limit + 1 if limit else None))
    if limit and len(entries) > limit:
        entries = entries[1:]
        click.echo(
            f"orchestrator: showing the {limit} most recent matches; --limit 0 shows all",
            err=True,
        )
    _print_entries(entries, as_json, f"no matching entries in {log.path}")


@audit.command("violations")
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="How many."
)
@_json_option
@_project_option
@click.pass_context
def violations(ctx: click.Context, limit: int, as_json: bool, project_dir: Path | None) -> None:
    """Show the most recent denials."""
    log = _open_log(ctx, project_dir)
    _print_entries(log.violations(limit), as_json, f"no denials in {log.path}")


@audit.command("export")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write to this file instead of stdout.",
)
@_filter_options
@click.option("--limit", type=click.IntRange(min=1), help="Only the most recent N entries.")
@_project_option
@click.pass_context
def export(
    ctx: click.Context,
    /,
    output: Path | None,
    limit: int | None,
    project_dir: Path | None,
    **_: Any,
) -> None:
    """Write the matching entries as one JSON array."""
    log = _open_log(ctx, project_dir)
    flt = _make_filter(ctx.params, limit)
    if output is None:
        log.export(flt, sys.stdout)
        return
    # Written beside the target and renamed into place: a failure leaves no partial file.
    temp = output.with_name(f".{output.name}.partial")
    try:
        with temp.open("w", encoding="utf-8") as out:
            count = log.export(flt, out)
        temp.replace(output)
    except OSError as exc:
        raise AuditError(
            f"cannot write the export to {output}: {exc.strerror or exc}; "
            "choose a writable file with --output"
        ) from None
    finally:
        temp.unlink(missing_ok=True)
    click.echo(f"orchestrator: exported {count} entries to {output}", err=True)


@audit.command("verify")
@_project_option
@click.pass_context
def verify(ctx: click.Context, project_dir: Path | None) -> None:
    """Check the hash chain; exit 1 and name the first bad line when it is broken."""
    log = _open_log(ctx, project_dir)
    result = log.verify()
    if result.ok:
        click.echo(f"{log.path}: {result.count} entries, chain intact")
        return
    click.echo(f"{log.path}: chain broken at line {result.line}: {result.reason}")
    for problem in result.problems[1:]:
        click.echo(f"  also {problem}")
    ctx.exit(1)


@audit.command("prune")
@click.option(
    "--older-than",
    "older_than",
    type=DurationType(),
    required=True,
    help="Drop entries older than this (e.g. 30d, 12h).",
)
@_project_option
@click.pass_context
def prune(ctx: click.Context, older_than: timedelta, project_dir: Path | None) -> None:
    """Drop old entries; the log starts with an anchor entry and stays verifiable."""
    log = _open_log(ctx, project_dir)
    result = log.prune(older_than)
    damaged = f", {result.damaged} damaged lines dropped" if result.damaged else ""
    click.echo(f"{log.path}: pruned {result.dropped} entries, kept {result.kept}{damaged}")
