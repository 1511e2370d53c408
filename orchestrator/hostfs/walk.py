"""Walking, as root, a folder a worker could write: nothing followed, at any depth.

Every entry is looked at with ``lstat`` relative to its folder's descriptor. Folders are
entered by opening the name with ``O_NOFOLLOW | O_DIRECTORY`` and checking that what was
opened is the folder that was looked at, so a name swapped for a symlink in between is
skipped, never followed; :meth:`Entry.open` does the same for a folder or regular file a
visitor wants to change. FIFOs, sockets and devices are never opened.

A hostile worker can build a tree far deeper than Python's recursion limit or the
process's descriptor limit. The walk is a loop that holds one folder descriptor at a time:
it goes down by opening a child from its parent, and back up by opening ``..`` of the child
and checking that it is the folder it came from. A folder moved meanwhile (only a second
container of the same uid, still running, could do that) stops the walk with
:class:`TreeChanged` instead of letting it wander. Each folder's names are listed once,
when it is entered.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.hostfs.flags import DIR_FLAGS, FILE_FLAGS
from orchestrator.hostfs.paths import open_path

__all__ = ["Entry", "TreeChanged", "walk"]

# Looking must not count as reading: no access-time updates (root may ask for that).
_NOATIME = getattr(os, "O_NOATIME", 0)


class TreeChanged(OSError):
    """A folder was moved while the walk was inside it; the walk stopped."""


@dataclass(frozen=True)
class Entry:
    """One entry of the tree, valid only during its visit."""

    folder: int
    """Descriptor of the folder holding the entry (for the tree's root, the root's own)."""
    name: str
    """Its name in ``folder`` (``.`` for the root)."""
    info: os.stat_result
    """Its ``lstat``."""
    path: str
    """Its path from the root (``""`` for the root), for records and messages."""

    @property
    def ident(self) -> tuple[int, int]:
        return self.info.st_dev, self.info.st_ino

    def open(self) -> int | None:
        """A descriptor for this folder or regular file, or None when it is something else
        or was swapped or removed since it was looked at. The caller closes it."""
        mode = self.info.st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            return None
        fd = _open(self.folder, self.name, DIR_FLAGS if stat.S_ISDIR(mode) else FILE_FLAGS)
        if fd is None:
            return None
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != self.ident:
            os.close(fd)
            return None
        return fd


def walk(root: Path, visit: Callable[[Entry], bool]) -> None:
    """Call ``visit`` on ``root`` and everything under it, folders before their content.

    ``visit`` returns whether to go into a folder (its result is ignored for anything
    else). No component of ``root`` may be a symlink (:class:`PathRefused`, an
    ``OSError``): a worker could have planted one on the way; a regular file is visited
    alone.
    """
    fd = open_path(root, file_ok=True)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        _visit_file(root, visit)
        return
    try:
        info = os.fstat(fd)
        if not visit(Entry(fd, ".", info, "")):
            return
        stack = [_Frame((info.st_dev, info.st_ino), "", _names(fd))]
        while stack:
            frame = stack[-1]
            if not frame.names:
                stack.pop()
                if stack:
                    up = _up(fd, stack[-1], root)
                    os.close(fd)
                    fd = up
                continue
            name = frame.names.pop()
            try:
                info = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            path = f"{frame.path}/{name}" if frame.path else name
            if not visit(Entry(fd, name, info, path)) or not stat.S_ISDIR(info.st_mode):
                continue
            child = _open(fd, name, DIR_FLAGS)
            if child is None:
                continue
            opened = os.fstat(child)
            ident = (opened.st_dev, opened.st_ino)
            if ident != (info.st_dev, info.st_ino):
                os.close(child)
                continue  # swapped since it was looked at
            try:
                names = _names(child)
            except OSError:
                os.close(child)
                continue
            os.close(fd)
            fd = child
            stack.append(_Frame(ident, path, names))
    finally:
        os.close(fd)


def _visit_file(root: Path, visit: Callable[[Entry], bool]) -> None:
    folder = open_path(root.parent)
    try:
        info = os.lstat(root.name, dir_fd=folder)
        if stat.S_ISLNK(info.st_mode):
            raise OSError(errno.ELOOP, "a symbolic link", str(root))
        visit(Entry(folder, root.name, info, ""))
    finally:
        os.close(folder)


@dataclass
class _Frame:
    ident: tuple[int, int]
    path: str
    names: list[str]


def _names(fd: int) -> list[str]:
    return os.listdir(fd)


def _open(folder: int, name: str, flags: int) -> int | None:
    """Open ``name`` in ``folder`` without following a link: None when that fails."""
    try:
        return os.open(name, flags | _NOATIME, dir_fd=folder)
    except PermissionError:  # O_NOATIME needs the file's owner or CAP_FOWNER
        try:
            return os.open(name, flags, dir_fd=folder)
        except OSError:
            return None
    except OSError:
        return None  # ELOOP (now a link), ENOENT, ENOTDIR: not what was looked at


def _up(fd: int, parent: _Frame, root: Path) -> int:
    """A descriptor for ``parent``, opened as ``..`` of the folder ``fd``, checked by
    identity."""
    try:
        up = os.open("..", DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise TreeChanged(
            exc.errno or errno.ENOENT, f"{root / parent.path} could not be reopened"
        ) from None
    info = os.fstat(up)
    if (info.st_dev, info.st_ino) != parent.ident:
        os.close(up)
        raise TreeChanged(
            errno.ESTALE, f"{root / parent.path} was moved while it was walked", str(root)
        )
    return up
