"""What a run changed to give its worker access: written before the change, read to undo it.

One JSON file per run, ``<sandbox root>/runs/<id>/access.json``, written to a temporary
name, fsynced and renamed into place before anything on the host changes, so that a
SIGKILLed orchestrator leaves enough for ``gc`` to put every file back. It names the
process that wrote it (pid, start time, pid namespace, as on container labels), the trees
it walked, and for each changed file or folder (by device and inode, since a worker can
move things) its owner, mode bits and every extended attribute it had (its ACLs,
``security.capability``, ...). Putting back restores exactly those.

A record is the orchestrator's own or it is not used: it carries an HMAC of its content and
its place under a key only the effective user can read (:mod:`~orchestrator.runtime.state_key`),
and every tree it names must be a folder of the project as loaded (a zone, the sandbox
root, the workers folder, the repo, the project file). :meth:`Record.load` refuses any
other (:class:`RecordRefused`), and the callers report it, never apply it.
"""

from __future__ import annotations

import base64
import errno
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import labels
from orchestrator.hostfs.files import read_limited
from orchestrator.runtime.state_key import sign, signed_by_us

__all__ = ["RECORD", "Ident", "Record", "RecordRefused", "Saved", "Tree", "restore", "snapshot"]

RECORD = "access.json"
#: Largest record read (one line per changed file: a big tree gives a few MiB).
MAX_RECORD = 256 << 20
Ident = tuple[int, int]


class RecordRefused(ValueError):
    """An access record the orchestrator did not write, or naming a folder outside the
    project: reported, never applied."""


@dataclass(frozen=True)
class Tree:
    """One host folder the worker's uid is given access to."""

    path: Path
    writable: bool
    label: str
    skip: frozenset[Ident] = frozenset()
    """Left alone, and folders not entered: the sandbox root, places other mounts cover."""


@dataclass(frozen=True)
class Saved:
    """What one file or folder had before the run."""

    path: str
    uid: int
    gid: int
    mode: int
    """Permission bits with setuid, setgid and sticky (``S_IMODE``)."""
    xattrs: dict[str, bytes]
    """Every extended attribute, ACLs included (``system.posix_acl_*``)."""


@dataclass
class Record:
    """What one run changed, as written to ``runs/<id>/access.json``."""

    file: Path
    uid: int
    gid: int
    owner: tuple[int, int]
    """The project folder's owner: who gets what the worker made."""
    process: dict[str, str]
    trees: list[Tree]
    saved: dict[Ident, Saved] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        """Whether the run's process may still be running (another pid namespace: yes)."""
        return labels.owner_state(self.process) != "gone"

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "uid": self.uid,
            "gid": self.gid,
            "owner": list(self.owner),
            "process": self.process,
            "trees": [
                {
                    "path": str(t.path),
                    "writable": t.writable,
                    "label": t.label,
                    "skip": sorted(t.skip),
                }
                for t in self.trees
            ],
            "saved": [
                [dev, ino, s.path, s.uid, s.gid, s.mode, _encoded(s.xattrs)]
                for (dev, ino), s in sorted(self.saved.items())
            ],
        }

    @classmethod
    def load(cls, file: Path, allowed: Sequence[Path]) -> Record:
        """Read a record; ``ValueError`` (or ``KeyError``, ``TypeError``) when malformed,
        :class:`RecordRefused` when not the orchestrator's own or when a tree lies outside
        every folder of ``allowed``."""
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            data = json.loads(read_limited(fd, MAX_RECORD))
        finally:
            os.close(fd)
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError("not an access record of version 1")
        mac = data.pop("mac", None)
        if not signed_by_us(data, str(file), mac):
            raise RecordRefused(
                "not signed with this user's record key: the orchestrator did not write it here"
            )
        for tree in data["trees"]:
            path = Path(os.path.normpath(str(tree["path"])))
            if not any(path == top or path.is_relative_to(top) for top in allowed):
                raise RecordRefused(f"it names {path}, which is no folder of the project")
        trees = [
            Tree(
                Path(t["path"]),
                bool(t["writable"]),
                str(t["label"]),
                frozenset((int(d), int(i)) for d, i in t["skip"]),
            )
            for t in data["trees"]
        ]
        saved = {
            (int(dev), int(ino)): Saved(str(path), int(uid), int(gid), int(mode), _decoded(x))
            for dev, ino, path, uid, gid, mode, x in data["saved"]
        }
        owner = data["owner"]
        return cls(
            file,
            int(data["uid"]),
            int(data["gid"]),
            (int(owner[0]), int(owner[1])),
            {str(k): str(v) for k, v in data["process"].items()},
            trees,
            saved,
        )

    def write(self) -> None:
        """Write durably: a temporary file, fsynced, renamed into place."""
        self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.file.with_name(self.file.name + ".tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            body = self.to_json()
            json.dump({**body, "mac": sign(body, str(self.file))}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.file)


def snapshot(fd: int) -> dict[str, bytes]:
    """Every extended attribute of the open file ``fd`` (none where unsupported)."""
    try:
        names = os.listxattr(fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            return {}
        raise
    found: dict[str, bytes] = {}
    for name in names:
        try:
            found[name] = os.getxattr(fd, name)
        except OSError as exc:
            if exc.errno != errno.ENODATA:  # removed in between
                raise
    return found


def restore(fd: int, saved: Saved) -> None:
    """Give the open file ``fd`` back exactly ``saved``'s owner, attributes and mode."""
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid) != (saved.uid, saved.gid):
        os.fchown(fd, saved.uid, saved.gid)
    current = snapshot(fd)
    for name in sorted(current.keys() - saved.xattrs.keys()):
        os.removexattr(fd, name)
    for name, value in sorted(saved.xattrs.items()):
        if current.get(name) != value:
            os.setxattr(fd, name, value)
    os.fchmod(fd, saved.mode)  # last: chown and ACL writes change mode bits


def _encoded(xattrs: dict[str, bytes]) -> dict[str, str]:
    return {name: base64.b64encode(value).decode("ascii") for name, value in xattrs.items()}


def _decoded(xattrs: dict[str, str]) -> dict[str, bytes]:
    return {str(name): base64.b64decode(value) for name, value in xattrs.items()}
