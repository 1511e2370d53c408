"""The steps of a clearance that more than one path through it shares: the run's state,
marking the change set, pushing, asking, and the summary shown before anything changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.clearance.checks import one_line
from orchestrator.clearance.errors import ClearanceDeclined, PushFailed
from orchestrator.clearance.events import Events
from orchestrator.clearance.gitrepo import GitFailure, GitRepo
from orchestrator.clearance.push import PushPlan, run_push
from orchestrator.clearance.scan import ScanOutcome
from orchestrator.clearance.store import ChangeSet, ChangeStore, FileChange, Scanners
from orchestrator.clearance.summary import Summary, SummaryFile, clean_message
from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.credentials import Credential

__all__ = ["STORE_ERRORS", "Run", "ask", "mark", "push", "summarise"]

#: What a store may raise when it cannot do what was asked.
STORE_ERRORS = (OrchestratorError, LookupError, OSError, ValueError)


@dataclass
class Run:
    """One call of :func:`clear`: its arguments and what was found on the way."""

    store: ChangeStore
    change_id: str
    repo: GitRepo
    events: Events
    push: bool
    remote: str
    credential: Credential | None
    override_scanners: bool
    confirm: Callable[[Summary], bool] | None
    scanners: Scanners | None
    protected: list[str]
    acknowledged: tuple[str, ...] = ()
    """Paths that run code by themselves, named by the person clearing."""
    branch: str = ""
    current: str | None = None


def mark(run: Run, status: str, commit: str, metadata: dict[str, object]) -> None:
    """Mark the change set committed (compare-and-set from ``status``) and audit it."""
    recovered = bool(metadata.get("recovered"))
    reason = f"commit {commit} on {run.branch}"
    if recovered:
        reason += " (found after an interrupted clearance)"
    try:
        run.store.set_status(run.change_id, "committed", reason=reason, expect=status)
    except STORE_ERRORS as exc:
        raise run.repo.error(
            f"committed as {commit[:12]} on {run.branch}, but the store could not be updated "
            f"({one_line(str(exc))}); run the command again to mark it"
        ) from None
    run.events.record(
        "clearance.committed",
        reason=reason,
        metadata={"commit": commit, "branch": run.branch, **metadata},
    )


def push(run: Run, plan: PushPlan, commit: str) -> None:
    """Push the branch; a failure keeps the commit and raises :class:`PushFailed`."""
    if run.credential is not None:
        run.events.record(
            "credential.used",
            reason=f"push to '{run.remote}'",
            metadata={
                "credential": run.credential.name,
                "mode": run.credential.mode,
                "remote": run.remote,
            },
        )
    try:
        report = run_push(run.repo, plan, run.branch)
    except GitFailure as exc:
        raise PushFailed(
            f"change set {run.change_id}: committed as {commit[:12]} on {run.branch}, but the "
            f"push to '{run.remote}' failed: {one_line(exc.detail)}; the commit is safe, "
            f"retry with `orchestrator clear {run.change_id} --push`",
            change_id=run.change_id,
            commit=commit,
            remote=run.remote,
        ) from None
    run.events.record(
        "clearance.pushed",
        reason=f"pushed {run.branch} to '{run.remote}'",
        metadata={
            "commit": commit,
            "branch": run.branch,
            "remote": run.remote,
            "report": one_line(report),
        },
    )


def ask(run: Run, summary: Summary) -> None:
    """Show ``summary`` through the confirm callback; a no raises ClearanceDeclined."""
    if run.confirm is not None and not run.confirm(summary):
        raise ClearanceDeclined(
            f"change set {run.change_id}: not confirmed; nothing was cleared or pushed",
            change_id=run.change_id,
        )


def summarise(
    run: Run,
    changeset: ChangeSet,
    changes: list[FileChange],
    outcome: ScanOutcome,
    *,
    new_branch: bool,
    resume: bool = False,
    commit: str | None = None,
) -> Summary:
    """What is about to happen, for the confirm callback."""
    return Summary(
        change_id=run.change_id,
        worker=str(changeset.worker),
        run_id=str(changeset.run_id or "-"),
        trust=str(getattr(changeset.trust, "value", changeset.trust)),
        message=clean_message(changeset.message, str(changeset.worker)),
        repo=run.repo.root,
        branch=run.branch,
        new_branch=new_branch,
        work_tree=run.branch == run.current,
        files=tuple(SummaryFile(c.path, c.operation, c.size, c.mode) for c in changes),
        scans=outcome.findings,
        blocking=outcome.blocking,
        passed=outcome.passed,
        override_scanners=run.override_scanners,
        push=run.push,
        remote=run.remote if run.push else None,
        credential=run.credential.name if run.credential is not None else None,
        resume=resume,
        commit=commit,
        acknowledged=outcome.sensitive,
    )
