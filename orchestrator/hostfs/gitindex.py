"""Which paths a git work tree tracks, read from its index file without running git.

The orchestrator refuses a sandbox root that a repository tracks (a checkout would plant
run state in it), and asks before anything of the project is read: so no git process
runs, no configuration of the repository is read, nothing in it can run. The index
(``.git/index``, versions 2 to 4, and the shared index of a split one) is read as bytes:
its entries' names, nothing else. Standard library only: it imports no git library (only
:mod:`orchestrator.clearance` does), so a run pays nothing for it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

from orchestrator.hostfs.files import read_limited
from orchestrator.hostfs.paths import PathRefused, open_beneath, open_path

__all__ = ["git_dir_of", "tracked_under"]

#: Largest index read (a repository of a million files has an index of about 100 MiB).
MAX_INDEX = 512 << 20
_HEADER = struct.Struct(">4sII")
_FIXED = 62  # ctime, mtime, dev, ino, mode, uid, gid, size (4 bytes each), oid (20), flags
_EXTENDED = 0x4000
_NAME_MASK = 0x0FFF


class IndexUnreadable(Exception):
    """The index is not one this reader understands (the message says why)."""


def git_dir_of(work_tree: Path) -> Path | None:
    """The git folder of ``work_tree`` (its ``.git`` folder, or where a ``.git`` file
    points), or None when it has none."""
    dot_git = work_tree / ".git"
    if dot_git.is_dir() and not dot_git.is_symlink():
        return dot_git
    if not dot_git.is_file():
        return None
    text = dot_git.read_text(encoding="utf-8", errors="replace")[:4096]
    if not text.startswith("gitdir:"):
        return None
    return (work_tree / text[len("gitdir:") :].strip()).resolve()


def tracked_under(git_dir: Path, folder: str) -> str | None:
    """The first path the index of ``git_dir`` tracks in ``folder`` (relative to the work
    tree, ``/``-separated), or None. Raises :class:`IndexUnreadable`."""
    prefix = folder.rstrip("/").encode("utf-8", "surrogateescape") + b"/"
    for name in _names(git_dir, "index"):
        if name.startswith(prefix):
            return name.decode("utf-8", "replace")
    return None


def _read(git_dir: Path, name: str) -> bytes | None:
    try:
        folder = open_path(git_dir)
    except PathRefused as refused:
        if refused.missing:
            return None
        raise IndexUnreadable(refused.reason) from None
    try:
        fd = open_beneath(folder, name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IndexUnreadable(f"{git_dir / name}: {exc.strerror}") from None
    finally:
        os.close(folder)
    try:
        return read_limited(fd, MAX_INDEX)
    finally:
        os.close(fd)


def _names(git_dir: Path, file: str) -> Iterator[bytes]:
    data = _read(git_dir, file)
    if data is None:
        return  # no index: nothing is tracked (a fresh `git init`)
    if len(data) < _HEADER.size + 20:
        raise IndexUnreadable(f"{git_dir / file} is too short to be a git index")
    signature, version, count = _HEADER.unpack_from(data)
    if signature != b"DIRC" or version not in (2, 3, 4):
        raise IndexUnreadable(f"{git_dir / file} is not a git index of version 2, 3 or 4")
    position, previous = _HEADER.size, b""
    try:
        for _ in range(count):
            start = position
            (flags,) = struct.unpack_from(">H", data, position + _FIXED - 2)
            position += _FIXED + (2 if version >= 3 and flags & _EXTENDED else 0)
            if version == 4:  # the name shares all but N bytes with the one before it
                strip, position = _varint(data, position)
                end = data.index(b"\0", position)
                name = previous[: len(previous) - strip] + data[position:end]
                position = end + 1
            else:
                end = data.index(b"\0", position)
                name = data[position:end]
                position = start + (end - start + 8) // 8 * 8  # NUL padded to 8 bytes
            previous = name
            yield name
        shared = _shared_index(data, position)
    except (struct.error, ValueError, IndexError):
        raise IndexUnreadable(f"{git_dir / file} is damaged") from None
    if shared is not None:
        yield from _names(git_dir, shared)


def _shared_index(data: bytes, position: int) -> str | None:
    """The shared index a split index names in its ``link`` extension, if any."""
    end = len(data) - 20  # the checksum
    while position + 8 <= end:
        signature, size = struct.unpack_from(">4sI", data, position)
        if signature == b"link":
            return "sharedindex." + data[position + 8 : position + 28].hex()
        position += 8 + size
    return None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """Git's offset varint (``varint.c``): the value and the position after it."""
    byte = data[position]
    value = byte & 0x7F
    position += 1
    while byte & 0x80:
        byte = data[position]
        position += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, position
