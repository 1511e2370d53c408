"""``orchestrator doctor``: check this machine, optionally fix the firewall, print a table.

Exit 0 when every check passed (warnings allowed), 1 when one failed, 125 when the doctor
itself cannot run (no engine), 128+N when stopped by signal N (after removing what the
self-test made). The table goes to stdout (a rich table on a terminal, plain lines
otherwise), progress to stderr; ``--json`` prints one JSON object instead of the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import json_option, project_option, signals_interrupt
from orchestrator.exits import signalled

if TYPE_CHECKING:
    from orchestrator.doctor import Report

_MARK = {"pass": "ok", "warn": "WARN", "fail": "FAIL"}


@click.command()
@click.option(
    "--fix",
    is_flag=True,
    help="Apply the host firewall rule that keeps allowlisted workers away from host "
    "services (root; idempotent), then check.",
)
@click.option(
    "--no-egress", "egress", is_flag=True, flag_value=False, default=True,
    help="Skip the egress self-test (its test servers and workers).",
)  # fmt: skip
@click.option(
    "--no-tools", "tools", is_flag=True, flag_value=False, default=True,
    help="Skip running everyday tools (ls, stat, cp, tar, git...) in one gVisor worker.",
)  # fmt: skip
@project_option
@json_option()
def doctor(fix: bool, egress: bool, tools: bool, project_dir: Path, as_json: bool) -> None:
    """Check the engine, the host and the network sandbox; exit 1 when a check fails."""
    from orchestrator.doctor import diagnose
    from orchestrator.runtime import Interrupted

    def progress(line: str) -> None:
        if not as_json:
            click.echo(f"orchestrator: {line}", err=True)

    try:
        with signals_interrupt():
            report = diagnose(project_dir, fix=fix, egress=egress, tools=tools, progress=progress)
    except Interrupted as exc:
        click.echo("orchestrator: doctor interrupted; what it started is removed", err=True)
        raise SystemExit(signalled(exc.signum)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict(), sort_keys=True))
    else:
        for command in report.fixed:
            click.echo(f"orchestrator: fixed: {command}", err=True)
        _print(report)
    raise SystemExit(report.exit_code)


def _print(report: Report) -> None:
    counts = report.to_dict()["counts"]
    summary = f"{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed"
    if not sys.stdout.isatty():
        width = max(len(check.name) for check in report.checks)
        for check in report.checks:
            click.echo(f"{_MARK[check.status]:<4}  {check.name:<{width}}  {check.detail}")
            if check.fix and check.status != "pass":
                click.echo(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
        click.echo(summary)
        return
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    styles = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for check in report.checks:
        detail = escape(check.detail)
        if check.fix and check.status != "pass":
            detail += f"\n[bold]fix:[/bold] {escape(check.fix)}"
        status = f"[{styles[check.status]}]{check.status}[/]"
        table.add_row(escape(check.name), status, detail)
    console = Console(highlight=False)
    console.print(table)
    console.print(summary, markup=False)
