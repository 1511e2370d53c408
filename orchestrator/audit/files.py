"""Low-level file handling for the audit log: locks, snapshots, line readers, atomic rewrite.

Writers serialise on an exclusive :func:`fcntl.flock` of a lock file beside the log
(``audit.jsonl.lock``). Readers take the same lock shared, only for the moment it takes to
open the log and note its size; they then read up to that size, which appends never
change, so a reader never sees half of a line being written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from orchestrator.audit.entry import GENESIS_HASH, decode_line, is_anchor
from orchestrator.errors import AuditError

__all__ = [
    "atomic_rewrite",
    "audit_error",
    "chain_head",
    "ends_with_newline",
    "iter_chunks",
    "iter_chunks_reverse",
    "iter_lines",
    "iter_lines_reverse",
    "lock_path_for",
    "open_snapshot",
    "select_lines",
    "select_lines_reverse",
]

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_BLOCK = 1 << 20
_TAIL_BLOCK = 1 << 13
# Creating a folder where a file is fails with EEXIST; opening a path through one, ENOTDIR.
_NOT_DIR = (errno.ENOTDIR, errno.EEXIST)


def lock_path_for(path: Path) -> Path:
    """Return the lock file that serialises writers of the log at ``path``."""
    return path.with_name(path.name + ".lock")


def audit_error(path: Path, action: str, exc: OSError, what: str = "audit log") -> AuditError:
    """Turn ``exc``, raised while trying to ``action`` ``path``, into a one-line AuditError.

    The message reads ``cannot {action} {what} {path}: {what is wrong and the fix}``.
    """
    if exc.errno == errno.ELOOP:
        fix = (
            "it is a symbolic link (or one is on its path), which the orchestrator never "
            "follows; remove it and check what it pointed at"
        )
    elif isinstance(exc, IsADirectoryError) or exc.errno == errno.EISDIR:
        fix = "a directory is in its place; move it away so the log can be a file"
    elif isinstance(exc, NotADirectoryError | FileExistsError) or exc.errno in _NOT_DIR:
        fix = "a file is in place of one of its folders; move it away or change the sandbox root"
    elif isinstance(exc, PermissionError):
        fix = "permission denied; give this user read and write access to it and its folder"
    elif exc.errno == errno.ENOSPC:
        fix = "the disk is full; free space, or prune the log with `orchestrator audit prune`"
    elif exc.errno == errno.EROFS:
        fix = "the file system is read-only; move the sandbox root to a writable place"
    else:
        fix = f"{exc.strerror or exc}; check the disk and the folder's permissions"
    return AuditError(f"cannot {action} {what} {path}: {fix}")


def open_snapshot(path: Path) -> tuple[BinaryIO, int] | None:
    """Open the log for reading and note its size; None when there is no log yet.

    The size is taken under a shared lock so no append is half-way through it. When the
    lock file cannot be opened (a read-only folder), the size is taken without it.
    """
    lock_fd: int | None = None
    with contextlib.suppress(OSError):
        lock_fd = os.open(lock_path_for(path), _READ_FLAGS)
    try:
        if lock_fd is not None:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
        try:
            handle = os.fdopen(os.open(path, _READ_FLAGS), "rb")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise audit_error(path, "read", exc) from None
        return handle, os.fstat(handle.fileno()).st_size
    finally:
        if lock_fd is not None:
            os.close(lock_fd)  # closing releases the shared lock


def select_lines(
    chunk: bytes, needle: bytes | None, pattern: re.Pattern[bytes] | None = None
) -> Iterator[bytes]:
    """Yield the lines of ``chunk`` (newline-separated), or only those holding ``needle``.

    The needle (never holding a newline) is searched in the whole chunk at once, which
    is far quicker than testing line by line when few lines hold it. Instead of a
    needle, a compiled ``pattern`` may pick the lines: those where it starts a match.
    """
    if needle is None and pattern is None:
        yield from chunk.split(b"\n")
        return
    position = 0
    while (hit := _search(chunk, position, needle, pattern)) >= 0:
        start = chunk.rfind(b"\n", 0, hit) + 1
        stop = chunk.find(b"\n", hit)
        if stop < 0:
            stop = len(chunk)
        yield chunk[start:stop]
        position = stop + 1


def _search(
    chunk: bytes, position: int, needle: bytes | None, pattern: re.Pattern[bytes] | None
) -> int:
    if needle is not None:
        return chunk.find(needle, position)
    assert pattern is not None
    found = pattern.search(chunk, position)
    return -1 if found is None else found.start()


def select_lines_reverse(chunk: bytes, needle: bytes | None) -> Iterator[bytes]:
    """Like :func:`select_lines`, last line first."""
    if needle is None:
        yield from reversed(chunk.split(b"\n"))
        return
    position = len(chunk)
    while position > 0 and (hit := chunk.rfind(needle, 0, position)) >= 0:
        start = chunk.rfind(b"\n", 0, hit) + 1
        stop = chunk.find(b"\n", hit)
        yield chunk[start : len(chunk) if stop < 0 else stop]
        position = start - 1  # a needle never holds a newline, so none ends on it


def iter_chunks(handle: BinaryIO, end: int) -> Iterator[bytes]:
    """Yield the first ``end`` bytes of ``handle`` as chunks of whole lines, in order.

    A chunk is one or more lines joined by newlines, without the final newline; a last
    line with no newline is a chunk of its own. An empty file yields nothing.
    """
    handle.seek(0)
    remaining = end
    carry = b""
    while remaining > 0:
        block = handle.read(min(_BLOCK, remaining))
        if not block:
            break
        remaining -= len(block)
        data = carry + block if carry else block
        cut = data.rfind(b"\n")
        if cut < 0:
            carry = data
            continue
        carry = data[cut + 1 :]
        yield data[:cut]
    if carry:
        yield carry


def iter_chunks_reverse(fd: int, end: int, block: int = _BLOCK) -> Iterator[bytes]:
    """Like :func:`iter_chunks` for file descriptor ``fd``, last chunk first.

    Reads backwards in blocks with :func:`os.pread`, so taking the last few lines of a
    large file reads only its tail.
    """
    position = end
    carry = b""  # the end of a line that starts in an earlier block
    tail = True
    while position > 0:
        size = min(block, position)
        position -= size
        data = os.pread(fd, size, position) + carry
        if tail:
            tail = False
            if data.endswith(b"\n"):
                data = data[:-1]  # the file's last newline: no line follows it
        if position > 0:
            cut = data.find(b"\n")
            if cut < 0:
                carry = data
                continue
            carry, data = data[:cut], data[cut + 1 :]
        yield data


def iter_lines(handle: BinaryIO, end: int, needle: bytes | None = None) -> Iterator[bytes]:
    """Yield the lines of ``handle`` up to byte ``end``, without newlines, in order.

    With a ``needle`` only the lines holding it are yielded (see :func:`select_lines`).
    """
    for chunk in iter_chunks(handle, end):
        yield from select_lines(chunk, needle)


def iter_lines_reverse(
    fd: int, end: int, block: int = _BLOCK, needle: bytes | None = None
) -> Iterator[bytes]:
    """Yield the lines of ``fd`` before byte ``end``, last line first (see :func:`iter_lines`)."""
    for chunk in iter_chunks_reverse(fd, end, block):
        yield from select_lines_reverse(chunk, needle)


def ends_with_newline(fd: int, size: int) -> bool:
    """Tell whether the first ``size`` bytes of ``fd`` end with a newline (True if empty)."""
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def chain_head(fd: int, size: int) -> str:
    """Return the hash the next entry must chain from, reading only the log's tail.

    That is the hash of the last line that parses as an entry; damaged lines after it (a
    torn write) are skipped. A prune anchor that is the last entry passes on its ``prev``
    (see :mod:`orchestrator.audit.chain`). An empty log gives :data:`GENESIS_HASH`.
    """
    for raw in iter_lines_reverse(fd, size, _TAIL_BLOCK):
        try:
            record = decode_line(raw)
        except ValueError:
            continue
        return str(record["prev"]) if is_anchor(record) else str(record["hash"])
    return GENESIS_HASH


def fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries (a new or renamed file) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_rewrite(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Replace ``path`` with what ``write`` produces, atomically and durably.

    ``write`` fills a temporary file in the same folder; it is flushed, given the old
    file's permissions, renamed over ``path`` and the folder is flushed. On any failure
    the temporary file is removed and ``path`` is left as it was.
    """
    import tempfile  # only prunes need it; keeps start-up quick

    mode = 0o600
    with contextlib.suppress(FileNotFoundError):
        mode = os.stat(path).st_mode & 0o777
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    fsync_dir(path.parent)
