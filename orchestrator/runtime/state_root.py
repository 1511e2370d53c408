"""The sandbox root: state the orchestrator acts on (as root too), that nobody else writes.

The sandbox root (``.sandbox``, or ``sandbox.root``) holds the audit log, the access
records that lead root to ``chown``/``chmod`` when it puts files back, the change sets a
person clears into the repository, and every session. Whoever could write it could make
the orchestrator act for them. So, before anything is read from it,
:func:`open_state_root` opens it from ``/`` one component at a time without following a
link, making what is missing (the root itself mode 0700, with a ``.gitignore`` holding
``*`` so that git never stages it), and refuses, in one line naming the path and the fix:

- a folder on the way that someone else could replace the next one in: owned by another
  user than this one, root or the project folder's owner (who runs ``sudo orchestrator``
  in their own project), or writable by other users (its group, unless the group is this
  user's own, or everyone) without the sticky bit;
- a sandbox root that is not this user's, or that its group or others may write;
- a link directly in it or in a run's folder (the orchestrator makes none there);
- a sandbox root that a git repository tracks (a checkout's author chose what is in it);
- a sandbox root inside the repo below a folder a ``full`` worker may rename (the repo's
  top is a mount point in the container; the sandbox root itself is masked there).

The folders a worker writes (sessions, workspaces, run inputs) are inside and may hold its
links: the code that touches them never follows one (:mod:`orchestrator.hostfs`).

The check holds for the folder it opened, not for the name: whoever may write the folder
above (the project folder's owner, when root runs in a user's project) can rename the
checked root away and put a link or a folder of their own in its place. So the audit log,
the change store, the session control folder and a run's mount sources are reached
through the checked descriptor (:func:`open_state_root`, :func:`open_state_folder`),
never through the name again (code that takes paths gets ``/proc/<pid>/fd/<fd>``, which
names the opened folder itself). What is written into run, session, workspace and batch
folders is still reached by name (made and walked without following a link);
docs/security.md's trust inventory says what that leaves.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from orchestrator.config import Project
from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.flags import DIR_FLAGS
from orchestrator.hostfs.owners import others_may_write

__all__ = [
    "GITIGNORE",
    "StateRootRefused",
    "checked_state_root",
    "open_private",
    "open_state_folder",
    "open_state_root",
]

GITIGNORE = ".gitignore"
GITIGNORE_TEXT = b"# Made by the orchestrator: its state is never committed.\n*\n"
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Sandbox roots found untracked by git in this process (by device and inode).
_untracked: set[tuple[int, int]] = set()


class StateRootRefused(OrchestratorError):
    """The sandbox root (or another private folder) is not this user's alone."""


def checked_state_root(project: Project) -> Path:
    """The project's sandbox root, made and checked (see the module's docstring)."""
    os.close(open_state_root(project))
    return project.sandbox_root


def open_state_root(project: Project) -> int:
    """A descriptor of the project's checked sandbox root (the caller closes it)."""
    root = project.sandbox_root
    what = f"the sandbox root {root}"
    fix = "or set sandbox.root in orchestrator.yaml to a folder only you can write"
    _below_renamable(project)
    fd, created = open_private(root, what, fix, owners=(project.root.stat().st_uid,))
    try:
        _no_links(fd, root)
        _untracked_by_git(fd, root)
        if created or not _exists(fd, GITIGNORE):
            _write_gitignore(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_state_folder(project: Project, name: str) -> int:
    """A descriptor of the folder ``name`` directly in the checked sandbox root (made, mode
    0700, when missing), opened from the root's own descriptor without following a link;
    refused unless it is this user's and nobody else may write it."""
    root = open_state_root(project)
    where = project.sandbox_root / name
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=root)
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=root)
        except OSError as exc:
            raise _refusal(root, name, where, f"the state folder {where}", exc) from None
    finally:
        os.close(root)
    try:
        info = os.fstat(fd)
        fix = "or set sandbox.root in orchestrator.yaml to a folder only you can write"
        if info.st_uid != os.geteuid():
            raise _not_yours(where, info.st_uid, f"the state folder {where}", fix)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise StateRootRefused(
                f"the state folder {where} has mode {stat.S_IMODE(info.st_mode):04o}: other "
                f"users may write it. `chmod 700 {where}`"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(
    path: Path, what: str, fix: str, *, owners: tuple[int, ...] = ()
) -> tuple[int, bool]:
    """A descriptor of the folder ``path``, and whether it was made now: walked from
    ``/`` without following a link, each folder on the way checked so that nobody but
    this user, root and ``owners`` can replace what follows it, missing folders made (the
    last one 0700), and the folder itself this user's, written by nobody else. ``what``
    names it and ``fix`` ends the refusals."""
    euid = os.geteuid()
    trusted = {euid, 0, *owners}
    fd = os.open("/", DIR_FLAGS)
    here = Path("/")
    created = False
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    try:
        for index, name in enumerate(parts):
            _replaceable(fd, here, what, fix, trusted)
            last = index == len(parts) - 1
            here = here / name
            try:
                child, created = _open_or_make(fd, name, here, 0o700 if last else 0o755, what)
            except PermissionError:  # a folder of another user's, closed to this one
                raise _closed(fd, name, here, what, fix, last=last) from None
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if info.st_uid != euid:
            raise _not_yours(path, info.st_uid, what, fix)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise StateRootRefused(
                f"{what} has mode {stat.S_IMODE(info.st_mode):04o}: other users may write it. "
                f"`chmod 700 {path}`, {fix}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, created


def _closed(fd: int, name: str, here: Path, what: str, fix: str, *, last: bool) -> Exception:
    try:
        owner = os.lstat(name, dir_fd=fd).st_uid
    except OSError:
        return StateRootRefused(f"{what}: {here} cannot be made here (permission denied); {fix}")
    if last:
        return _not_yours(here, owner, what, fix)
    return StateRootRefused(f"{what}: {here} (uid {owner}'s) cannot be opened; {fix}")


def _not_yours(path: Path, uid: int, what: str, fix: str) -> StateRootRefused:
    return StateRootRefused(
        f"{what} belongs to uid {uid}, not to you (uid {os.geteuid()}): another user or a "
        f"checkout made it. Remove it (`rm -rf {path}`) so that the orchestrator makes its "
        f"own, {fix}"
    )


def _replaceable(fd: int, here: Path, what: str, fix: str, trusted: set[int]) -> None:
    """Refuse the folder ``fd`` (at ``here``) when another user could replace an entry in
    it: it is theirs, or they may write it and it has no sticky bit."""
    info = os.fstat(fd)
    if info.st_uid not in trusted:
        raise StateRootRefused(
            f"{what}: {here} belongs to uid {info.st_uid}, who could replace what is in it; "
            f"run the orchestrator as uid {info.st_uid}, {fix}"
        )
    if others_may_write(info) and not info.st_mode & stat.S_ISVTX:
        raise StateRootRefused(
            f"{what}: {here} has mode {stat.S_IMODE(info.st_mode):04o}, so other users could "
            f"replace what is in it; `chmod g-w,o-w {here}` (or `chmod +t`), {fix}"
        )


def _open_or_make(fd: int, name: str, here: Path, mode: int, what: str) -> tuple[int, bool]:
    made = False
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd), made
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=fd)
            made = True
    except PermissionError:
        raise
    except OSError as exc:
        raise _refusal(fd, name, here, what, exc) from None
    try:
        child = os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise _refusal(fd, name, here, what, exc) from None
    if made:
        os.fchmod(child, mode)  # the umask does not apply
    return child, made


def _refusal(fd: int, name: str, here: Path, what: str, exc: OSError) -> StateRootRefused:
    try:
        info = os.lstat(name, dir_fd=fd)
    except OSError:
        return StateRootRefused(f"{what}: {here} cannot be opened: {exc.strerror}")
    if stat.S_ISLNK(info.st_mode):
        return StateRootRefused(
            f"{what}: {here} is a symbolic link (to {_target(fd, name)}); the orchestrator "
            f"never follows one to its state. Remove it (`rm {here}`) and check what it "
            "pointed at"
        )
    return StateRootRefused(f"{what}: {here} is not a folder; move it away")


def _target(fd: int, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=fd)
    except OSError:
        return "?"


def _no_links(fd: int, root: Path) -> None:
    """Refuse a link directly in the root, in ``runs/`` or in a run's folder: the
    orchestrator makes none there, so a checkout or another user planted it."""
    _links_in(fd, root)
    try:
        runs = os.open("runs", DIR_FLAGS, dir_fd=fd)
    except OSError:
        return  # none yet (or not a folder: _links_in named it if it is a link)
    try:
        for name in _links_in(runs, root / "runs"):
            with contextlib.suppress(OSError):
                run = os.open(name, DIR_FLAGS, dir_fd=runs)
                try:
                    _links_in(run, root / "runs" / name)
                finally:
                    os.close(run)
    finally:
        os.close(runs)


def _links_in(fd: int, folder: Path) -> list[str]:
    """The folders in ``fd``; refuses the first link found there."""
    folders = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_symlink():
                where = folder / entry.name
                raise StateRootRefused(
                    f"{where} is a symbolic link (to {_target(fd, entry.name)}); the "
                    "orchestrator never makes one in its state, so a checkout or another user "
                    f"planted it. Remove it (`rm {where}`) and check what it pointed at"
                )
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.name)
    return folders


def _untracked_by_git(fd: int, root: Path) -> None:
    """Refuse a sandbox root that the git work tree around it tracks files in."""
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino) in _untracked:
        return
    tree = next((p for p in root.parents if os.path.lexists(p / ".git")), None)
    if tree is not None:
        from orchestrator.hostfs.gitindex import IndexUnreadable, git_dir_of, tracked_under

        relative = root.relative_to(tree).as_posix()
        git_dir = git_dir_of(tree)
        try:
            found = tracked_under(git_dir, relative) if git_dir is not None else None
        except IndexUnreadable as exc:
            raise StateRootRefused(
                f"the sandbox root {root}: cannot tell whether git tracks it ({exc}); "
                "repair the repository's index (`git status`), or set sandbox.root in "
                "orchestrator.yaml to a folder outside the work tree"
            ) from None
        if found is not None:
            raise StateRootRefused(
                f"the sandbox root {root} is tracked by git ({found}): a checkout chose its "
                f"state. `git -C {tree} rm -r --cached -q {relative}`, commit, and remove the "
                f"folder (`rm -rf {root}`) so that the orchestrator makes its own"
            )
    _untracked.add((info.st_dev, info.st_ino))


def _below_renamable(project: Project) -> None:
    """Refuse a sandbox root inside the repo below a folder a ``full`` worker may rename."""
    root, repo = project.sandbox_root, project.repo
    if root.is_relative_to(repo) and root.parent != repo and root != repo:
        first = repo / root.relative_to(repo).parts[0]
        raise StateRootRefused(
            f"the sandbox root {root} lies in the repo {repo} below {first}, which a worker "
            "at trust 'full' may rename and replace; set sandbox.root in orchestrator.yaml "
            "to a folder directly in the repo (such as .sandbox) or outside it"
        )


def _exists(fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return False
    return True


def _write_gitignore(fd: int) -> None:
    """``*`` in ``.gitignore``: git never stages the orchestrator's state."""
    with contextlib.suppress(FileExistsError):
        file = os.open(GITIGNORE, _FILE_FLAGS, 0o644, dir_fd=fd)
        try:
            os.write(file, GITIGNORE_TEXT)
        finally:
            os.close(file)
