"""The checks made before anything changes: stored content, the branch, the work tree.

Rules for the work tree (checked-out branch only), per path of the change set:

- not reported by ``git status`` (ignored files included): fine;
- reported, but the work tree holds exactly the change set's content (or nothing, for a
  delete) and the index holds either the branch's entry or the change set's: fine, and an
  interrupted clearance is being finished (``resume``);
- anything else is an uncommitted change of the user's, and clearance refuses.

Paths the change set does not touch may be as dirty as they like.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.clearance.errors import ClearanceError
from orchestrator.clearance.gitrepo import GitRepo, TreeEntry
from orchestrator.clearance.store import ChangeStore, FileChange
from orchestrator.errors import OrchestratorError
from orchestrator.staging.worktree import UnsafePath, WorkTree

__all__ = ["check_base", "check_work_tree", "entries", "one_line", "verify_blobs"]


def one_line(text: str) -> str:
    """The last few non-empty lines of ``text`` joined into one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines[-3:]) if lines else "no details"


def verify_blobs(repo: GitRepo, store: ChangeStore, change_id: str) -> None:
    """Refuse when the store finds a blob missing or not matching its sha256."""
    try:
        problems = store.verify_blobs(change_id)
    except (OrchestratorError, LookupError, OSError, ValueError) as exc:
        problems = [str(exc)]
    if problems is False or (isinstance(problems, list | tuple | set | frozenset) and problems):
        detail = problems if isinstance(problems, bool) else next(iter(problems))
        raise repo.error(
            f"its stored content does not match the manifest ({one_line(str(detail))}); "
            "it was changed after staging: reject it"
        )


def check_base(
    repo: GitRepo,
    branch: str,
    changes: list[FileChange],
    tree: dict[str, TreeEntry],
    *,
    contents: bool,
) -> None:
    """The branch must still look as it did when the change set was staged.

    With ``contents``, a file an update or delete was computed against must still hold
    that content on the branch (for the checked-out branch the work tree is compared
    instead, by :func:`check_work_tree`).
    """
    for change in changes:
        entry = tree.get(change.path)
        if entry is not None and entry.kind != "blob":
            raise repo.error(
                f"{change.path} is a {entry.kind} on branch {branch}; clearance only writes files"
            )
        if change.operation == "create" and entry is not None:
            raise repo.error(
                f"{change.path} already exists on branch {branch} (created since the change "
                "set was staged); stage it again"
            )
        if change.operation != "create" and entry is None:
            raise repo.error(
                f"{change.path} does not exist on branch {branch}, so it cannot be "
                f"{change.operation}d; stage the change set again"
            )
        base = change.base_sha256
        if contents and entry is not None and base and repo.blob_sha256(entry.oid) != base:
            raise _changed_since(repo, change.path, f"on branch {branch}")


def _changed_since(repo: GitRepo, path: str, where: str) -> ClearanceError:
    return repo.error(
        f"{path} changed {where} since the change set was staged, so applying it would undo "
        "that change; stage it again against the current content"
    )


def check_work_tree(
    repo: GitRepo,
    changes: list[FileChange],
    parts: dict[str, tuple[str, ...]],
    base_tree: dict[str, TreeEntry],
    targets: dict[str, TreeEntry | None],
) -> bool:
    """Apply the module's rules; True when some paths already hold the change set."""
    work_tree = WorkTree(repo.root)
    changed = repo.changed(list(parts))
    folders = [path for path in changed if path.endswith("/")]
    index = repo.index_entries(list(parts))
    resume = False
    for change in changes:
        try:
            entry = work_tree.entry(parts[change.path])
        except UnsafePath as exc:
            raise repo.error(f"{change.path}: {exc}; remove the link and run again") from None
        refused = ("dir", "other") if change.deletes else ("symlink", "dir", "other")
        if entry.kind in refused:
            raise repo.error(
                f"{change.path} is a {entry.kind} in the work tree, which clearance never "
                "replaces; move it away and run again"
            )
        stages = index.get(change.path, [])
        if any(stage.stage for stage in stages):
            raise repo.error(f"{change.path} has an unresolved merge conflict; resolve it first")
        code = changed.get(change.path)
        if code is None and entry.kind != "absent":
            code = next(("!!" for folder in folders if change.path.startswith(folder)), None)
        if code is None:
            base = change.base_sha256
            if base is not None and entry.kind == "file" and entry.sha256 != base:
                raise _changed_since(repo, change.path, "in the work tree")
            continue
        staged = stages[0] if stages else None
        index_ok = same(staged, base_tree.get(change.path)) or same(staged, targets[change.path])
        if index_ok and entry.holds(change.sha256, change.mode):
            resume = True
            continue
        raise repo.error(
            f"{change.path} has uncommitted changes (git status '{code.strip()}'); commit, "
            "stash or remove them first, or clear onto another branch with --branch NAME"
        )
    return resume


def same(a: TreeEntry | None, b: TreeEntry | None) -> bool:
    """Same mode and object (or both absent)."""
    if a is None or b is None:
        return a is b
    return (a.mode, a.oid) == (b.mode, b.oid)


def entries(
    repo: GitRepo, changes: list[FileChange], blobs: dict[str, Path], *, write: bool
) -> dict[str, TreeEntry | None]:
    """The entry each path gets: the reviewed bytes as a blob, or None (deleted)."""
    writes = [change for change in changes if not change.deletes]
    oids = repo.hash_blobs([blobs[change.path] for change in writes], write=write)
    by_path = dict(zip([change.path for change in writes], oids, strict=True))
    return {
        change.path: None
        if change.deletes
        else TreeEntry("100755" if (change.mode or 0) & 0o100 else "100644", by_path[change.path])
        for change in changes
    }
