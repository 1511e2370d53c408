"""One entry of a host folder a worker may have changed: open it, read its bits, name it.

Shared by the making of a run's host folders, the placing of per-run inputs, staging and the
host-side file API: all of them look at entries whose names can be swapped for links
between a listing and an open. What an entry is comes from one table, :data:`KINDS`, in
the words each kind of message uses.
"""

from __future__ import annotations

import os
import stat
from typing import Literal, NamedTuple

from orchestrator.hostfs.flags import DIR_FLAGS, FILE_FLAGS

__all__ = [
    "KINDS",
    "Kind",
    "KindWords",
    "kind_of",
    "kind_phrase",
    "lookup",
    "open_entry",
    "permits",
    "special_kind",
]

Kind = Literal["file", "folder", "symlink", "fifo", "socket", "device", "other"]
"""What an entry is, as the host-side file API reports it."""


class KindWords(NamedTuple):
    """One kind of entry and the words for it."""

    kind: Kind
    """For results (``stat``, ``list``): ``"fifo"``."""
    phrase: str
    """For a sentence about an input: ``"a FIFO"``."""
    name: str
    """The precise name, for a refusal in staging or a zone: ``"FIFO (named pipe)"``."""


#: Every file type, by ``stat.S_IFMT`` of its mode.
KINDS: dict[int, KindWords] = {
    stat.S_IFREG: KindWords("file", "a regular file", "regular file"),
    stat.S_IFDIR: KindWords("folder", "a folder", "folder"),
    stat.S_IFLNK: KindWords("symlink", "a symbolic link", "symbolic link"),
    stat.S_IFIFO: KindWords("fifo", "a FIFO", "FIFO (named pipe)"),
    stat.S_IFSOCK: KindWords("socket", "a socket", "socket"),
    stat.S_IFCHR: KindWords("device", "a device file", "character device"),
    stat.S_IFBLK: KindWords("device", "a device file", "block device"),
}
_UNKNOWN = KindWords("other", "a special file", "unknown file type")


def _words(mode: int) -> KindWords:
    return KINDS.get(stat.S_IFMT(mode), _UNKNOWN)


def kind_of(mode: int) -> Kind:
    """What the entry with ``mode`` is: ``"file"``, ``"folder"``, ``"symlink"``..."""
    return _words(mode).kind


def kind_phrase(mode: int) -> str:
    """What a special file is, for a message: "a FIFO", "a socket", "a device file"."""
    return _words(mode).phrase


def special_kind(mode: int) -> str | None:
    """What a non-regular, non-folder entry is ("FIFO (named pipe)", "character device"),
    or None for a regular file or a folder."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return _words(mode).name


def lookup(dir_fd: int, name: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in the folder, or None when nothing is there."""
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def open_entry(
    folder: int | None, name: str | os.PathLike[str], info: os.stat_result
) -> tuple[int, os.stat_result] | None:
    """Open a folder or regular file (``name`` in the folder descriptor ``folder``, or a
    path when ``folder`` is None) without following a link or waiting on a FIFO, and only
    if it is still what ``info`` (its ``lstat``) described: ``(descriptor, fstat)``, or
    None when it was swapped or is gone. The caller closes the descriptor."""
    flags = DIR_FLAGS if stat.S_ISDIR(info.st_mode) else FILE_FLAGS
    try:
        fd = os.open(name, flags, dir_fd=folder)
    except OSError:
        return None  # swapped for a link (ELOOP), or gone
    opened = os.fstat(fd)
    same = (opened.st_dev, opened.st_ino) == (info.st_dev, info.st_ino)
    if not same or stat.S_IFMT(opened.st_mode) != stat.S_IFMT(info.st_mode):
        os.close(fd)
        return None  # replaced between the listing and the open
    return fd, opened


def permits(info: os.stat_result, uid: int, gid: int, needed: str) -> bool:
    """Whether classic permission bits grant ``needed`` (r, w, x) to ``uid:gid``."""
    if info.st_uid == uid:
        shift = 6
    elif info.st_gid == gid:
        shift = 3
    else:
        shift = 0
    bits = {"r": 4, "w": 2, "x": 1}
    return all(info.st_mode >> shift & bits[flag] for flag in needed)
