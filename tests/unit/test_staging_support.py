"""Helpers for the staging tests: hostile tar headers built by hand, tree snapshots.

tarfile refuses to write some of what a hostile container can send (huge sizes with short
bodies, raw non-UTF-8 bytes, NUL in pax paths), so headers are assembled byte by byte.
This module holds no tests of its own.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Literal

from orchestrator.config.models import OutboxLimits

BLOCK = 512
END = b"\0" * (2 * BLOCK)
LIMITS = OutboxLimits(size=1 << 20, max_files=100, max_file_size=64 << 10)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def header(
    name: bytes,
    *,
    size: int = 0,
    kind: bytes = b"0",
    linkname: bytes = b"",
    mode: int = 0o644,
) -> bytes:
    """One ustar header with any bytes as name and any size (base-256 when huge)."""
    buf = bytearray(BLOCK)
    buf[0 : len(name[:100])] = name[:100]
    buf[100:108] = b"%07o\0" % mode
    buf[108:116] = b"%07o\0" % 0
    buf[116:124] = b"%07o\0" % 0
    if size < 8**11:
        buf[124:136] = b"%011o\0" % size
    else:
        buf[124:136] = b"\x80" + size.to_bytes(11, "big")
    buf[136:148] = b"%011o\0" % 0
    buf[148:156] = b" " * 8
    buf[156:157] = kind
    buf[157 : 157 + len(linkname[:100])] = linkname[:100]
    buf[257:263] = b"ustar\0"
    buf[263:265] = b"00"
    buf[148:156] = b"%06o\0 " % sum(buf)
    return bytes(buf)


def member(name: bytes, data: bytes = b"", **options: object) -> bytes:
    """A header plus its padded content."""
    return header(name, size=len(data), **options) + pad(data)  # type: ignore[arg-type]


def pax(records: dict[bytes, bytes]) -> bytes:
    """A pax extended header applying ``records`` to the next member."""
    body = b""
    for key, value in records.items():
        record = b" " + key + b"=" + value + b"\n"
        length = len(record) + 1
        while len(str(length).encode()) + len(record) != length:
            length += 1
        body += str(length).encode() + record
    return header(b"./PaxHeaders/x", size=len(body), kind=b"x") + pad(body)


def gnu_longname(name: bytes) -> bytes:
    data = name + b"\0"
    return header(b"././@LongLink", size=len(data), kind=b"L") + pad(data)


def tarfile_member(name: str, data: bytes, *, fmt: Literal[0, 1, 2] = tarfile.GNU_FORMAT) -> bytes:
    """One member as tarfile writes it (a surrogate-escaped name gives raw bytes)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(fmt, "utf-8", "surrogateescape") + pad(data)


def tar_of(entries: list[tuple[str, bytes]], *, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A well-formed archive of regular files (names may hold surrogate escapes)."""
    out = io.BytesIO()
    with tarfile.open(
        fileobj=out, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def snapshot(root: Path, *, skip: Path | None = None) -> dict[str, tuple[int, int, int, str]]:
    """Every entry under ``root`` (not followed, ``skip`` left out): type, size, mtime, hash."""
    found: dict[str, tuple[int, int, int, str]] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        if skip is not None and Path(folder) == skip:
            dirs[:] = []
            continue
        for name in dirs + files:
            path = Path(folder) / name
            if skip is not None and path == skip:
                continue
            st = os.lstat(path)
            digest = ""
            if stat.S_ISREG(st.st_mode):
                digest = sha(path.read_bytes())
            # A folder's mtime moves when the blob folder is made in it: not a write.
            mtime = 0 if stat.S_ISDIR(st.st_mode) else st.st_mtime_ns
            found[str(path)] = (stat.S_IFMT(st.st_mode), st.st_size, mtime, digest)
    return found


def blob_names(folder: Path) -> set[str]:
    return {entry.name for entry in os.scandir(folder)}


def every_byte_under(root: Path) -> bytes:
    """All file content under ``root`` (links not followed), to look for leaked secrets."""
    chunks = []
    for folder, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = Path(folder) / name
            if stat.S_ISREG(os.lstat(path).st_mode):
                chunks.append(path.read_bytes())
            chunks.append(name.encode("utf-8", "surrogateescape"))
    return b"\n".join(chunks)


#: A sparse file of 10 GiB apparent size with one byte written at its end.
SPARSE_APPARENT = (10 << 30) + 1


def number(value: int) -> bytes:
    """A 12-byte numeric header field: octal, or base-256 when too large (as GNU tar)."""
    return b"%011o\0" % value if value < 8**11 else b"\x80" + value.to_bytes(11, "big")


def gnu_sparse(name: bytes, data: bytes = b"x", *, apparent: int = SPARSE_APPARENT,
               chain: int = 0) -> bytes:  # fmt: skip
    """An old GNU sparse member as GNU tar's ``--sparse`` writes it: ``data`` at the end.

    ``chain`` extension blocks of (empty) map entries follow the header, as for a file
    with many holes.
    """
    buf = bytearray(header(name, size=len(data), kind=b"S"))
    buf[257:265] = b"ustar  \0"
    buf[386:398] = number(apparent - len(data))  # the map: (offset, numbytes) pairs
    buf[398:410] = number(len(data))
    buf[410:422] = number(apparent)
    buf[422:434] = number(0)
    buf[482] = 1 if chain else 0
    buf[483:495] = number(apparent)
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % sum(buf)
    more = b"\0" * 504 + b"\1" + b"\0" * 7
    last = b"\0" * BLOCK
    blocks = more * (chain - 1) + last if chain else b""
    return bytes(buf) + blocks + pad(data)


def pax_sparse(name: bytes, data: bytes = b"x", *, version: str = "1.0") -> bytes:
    """A GNU pax sparse member (format 0.1 or 1.0) of apparent size SPARSE_APPARENT."""
    where = b"%d" % (SPARSE_APPARENT - len(data))
    if version == "0.1":
        records = {
            b"GNU.sparse.size": b"%d" % SPARSE_APPARENT,
            b"GNU.sparse.numblocks": b"1",
            b"GNU.sparse.map": where + b",%d" % len(data),
            b"GNU.sparse.name": name,
        }
        return pax(records) + member(b"./GNUSparseFile.0/" + name, data)
    records = {
        b"GNU.sparse.major": b"1",
        b"GNU.sparse.minor": b"0",
        b"GNU.sparse.name": name,
        b"GNU.sparse.realsize": b"%d" % SPARSE_APPARENT,
    }
    stored = pad(b"1\n" + where + b"\n%d\n" % len(data)) + data
    return pax(records) + member(b"./GNUSparseFile.0/" + name, stored)
