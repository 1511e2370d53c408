"""Opening host files a worker may have planted, and reading their permission bits.

Shared by the preparation of zones and the placing of per-run inputs: both walk host
folders whose entries can be swapped for links between a listing and an open.
"""

from __future__ import annotations

import os
import stat

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


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
