"""``orchestrator clear ID``: commit a reviewed change set into the project's git repository.

The command is meant to be attached to the main command with ``cli.add_command(clear)``.
It prints what it is about to do (files, sizes, modes, scanner results) on stderr and asks
before changing anything, unless ``--yes`` is given. Errors are
:class:`~orchestrator.errors.OrchestratorError`\\ s (a declined prompt exits with 1, any
other failure with 125), left for the main command to print as one line. Heavy imports
(the project loader, git) happen inside the command so that ``--help`` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import ack_sensitive_option, project_option

if TYPE_CHECKING:
    from collections.abc import Callable

    from orchestrator.clearance import Summary

__all__ = ["clear"]


def _say(message: str) -> None:
    click.echo(f"orchestrator: {message}", err=True)


@click.command("clear")
@click.argument("change_id")
@click.option(
    "--branch",
    help="Commit on this branch (created from HEAD when missing; the checked-out branch "
    "and the work tree are then left alone). Default: clearance.branch, else the "
    "checked-out branch.",
)
@click.option("--push", is_flag=True, help="Push the branch to clearance.remote afterwards.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--override-scanners",
    is_flag=True,
    help="Clear even though a scanner blocks the change set (recorded in the audit log); "
    "files that run code by themselves still need --ack-sensitive.",
)
@ack_sensitive_option
@project_option
def clear(
    change_id: str,
    branch: str | None,
    push: bool,
    yes: bool,
    override_scanners: bool,
    acknowledged: tuple[str, ...],
    project_dir: Path,
) -> None:
    """Commit change set CHANGE_ID (an id or a unique prefix) into the project's repository.

    Only pending or approved change sets targeting the repository are cleared. Files are
    committed exactly as reviewed, with trailers naming the change set, worker, run and
    trust level; git runs without hooks or fsmonitor. Re-running after an interruption
    finishes the job; `clear ID --push` after a failed push only pushes.
    """
    from orchestrator.clearance.errors import ClearanceError
    from orchestrator.runner import Orchestrator

    if not yes and not _interactive():
        raise ClearanceError(
            f"change set {change_id}: there is no terminal to confirm on; "
            "pass --yes to clear without asking"
        )
    with Orchestrator(project_dir) as orch:
        result = orch.clear(
            change_id,
            branch=branch,
            push=push,
            override_scanners=override_scanners,
            acknowledged=acknowledged,
            confirm=_confirm(ask=not yes),
        )
    if result.already and not result.pushed:
        where = f"as {result.commit}" if result.commit else "(its commit is not on a local branch)"
        _say(f"change set {result.change_id} was already committed {where}; nothing to do")
        return
    done = "pushed" if result.already else f"committed as {result.commit} on {result.branch}"
    if result.pushed and not result.already:
        done += f", pushed to '{result.remote}'"
    elif result.pushed:
        done = f"commit {result.commit} pushed to '{result.remote}'"
    _say(f"change set {result.change_id}: {done}")


def _interactive() -> bool:
    """True when a person can answer the confirmation prompt."""
    return sys.stdin.isatty()


def _confirm(*, ask: bool) -> Callable[[Summary], bool]:
    def confirm(summary: Summary) -> bool:
        click.echo(summary.render(), err=True)
        if not ask:
            return True
        return click.confirm("Clear this change set?", default=False, err=True)

    return confirm
