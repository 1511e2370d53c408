"""The orchestrator's own files beside folders a worker can write: reads capped, writes
durable, locks, none of them through a link."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["locked", "read_limited", "write_durably"]


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
