"""The steps of a clearance that more than one path through it shares: the clearing's state,
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

__all__ = ["STORE_ERRORS", "Clearing", "ask", "mark", "push", "summarise"]

#: What a store may raise when it cannot do what was asked.
STORE_ERRORS = (OrchestratorError, LookupError, OSError, ValueError)


@dataclass
class Clearing:
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


def mark(clearing: Clearing, status: str, commit: str, metadata: dict[str, object]) -> None:
    """Mark the change set committed (compare-and-set from ``status``) and audit it."""
    recovered = bool(metadata.get("recovered"))
    reason = f"commit {commit} on {clearing.branch}"
    if recovered:
        reason += " (found after an interrupted clearance)"
    try:
        clearing.store.set_status(clearing.change_id, "committed", reason=reason, expect=status)
    except STORE_ERRORS as exc:
        raise clearing.repo.error(
            f"committed as {commit[:12]} on {clearing.branch}, but the store could not be updated "
            f"({one_line(str(exc))}); run the command again to mark it"
        ) from None
    clearing.events.record(
        "clearance.committed",
        reason=reason,
        metadata={"commit": commit, "branch": clearing.branch, **metadata},
    )


def push(clearing: Clearing, plan: PushPlan, commit: str) -> None:
    """Push the branch; a failure keeps the commit and raises :class:`PushFailed`."""
    if clearing.credential is not None:
        clearing.events.record(
            "credential.used",
            reason=f"push to '{clearing.remote}'",
            metadata={
                "credential": clearing.credential.name,
                "mode": clearing.credential.mode,
                "remote": clearing.remote,
            },
        )
    try:
        report = run_push(clearing.repo, plan, clearing.branch)
    except GitFailure as exc:
        raise PushFailed(
            f"change set {clearing.change_id}: committed as {commit[:12]} on {clearing.branch}, "
            f"but the push to '{clearing.remote}' failed: {one_line(exc.detail)}; the commit is "
            f"safe, retry with `orchestrator clear {clearing.change_id} --push`",
            change_id=clearing.change_id,
            commit=commit,
            remote=clearing.remote,
        ) from None
    clearing.events.record(
        "clearance.pushed",
        reason=f"pushed {clearing.branch} to '{clearing.remote}'",
        metadata={
            "commit": commit,
            "branch": clearing.branch,
            "remote": clearing.remote,
            "report": one_line(report),
        },
    )


def ask(clearing: Clearing, summary: Summary) -> None:
    """Show ``summary`` through the confirm callback; a no raises ClearanceDeclined."""
    if clearing.confirm is not None and not clearing.confirm(summary):
        raise ClearanceDeclined(
            f"change set {clearing.change_id}: not confirmed; nothing was cleared or pushed",
            change_id=clearing.change_id,
        )


def summarise(
    clearing: Clearing,
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
        change_id=clearing.change_id,
        worker=str(changeset.worker),
        run_id=str(changeset.run_id or "-"),
        trust=str(getattr(changeset.trust, "value", changeset.trust)),
        message=clean_message(changeset.message, str(changeset.worker)),
        repo=clearing.repo.root,
        branch=clearing.branch,
        new_branch=new_branch,
        work_tree=clearing.branch == clearing.current,
        files=tuple(SummaryFile(c.path, c.operation, c.size, c.mode) for c in changes),
        scans=outcome.findings,
        blocking=outcome.blocking,
        passed=outcome.passed,
        override_scanners=clearing.override_scanners,
        push=clearing.push,
        remote=clearing.remote if clearing.push else None,
        credential=clearing.credential.name if clearing.credential is not None else None,
        resume=resume,
        commit=commit,
        acknowledged=outcome.sensitive,
    )
