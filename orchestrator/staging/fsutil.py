"""File-system helpers that never follow a link: opening beneath a folder, atomic writes.

Everything here opens one path component at a time relative to an already opened folder,
with ``O_NOFOLLOW``, and checks what it opened with ``fstat``: a component swapped for a
symlink, FIFO or device between a check and an open is caught, and a FIFO is never waited
on (``O_NONBLOCK``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from orchestrator.audit.files import fsync_dir

__all__ = [
    "DIR_FLAGS",
    "FILE_FLAGS",
    "fsync_dir",
    "locked",
    "open_beneath",
    "read_limited",
    "special_kind",
    "write_durably",
]

#: Opening a folder or a file component: never through a link, never blocking.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def special_kind(mode: int) -> str | None:
    """What a non-regular, non-folder entry is, or None for a regular file or a folder."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    return "unknown file type"


def open_beneath(root_fd: int, path: str, *, folder: bool = False) -> int:
    """Open ``path`` (``a/b/c``) under ``root_fd`` without following any link.

    Raises ``OSError``: ``ELOOP`` when a component is a symlink, ``ENOTDIR`` when a
    parent is not a folder, ``EINVAL`` when the final entry is not a regular file (or a
    folder, with ``folder=True``), ``ENOENT`` when something is missing.
    """
    parts = path.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        if not folder:  # never open a device or FIFO, even without blocking
            kind = special_kind(os.lstat(parts[-1], dir_fd=fd).st_mode)
            if kind is not None:
                code = errno.ELOOP if kind == "symbolic link" else errno.EINVAL
                raise OSError(code, f"a {kind}", path)
        final = os.open(parts[-1], DIR_FLAGS if folder else FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    mode = os.fstat(final).st_mode
    if not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        os.close(final)
        raise OSError(errno.EINVAL, f"not a {'folder' if folder else 'regular file'}", path)
    return final


def read_limited(fd: int, limit: int) -> bytes:
    """Read at most ``limit`` bytes from the start of ``fd``."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        data = os.pread(fd, min(1 << 20, limit - size), size)
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


def write_durably(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Create ``path`` (it must not exist), write ``data`` and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if needed)."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
