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

from orchestrator.cli.options import project_option

if TYPE_CHECKING:
    from collections.abc import Callable

    from orchestrator.audit import AuditLog
    from orchestrator.clearance import ChangeStore, Credential, Scanners, Summary
    from orchestrator.config import Project

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
    help="Clear even though a scanner blocks the change set (recorded in the audit log).",
)
@project_option
def clear(
    change_id: str,
    branch: str | None,
    push: bool,
    yes: bool,
    override_scanners: bool,
    project_dir: Path,
) -> None:
    """Commit change set CHANGE_ID (an id or a unique prefix) into the project's repository.

    Only pending or approved change sets targeting the repository are cleared. Files are
    committed exactly as reviewed, with trailers naming the change set, worker, run and
    trust level; git runs without hooks or fsmonitor. Re-running after an interruption
    finishes the job; `clear ID --push` after a failed push only pushes.
    """
    from orchestrator.clearance import clear as clear_change
    from orchestrator.clearance.errors import ClearanceError
    from orchestrator.config import load_project
    from orchestrator.runtime.preparation import open_audit

    project = load_project(project_dir)
    settings = project.config.clearance
    if not yes and not _interactive():
        raise ClearanceError(
            f"change set {change_id}: there is no terminal to confirm on; "
            "pass --yes to clear without asking"
        )
    store, scanners = _staging(project)
    with open_audit(project) as audit:
        credential = _credential(project, audit) if push else None
        result = clear_change(
            store,
            _resolve_id(store, change_id),
            project.repo,
            branch=branch or settings.branch,
            push=push,
            remote=settings.remote,
            credential=credential,
            override_scanners=override_scanners,
            confirm=_confirm(ask=not yes),
            audit=audit,
            scanners=scanners,
            protected=[project.sandbox_root],
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


def _staging(project: Project) -> tuple[ChangeStore, Scanners]:
    """The project's change-set store and the scanners clearance runs (its outbox caps)."""
    from orchestrator.clearance.scan import StagingScanners
    from orchestrator.staging import ChangeStore, scanners_for

    store = ChangeStore(project.sandbox_root / "changes")
    return store, StagingScanners(scanners_for(limits=project.config.sandbox.outbox))


def _resolve_id(store: ChangeStore, text: str) -> str:
    """A full id, or the id a unique prefix names (when the store can tell)."""
    resolve = getattr(store, "resolve", None)
    if resolve is None:
        return text
    from orchestrator.clearance.errors import ClearanceError
    from orchestrator.errors import OrchestratorError

    try:
        return str(resolve(text))
    except OrchestratorError as exc:
        raise ClearanceError(str(exc), change_id=text) from None


def _credential(project: Project, audit: AuditLog) -> Credential | None:
    """The credential clearance.credential names, read now (only when pushing)."""
    from orchestrator.clearance import resolve
    from orchestrator.clearance.errors import CredentialError

    name = project.config.clearance.credential
    if name is None:
        return None
    config = project.config.credentials.get(name)
    if config is None:
        known = ", ".join(sorted(project.config.credentials)) or "none"
        raise CredentialError(
            f"{project.file}: clearance.credential names '{name}', which is not in "
            f"credentials (known: {known}); add it or fix the name"
        )
    return resolve(name, config, audit=audit, base=project.root)


def _confirm(*, ask: bool) -> Callable[[Summary], bool]:
    def confirm(summary: Summary) -> bool:
        click.echo(summary.render(), err=True)
        if not ask:
            return True
        return click.confirm("Clear this change set?", default=False, err=True)

    return confirm
