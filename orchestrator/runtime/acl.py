"""POSIX access control lists, read and written as the kernel stores them (no ``setfacl``).

A file's ACL is the extended attribute ``system.posix_acl_access``: a little-endian header
(version 2) and entries of (tag u16, permissions u16, id u32), ordered by tag and then id:
the owner (``USER_OBJ``), named users, the owning group (``GROUP_OBJ``), named groups, the
mask, others. A file without the attribute has the "minimal" ACL its mode bits spell. When
an ACL has named entries, the mode's group bits show the mask, which caps every named entry
and the owning group; the owning group's own permissions stay in ``GROUP_OBJ``.

Only what giving one uid access for one run needs is here: reading and writing the
attribute on an open descriptor, deciding whether a uid already has some access (as the
kernel decides it), and adding or removing one named user. Folders' default ACLs
(``system.posix_acl_default``) are read and written only to take a uid's entries out.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from dataclasses import dataclass

__all__ = [
    "ACCESS",
    "DEFAULT",
    "AclUnsupported",
    "Entry",
    "R",
    "W",
    "X",
    "allows",
    "decode",
    "encode",
    "from_mode",
    "names_user",
    "read",
    "wanted",
    "with_user",
    "without_user",
    "write",
]

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"

R, W, X = 4, 2, 1
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_VERSION = 2
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")


class AclUnsupported(OSError):
    """The file system holding a path does not store POSIX ACLs (``EOPNOTSUPP``)."""


@dataclass(frozen=True, order=True)
class Entry:
    """One ACL entry; ``id`` is the uid or gid of named entries, else ``0xFFFFFFFF``."""

    tag: int
    id: int
    perm: int


Acl = tuple[Entry, ...]


def decode(raw: bytes) -> Acl:
    """The entries of an ``system.posix_acl_*`` attribute value."""
    if len(raw) < _HEADER.size or (len(raw) - _HEADER.size) % _ENTRY.size:
        raise ValueError(f"an ACL of {len(raw)} bytes is malformed")
    (version,) = _HEADER.unpack_from(raw)
    if version != _VERSION:
        raise ValueError(f"ACL version {version} is not 2")
    entries = [
        _ENTRY.unpack_from(raw, offset) for offset in range(_HEADER.size, len(raw), _ENTRY.size)
    ]
    return tuple(Entry(tag, ident, perm) for tag, perm, ident in entries)


def encode(acl: Acl) -> bytes:
    """The attribute value for ``acl`` (entries put in the order the kernel requires)."""
    body = b"".join(_ENTRY.pack(e.tag, e.perm, e.id) for e in sorted(acl))
    return _HEADER.pack(_VERSION) + body


def from_mode(mode: int) -> Acl:
    """The minimal ACL that a file's mode bits spell."""
    return (
        Entry(USER_OBJ, _NO_ID, mode >> 6 & 7),
        Entry(GROUP_OBJ, _NO_ID, mode >> 3 & 7),
        Entry(OTHER, _NO_ID, mode & 7),
    )


def read(fd: int, name: str = ACCESS) -> bytes | None:
    """The raw attribute ``name`` of the open file ``fd``; None when it has none."""
    try:
        return os.getxattr(fd, name)
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        if exc.errno == errno.EOPNOTSUPP:
            raise AclUnsupported(exc.errno, "POSIX ACLs are not supported here") from None
        raise


def write(fd: int, raw: bytes | None, name: str = ACCESS) -> None:
    """Set (or, with None, remove) the attribute ``name`` of the open file ``fd``."""
    try:
        if raw is None:
            try:
                os.removexattr(fd, name)
            except OSError as exc:
                if exc.errno != errno.ENODATA:
                    raise
        else:
            os.setxattr(fd, name, raw)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            raise AclUnsupported(exc.errno, "POSIX ACLs are not supported here") from None
        raise


def allows(raw: bytes | None, info: os.stat_result, uid: int, gid: int, want: int) -> bool:
    """Whether a process of ``uid:gid`` (no other groups) may ``want`` (R|W|X bits) the
    file ``info`` describes, whose ACL attribute is ``raw``: the kernel's own check, for an
    unprivileged process."""
    acl = decode(raw) if raw is not None else from_mode(info.st_mode)
    if info.st_uid == uid:
        return _has(info.st_mode >> 6 & 7, want)
    mask = next((e.perm for e in acl if e.tag == MASK), 7)
    named = next((e for e in acl if e.tag == USER and e.id == uid), None)
    if named is not None:
        return _has(named.perm & mask, want)
    groups = [
        e
        for e in acl
        if (e.tag == GROUP_OBJ and info.st_gid == gid) or (e.tag == GROUP and e.id == gid)
    ]
    if groups:
        return any(_has(e.perm & mask, want) for e in groups)
    return _has(info.st_mode & 7, want)


def with_user(raw: bytes | None, mode: int, uid: int, perm: int) -> bytes:
    """``raw`` (or the minimal ACL of ``mode``) with ``uid`` given ``perm`` too.

    The mask is widened just enough for the new entry: it caps every named entry, so an
    entry that a narrow mask held back gets more while this one is in place.
    """
    acl = decode(raw) if raw is not None else from_mode(mode)
    named = next((e for e in acl if e.tag == USER and e.id == uid), None)
    granted = perm | (named.perm if named is not None else 0)
    mask = next((e for e in acl if e.tag == MASK), None)
    old_mask = mask.perm if mask is not None else _group_obj(acl)
    kept = [e for e in acl if e.tag != MASK and not (e.tag == USER and e.id == uid)]
    return encode((*kept, Entry(USER, uid, granted), Entry(MASK, _NO_ID, old_mask | granted)))


def without_user(raw: bytes, uid: int) -> tuple[bytes | None, int | None]:
    """``raw`` without ``uid``'s named entries: ``(attribute, group bits)``.

    When nothing named is left, the ACL becomes minimal again: the attribute is None (to be
    removed) and the group bits to set are the owning group's effective permissions (its
    entry capped by the old mask), so nothing ends more open than the ACL allowed.
    """
    acl = decode(raw)
    kept = tuple(e for e in acl if not (e.tag == USER and e.id == uid))
    if any(e.tag in (USER, GROUP) for e in kept):
        return encode(kept), None
    mask = next((e.perm for e in kept if e.tag == MASK), 7)
    return None, _group_obj(kept) & mask


def names_user(raw: bytes | None, uid: int) -> bool:
    """Whether the ACL attribute ``raw`` has a named entry for ``uid``."""
    return raw is not None and any(e.tag == USER and e.id == uid for e in decode(raw))


def wanted(info: os.stat_result, writable: bool) -> int:
    """What a worker needs on a file or folder of a zone: read (and write, for a writable
    zone), and search on folders or execute on files that someone may already execute."""
    executable = stat.S_ISDIR(info.st_mode) or bool(info.st_mode & 0o111)
    return R | (W if writable else 0) | (X if executable else 0)


def _group_obj(acl: Acl) -> int:
    return next(e.perm for e in acl if e.tag == GROUP_OBJ)


def _has(perm: int, want: int) -> bool:
    return perm & want == want
