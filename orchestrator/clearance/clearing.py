"""``clear``: bring one reviewed change set into the user's git repository, on the host.

The order of the steps is what makes a killed run recoverable (see docs/clearance.md)::

    checks (status, target, paths, blobs, scanners, branch, work tree)  nothing changed yet
    confirm
    write the commit object (private index; no ref points at it yet)     -> "commit-written"
    write the files into the work tree         (checked-out branch only) -> "applied"
    set the real index to the commit's entries (checked-out branch only) -> "index-updated"
    move the branch: update-ref NEW OLD (compare-and-swap)               -> "ref-updated"
    mark the change set committed (compare-and-set)                      -> "marked"
    push (optional)

On every start, a commit on any local branch whose last paragraph carries
``Staged-Id: <id>`` means an earlier run got past "ref-updated": the change set is marked
committed and nothing is applied again. Paths whose work tree and index already hold the
change set's content are not "uncommitted changes": an earlier run wrote them but did not
get past "ref-updated", and this run finishes the commit (see :mod:`.checks`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.audit.redact import TextRedactor
from orchestrator.clearance.checks import (
    check_base,
    check_work_tree,
    entries,
    one_line,
    verify_blobs,
)
from orchestrator.clearance.errors import ClearanceError, PushFailed
from orchestrator.clearance.events import Events
from orchestrator.clearance.gitrepo import GitFailure, GitRepo
from orchestrator.clearance.paths import check_paths
from orchestrator.clearance.push import plan_push
from orchestrator.clearance.scan import ScanOutcome, scan
from orchestrator.clearance.steps import Clearing, ask, mark, push, summarise
from orchestrator.clearance.store import (
    ChangeSet,
    ChangeStore,
    FileChange,
    Scanners,
    file_changes,
    status_of,
    target_of,
)
from orchestrator.clearance.summary import (
    ClearResult,
    Summary,
    commit_message,
    trailer_value,
)
from orchestrator.errors import CredentialError, OrchestratorError
from orchestrator.staging.scanners import acknowledgement_problem
from orchestrator.staging.worktree import UnsafePath, WorkTree, temp_name

if TYPE_CHECKING:
    from orchestrator.audit import AuditLog
    from orchestrator.credentials import Credential

__all__ = ["CHANGE_ID", "clear"]

CHANGE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CLEARABLE = ("pending", "approved")


def _checkpoint(stage: str) -> None:
    """Called after each durable step; the crash tests replace it to kill the process there."""


def clear(
    store: ChangeStore,
    change_id: str,
    repo: Path,
    *,
    branch: str | None = None,
    push: bool = False,
    remote: str = "origin",
    credential: Credential | None = None,
    override_scanners: bool = False,
    acknowledged: Iterable[str] = (),
    confirm: Callable[[Summary], bool] | None = None,
    audit: AuditLog | None = None,
    scanners: Scanners | None = None,
    protected: Iterable[Path] = (),
) -> ClearResult:
    """Commit change set ``change_id`` into the git work tree ``repo`` (and push it).

    ``branch`` defaults to the checked-out one; another branch is committed to without
    touching the work tree (created from HEAD when missing). ``confirm`` sees the
    :class:`Summary` before anything changes and may say no (:class:`ClearanceDeclined`).
    ``acknowledged`` names the paths that run code by themselves (the ``sensitive-paths``
    scanner's findings) that the person clearing has looked at: each one must be named,
    ``override_scanners`` does not cover them.
    ``scanners`` defaults to the staging package's. ``protected`` folders (the sandbox
    root; the store's root always) are never written. Raises :class:`ClearanceError`, or
    :class:`PushFailed` when the commit is made and marked but the push failed.
    """
    events = Events(audit, change_id, repo)
    redactor = TextRedactor()
    if credential is not None and credential.explicit:
        redactor.add(credential.reveal())
        if audit is not None:
            audit.add_secret(credential.reveal())
    try:
        if not CHANGE_ID.match(change_id):
            raise ClearanceError(f"{change_id!r} is not a change-set id", change_id=change_id)
        changeset = _load(store, change_id)
        events.bind(changeset)
        git_repo = _open(repo, change_id, redactor)
        try:
            clearing = Clearing(
                store=store,
                change_id=change_id,
                repo=git_repo,
                events=events,
                push=push,
                remote=remote,
                credential=credential,
                override_scanners=override_scanners,
                confirm=confirm,
                acknowledged=tuple(acknowledged),
                scanners=scanners,
                protected=_inside(git_repo.root, [store.root, *protected]),
            )
            return _clear(clearing, changeset, branch)
        except GitFailure as exc:
            raise git_repo.error(f"git {exc.command} failed: {one_line(exc.detail)}") from None
        finally:
            git_repo.close()
    except PushFailed as exc:
        events.record(
            "clearance.push_failed", allowed=False, reason=str(exc), metadata={"remote": remote}
        )
        raise
    except (ClearanceError, CredentialError) as exc:
        events.record("clearance.refused", allowed=False, reason=str(exc))
        raise


def _clear(clearing: Clearing, changeset: ChangeSet, branch: str | None) -> ClearResult:
    repo = clearing.repo
    status = status_of(changeset)
    kind, zone = target_of(changeset)
    if kind != "repo":
        raise repo.error(
            f"it targets zone '{zone}', not the repository; zone change sets are applied by "
            "staging, never cleared into git"
        )
    if status not in (*CLEARABLE, "committed"):
        raise repo.error(f"it is {status}; only pending or approved change sets are cleared")
    problems = repo.config_problems()
    if problems:
        raise repo.error(problems[0])
    clearing.current = repo.current_branch()
    target = branch or clearing.current
    if target is None:
        raise repo.error("HEAD is detached; check out a branch or name one with --branch NAME")
    if not repo.valid_branch(target):
        raise repo.error(f"'{target}' is not a valid branch name; pick another --branch")
    clearing.branch = target
    found = repo.find_trailer(clearing.change_id)
    if status == "committed" or found is not None:
        return _already_committed(clearing, changeset, status, found)
    return _apply_and_commit(clearing, changeset, status)


def _already_committed(
    clearing: Clearing, changeset: ChangeSet, status: str, found: str | None
) -> ClearResult:
    """A commit with the trailer exists (or the store says committed): never apply again."""
    repo, count = clearing.repo, len(changeset.files)
    if found is None:
        if clearing.push:
            raise repo.error(
                "it is marked committed, but no local branch holds a commit with its "
                "Staged-Id trailer; there is nothing to push"
            )
        return ClearResult(clearing.change_id, None, clearing.branch, count, already=True)
    if status != "committed":
        mark(clearing, status, found, {"recovered": True})
    if not clearing.push:
        return ClearResult(clearing.change_id, found, clearing.branch, count, already=True)
    tip = repo.commit_of(f"refs/heads/{clearing.branch}")
    ancestor = tip is not None and (
        repo.run_full("merge-base", "--is-ancestor", found, tip, ok=(0, 1))[0] == 0
    )
    if not ancestor:
        raise repo.error(
            f"its commit {found[:12]} is not on branch {clearing.branch}; name the branch holding "
            "it with --branch NAME"
        )
    plan = plan_push(repo, clearing.remote, clearing.credential)
    ask(
        clearing,
        summarise(clearing, changeset, [], ScanOutcome((), ()), new_branch=False, commit=found),
    )
    push(clearing, plan, found)
    return ClearResult(
        clearing.change_id, found, clearing.branch, count, True, clearing.remote, already=True
    )


def _apply_and_commit(clearing: Clearing, changeset: ChangeSet, status: str) -> ClearResult:
    repo, change_id = clearing.repo, clearing.change_id
    try:
        changes = file_changes(changeset)
        trailers = {"Worker": trailer_value("worker", changeset.worker)}
        if changeset.run_id is not None:
            trailers["Run"] = trailer_value("run", changeset.run_id)
        trailers["Trust"] = trailer_value("trust", changeset.trust)
    except ValueError as exc:
        raise repo.error(f"the manifest is unusable: {exc}; stage the change set again") from None
    if not changes:
        raise repo.error("it lists no files; there is nothing to commit")
    parts = check_paths(change_id, changes, clearing.protected)
    verify_blobs(repo, clearing.store, change_id)
    outcome = scan(clearing.scanners, changeset, clearing.store)
    _check_acknowledged(clearing, outcome.sensitive)
    if outcome.blocking and not clearing.override_scanners:
        more = len(outcome.blocking) - 1
        raise repo.error(
            f"scanners block it: {outcome.blocking[0]}{f' (and {more} more)' if more else ''}; "
            "review the findings, then reject it or pass --override-scanners"
        )
    others = repo.branches_in_other_worktrees()
    if clearing.branch in others:
        raise repo.error(
            f"branch {clearing.branch} is checked out in another work tree "
            f"({others[clearing.branch]}); clear onto another --branch"
        )
    checked_out = clearing.branch == clearing.current
    old = repo.commit_of(f"refs/heads/{clearing.branch}")
    base = old if old is not None or checked_out else repo.commit_of("HEAD")
    if old is None and not checked_out and base is None:
        raise repo.error("the repository has no commit to start a new branch from")
    base_tree = repo.tree_entries(base, [change.path for change in changes])
    check_base(repo, clearing.branch, changes, base_tree, contents=not checked_out)
    blobs = {c.path: clearing.store.blob_path(change_id, c.sha256) for c in changes if c.sha256}
    targets = entries(repo, changes, blobs, write=False)
    resume = checked_out and check_work_tree(repo, changes, parts, base_tree, targets)
    plan = plan_push(repo, clearing.remote, clearing.credential) if clearing.push else None
    ask(
        clearing,
        summarise(clearing, changeset, changes, outcome, new_branch=old is None, resume=resume),
    )
    if checked_out:  # the prompt may have waited a long time: look again before writing
        check_work_tree(repo, changes, parts, base_tree, targets)
    if outcome.sensitive:
        clearing.events.record(
            "clearance.acknowledged",
            reason="files that run code by themselves acknowledged by name",
            metadata={"paths": list(outcome.sensitive)},
        )
    if outcome.blocking:
        clearing.events.record(
            "clearance.override",
            reason="blocking scanner findings overridden",
            metadata={"findings": list(outcome.blocking)},
        )
    written = entries(repo, changes, blobs, write=True)
    message = commit_message(change_id, changeset.message, trailers)
    try:
        commit = repo.commit_tree(base, written, message)
    except GitFailure as exc:
        raise repo.error(
            f"git could not write the commit: {one_line(exc.detail)}; fix that (a missing "
            "identity: git config user.name and user.email) and run the command again"
        ) from None
    if base is not None:
        # Setting a/b when a is a file, a link or a submodule makes git drop a: refuse any
        # commit that changes more than the change set says, before anything is written.
        unexpected = sorted(repo.changed_paths(base, commit) - set(written))
        if unexpected:
            raise repo.error(
                f"clearing would also remove or replace {', '.join(unexpected[:5])} (a file, "
                "link or submodule stands where the change set needs a folder); nothing was "
                "written"
            )
    _checkpoint("commit-written")
    if checked_out:
        _apply(clearing, changes, parts, blobs)
        _checkpoint("applied")
        repo.update_index(written)
        _checkpoint("index-updated")
    current = clearing.store.get(change_id).status
    if current != status:  # rejected or discarded by someone else while this ran
        raise repo.error(
            f"change set {change_id} became {current} while clearing; the branch was not "
            "moved (files already written to the work tree are the change set's: `git "
            "checkout -- <paths>` undoes them)"
        )
    try:
        repo.update_ref(clearing.branch, commit, old, f"clearance: change set {change_id}")
    except GitFailure as exc:
        raise repo.error(
            f"branch {clearing.branch} moved while clearing ({one_line(exc.detail)}); "
            "run the command again"
        ) from None
    _checkpoint("ref-updated")
    mark(clearing, status, commit, {"files": len(changes), "new_branch": old is None})
    _checkpoint("marked")
    if checked_out:
        tree = WorkTree(repo.root)
        for change in changes:
            tree.remove_temp(parts[change.path], temp_name(change_id, change.path))
    if plan is not None:
        push(clearing, plan, commit)
    remote = clearing.remote if plan is not None else None
    return ClearResult(
        change_id, commit, clearing.branch, len(changes), plan is not None, remote, resumed=resume
    )


def _check_acknowledged(clearing: Clearing, sensitive: tuple[str, ...]) -> None:
    """Every path that runs code by itself must be acknowledged by name, and only those."""
    problem = acknowledgement_problem(clearing.change_id, sensitive, clearing.acknowledged)
    if problem is not None:
        raise clearing.repo.error(problem)


def _open(repo: Path, change_id: str, redactor: TextRedactor) -> GitRepo:
    try:
        return GitRepo(repo, change_id=change_id, redactor=redactor)
    except GitFailure as exc:
        raise ClearanceError(
            f"change set {change_id}: {repo} cannot be used: git {exc.command} failed: "
            f"{one_line(exc.detail)}",
            change_id=change_id,
        ) from None


def _load(store: ChangeStore, change_id: str) -> ChangeSet:
    try:
        return store.get(change_id)
    except ClearanceError:
        raise
    except OrchestratorError as exc:  # the store's own message names the id and the fix
        raise ClearanceError(one_line(str(exc)), change_id=change_id) from None
    except (LookupError, OSError, ValueError) as exc:
        raise ClearanceError(
            f"change set {change_id}: cannot be read from {store.root}: {one_line(str(exc))}",
            change_id=change_id,
        ) from None


def _apply(
    clearing: Clearing,
    changes: list[FileChange],
    parts: dict[str, tuple[str, ...]],
    blobs: dict[str, Path],
) -> None:
    work_tree = WorkTree(clearing.repo.root)
    for change in changes:
        where = parts[change.path]
        try:
            if change.sha256 is None or change.mode is None:
                work_tree.delete(where)
            else:
                tmp = temp_name(clearing.change_id, change.path)
                work_tree.write(where, blobs[change.path], change.sha256, change.mode, tmp)
        except (UnsafePath, OSError) as exc:
            raise clearing.repo.error(
                f"{change.path} could not be written: {exc}; the files written so far hold "
                "this change set's content, so fix the cause and run the command again"
            ) from None


def _inside(root: Path, folders: Iterable[Path]) -> list[str]:
    """The folders that lie inside ``root``, relative to it."""
    found = []
    for folder in folders:
        real = Path(os.path.realpath(folder))
        if root in real.parents:
            found.append(real.relative_to(root).as_posix())
    return found
