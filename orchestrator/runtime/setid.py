"""Setuid and setgid bits: never honoured inside a worker, never left behind on the host.

A setuid-root program in a zone or an input stands for any vulnerable setuid program a
worker could drive. Three things keep such bits from mattering:

- **Honoured inside** only when neither ``nosuid`` nor ``no-new-privileges`` stops them.
  Docker runs always set ``no-new-privileges``, and as root every bind mount is a pinned,
  ``nosuid,nodev`` mount (:mod:`~orchestrator.runtime.mount_sources`). A swarm task on
  Engine API 1.41 has neither, so there :func:`refuse_setid` walks, before anything exists,
  every host folder the run mounts and its inputs, and refuses the first set-id regular
  file it finds, naming it and the fix. A plan without ``no-new-privileges`` and without
  pins is walked the same way under Docker (no plan the orchestrator compiles is one
  today: see :func:`walk_needed`).
- **Carried in by inputs**: a set-id input is copied, never hard-linked, and the copy has
  no set-id bit (:mod:`~orchestrator.runtime.inputs`).
- **Left behind**: :class:`SetidSweep` notes the set-id entries and device files already
  in the run's writable folders before its container exists (:meth:`~SetidSweep.before`)
  and, once it is gone (:meth:`~SetidSweep.after`), strips every other set-id bit from
  regular files and folders there, each stripped entry audited as ``zone.setid_stripped``.
  Device files and FIFOs the run left are reported (``zone.special_file``), not removed.
- **Owned by root**: a run as the image's user (``image_user``, root under gVisor) makes
  root's files in its writable zones. After it, every entry there whose owner is not the
  project's owner and was not so before the run is given to the owner (``chown`` of the
  inode, links themselves; ``zone.owner_restored``), which also clears a regular file's
  set-id bits. What cannot be is reported (``zone.owner_left``).

The rule for "the run added it": a set-id bit is kept only on the very inode (device and
inode number) that had it before the run, and, for a regular file, only when its ``ctime``
has not moved since (a chmod, chown or write changes it). A folder's ``ctime`` moves
whenever an entry is added in it, so a pre-existing setgid shared folder keeps its bit
however much the worker writes into it. Nothing is followed: the trees are walked with
:mod:`~orchestrator.hostfs.walk`, and each strip is a ``chmod`` of the inode opened
``O_PATH | O_NOFOLLOW`` and checked by identity. A non-root orchestrator can only change
files it owns: what it cannot strip is reported (``zone.setid_left``) and logged.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.walk import Entry, TreeChanged, walk

if TYPE_CHECKING:
    from orchestrator.audit import AuditLog
    from orchestrator.plan import ContainerSpec
    from orchestrator.prepare import Prepared

__all__ = [
    "SETID",
    "SetidRefused",
    "SetidSweep",
    "refuse_setid",
    "setid_of",
    "setid_reason",
    "walk_needed",
]

log = logging.getLogger(__name__)

SETID = stat.S_ISUID | stat.S_ISGID
_SPECIAL = (stat.S_ISCHR, stat.S_ISBLK, stat.S_ISFIFO)

Ident = tuple[int, int]


class SetidRefused(OrchestratorError):
    """A zone or input the run mounts holds a set-id file the engine would honour."""


def walk_needed(spec: ContainerSpec, *, pinned: bool) -> bool:
    """Whether a Docker (or Podman) run must be walked for set-id files: only when
    nothing else stops their bits, i.e. neither ``no-new-privileges`` nor pinned
    ``nosuid`` mounts. Swarm always walks (it has neither)."""
    return not spec.no_new_privileges and not pinned


def setid_reason(always: str | None, spec: ContainerSpec, *, pinned: bool) -> str | None:
    """Why a set-id file on the run's mounts must be refused: ``always`` (a backend's
    :attr:`~orchestrator.runtime.backend.Capabilities.setid_refusal`), else only when
    :func:`walk_needed` (None: it need not be)."""
    if always is not None:
        return always
    if walk_needed(spec, pinned=pinned):
        return "the plan has no no-new-privileges and its mounts are not nosuid"
    return None


def setid_of(mode: int, uid: int, gid: int) -> str:
    """ "setuid root", "setgid staff" or both: for a message."""
    parts = []
    if mode & stat.S_ISUID:
        parts.append(f"setuid {_user(uid)}")
    if mode & stat.S_ISGID:
        parts.append(f"setgid {_group(gid)}")
    return " and ".join(parts)


def refuse_setid(prepared: Prepared, *, why: str) -> None:
    """Refuse (:class:`SetidRefused`, one line) when a zone the run mounts or one of its
    inputs holds a set-id regular file. ``why`` says why the engine would honour it."""
    for label, root, skip in _mounted(prepared):
        found = _first_setid(root, skip)
        if found is not None:
            where, info = found
            rights = (
                f"{_user(info.st_uid)}'s"
                if info.st_mode & stat.S_ISUID
                else f"group {_group(info.st_gid)}'s"
            )
            raise SetidRefused(
                f"{label}: {where} is {setid_of(info.st_mode, info.st_uid, info.st_gid)}; a "
                f"worker could run it with {rights} rights on this engine ({why}): remove "
                f"the bit (`chmod u-s,g-s {where}`) or move the file out of the "
                f"{'input' if label.startswith('input') else 'zone'}"
            )


def _mounted(prepared: Prepared) -> list[tuple[str, Path, frozenset[Ident]]]:
    """What a run mounts from the host: ``(label, path, idents not to enter)``. Not the
    outbox (a tmpfs, or an empty results folder) nor ``ask`` copies (made without set-id
    bits, see :func:`~orchestrator.runtime.host_folders.private_copy`)."""
    grant, paths = prepared.grant, prepared.paths
    hidden = [paths.sandbox_root]
    for zone in grant.zones:
        hidden += [
            zone.host_path / mask[len(zone.target) + 1 :]
            for mask in grant.masks
            if mask.startswith(zone.target + "/")
        ]
    skip = frozenset(_idents(hidden))
    found = [
        (f"zone '{zone.name}' ({zone.target})", zone.host_path, skip)
        for zone in grant.zones
        if not zone.outbox and zone.ask_base is None
    ]
    found += [(f"input {spec.source}", spec.source, skip) for spec in prepared.inputs]
    return found


def _first_setid(root: Path, skip: frozenset[Ident]) -> tuple[str, os.stat_result] | None:
    found: list[tuple[str, os.stat_result]] = []

    def visit(entry: Entry) -> bool:
        if found or (entry.ident in skip and entry.path):
            return False
        info = entry.info
        if stat.S_ISREG(info.st_mode) and info.st_mode & SETID:
            path = root / entry.path if entry.path else root
            found.append((str(path), info))
        return True

    try:
        walk(root, visit)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # a missing output zone is made later, empty
            raise OrchestratorError(f"{root}: cannot be checked for setuid files: {exc}") from None
    return found[0] if found else None


# -- after the run ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Seen:
    mode: int
    ctime_ns: int


@dataclass(frozen=True)
class Finding:
    """One thing the sweep did or saw, for the audit log."""

    operation: str
    """``zone.setid_stripped``, ``zone.setid_left``, ``zone.special_file``,
    ``zone.owner_restored`` or ``zone.owner_left``."""
    label: str
    path: str
    old_mode: int
    new_mode: int | None = None
    problem: str | None = None
    owner: tuple[int, int] | None = None
    """``zone.owner_*``: the uid and gid the run left it with."""

    def metadata(self) -> dict[str, Any]:
        data: dict[str, Any] = {"zone": self.label, "old_mode": f"{self.old_mode:o}"}
        if self.new_mode is not None:
            data["new_mode"] = f"{self.new_mode:o}"
        if self.owner is not None:
            data["old_owner"] = f"{self.owner[0]}:{self.owner[1]}"
        return data


class SetidSweep:
    """The run's writable host folders (rw zones, ``/session``, ``/workspace``):
    :meth:`before` the container exists, :meth:`after` it is gone (see the module)."""

    def __init__(self, prepared: Prepared) -> None:
        grant = prepared.grant
        self.trees = [
            (f"zone '{z.name}' ({z.target})", z.host_path)
            for z in grant.zones
            if not (z.read_only or z.outbox or z.ask_base is not None)
        ]
        self._seen: dict[Ident, _Seen] = {}
        self._done = False
        # A run as the image's user (root under gVisor) leaves root's files on the host:
        # whatever it made or re-owned goes to the project's owner after it.
        self._owner = (prepared.uid, prepared.gid) if prepared.spec.image_user else None
        self._owned: dict[Ident, tuple[int, int]] = {}

    def before(self) -> None:
        """Note what already has set-id bits, and the device files and FIFOs already there."""
        for _, root in self.trees:

            def visit(entry: Entry) -> bool:
                info = entry.info
                if info.st_mode & SETID or any(kind(info.st_mode) for kind in _SPECIAL):
                    self._seen[entry.ident] = _Seen(info.st_mode, info.st_ctime_ns)
                if self._owner is not None and (info.st_uid, info.st_gid) != self._owner:
                    self._owned[entry.ident] = (info.st_uid, info.st_gid)
                return True

            _quietly(root, visit)

    def after(self, audit: AuditLog | None = None, **context: Any) -> list[Finding]:
        """Strip what the run added, report the rest; each finding into ``audit`` (once)."""
        if self._done:
            return []
        self._done = True
        findings: list[Finding] = []
        for label, root in self.trees:

            def visit(entry: Entry, label: str = label, root: Path = root) -> bool:
                for finding in (self._reown(entry, label, root), self._check(entry, label, root)):
                    if finding is not None:
                        findings.append(finding)
                return True

            _quietly(root, visit)
        for finding in findings:
            if finding.operation not in ("zone.setid_stripped", "zone.owner_restored"):
                log.warning("%s: %s", finding.path, finding.problem)
            if audit is not None:
                try:
                    audit.record(
                        finding.operation,
                        allowed=False,
                        reason=finding.problem,
                        path=finding.path,
                        metadata=finding.metadata(),
                        **context,
                    )
                except OrchestratorError as exc:
                    log.warning("could not audit %s: %s", finding.operation, exc)
        return findings

    def _reown(self, entry: Entry, label: str, root: Path) -> Finding | None:
        """With ``image_user``: give an entry the run made or re-owned to the project's
        owner (a chown of a regular file also clears its set-id bits)."""
        info = entry.info
        if self._owner is None or (info.st_uid, info.st_gid) == self._owner:
            return None
        if self._owned.get(entry.ident) == (info.st_uid, info.st_gid):
            return None  # as it was before the run
        path = str(root / entry.path) if entry.path else str(root)
        mode = stat.S_IMODE(info.st_mode)
        problem = _chown(entry, *self._owner)
        if problem is None:
            left = (info.st_uid, info.st_gid)
            return Finding("zone.owner_restored", label, path, mode, owner=left)
        return Finding(
            "zone.owner_left",
            label,
            path,
            mode,
            owner=(info.st_uid, info.st_gid),
            problem=f"owned by {_user(info.st_uid)}, left by the run, could not be given to "
            f"uid {self._owner[0]} ({problem}): `sudo chown {self._owner[0]}:{self._owner[1]} "
            f"{path}`",
        )

    def _check(self, entry: Entry, label: str, root: Path) -> Finding | None:
        info = entry.info
        mode = info.st_mode
        path = str(root / entry.path) if entry.path else str(root)
        seen = self._seen.get(entry.ident)
        if any(kind(mode) for kind in _SPECIAL):
            if seen is not None and stat.S_IFMT(seen.mode) == stat.S_IFMT(mode):
                return None
            return Finding(
                "zone.special_file",
                label,
                path,
                stat.S_IMODE(mode),
                problem="a device file or FIFO left in a writable folder by the run; "
                "check it and remove it (`rm`)",
            )
        if not (mode & SETID) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return None
        keep = 0
        same_inode = seen is not None and stat.S_IFMT(seen.mode) == stat.S_IFMT(mode)
        if (
            seen is not None
            and same_inode
            and (stat.S_ISDIR(mode) or seen.ctime_ns == info.st_ctime_ns)
        ):
            keep = seen.mode & SETID
        if not mode & SETID & ~keep:
            return None
        new = stat.S_IMODE(mode) & ~(SETID & ~keep)
        problem = _chmod(entry, new)
        if problem is None:
            return Finding("zone.setid_stripped", label, path, stat.S_IMODE(mode), new)
        return Finding(
            "zone.setid_left",
            label,
            path,
            stat.S_IMODE(mode),
            problem=f"{setid_of(mode, info.st_uid, info.st_gid)}, left by the run, could not be "
            f"stripped ({problem}): `chmod u-s,g-s {path}`",
        )


def _chmod(entry: Entry, mode: int) -> str | None:
    """``chmod`` the very inode ``entry`` is, never a link: None, or why it failed."""
    return _on_inode(entry, lambda path, _: os.chmod(path, mode), links=False)


def _chown(entry: Entry, uid: int, gid: int) -> str | None:
    """``chown`` the very inode ``entry`` is (a link itself, never its target): None, or
    why it failed."""

    def chown(path: str, now: os.stat_result) -> None:
        if stat.S_ISLNK(now.st_mode):
            os.chown(entry.name, uid, gid, dir_fd=entry.folder, follow_symlinks=False)
        else:
            os.chown(path, uid, gid)

    return _on_inode(entry, chown, links=True)


def _on_inode(
    entry: Entry, act: Callable[[str, os.stat_result], None], *, links: bool
) -> str | None:
    """``act`` on the very inode ``entry`` is, through its ``/proc/self/fd`` path (an
    ``O_PATH`` descriptor cannot be ``fchmod``'ed or ``fchown``'ed): None, or why it failed.
    A link there is refused as a replacement unless ``links``."""
    try:
        fd = os.open(entry.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=entry.folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != entry.ident or (stat.S_ISLNK(now.st_mode) and not links):
            return "it was replaced while being looked at"
        act(f"/proc/self/fd/{fd}", now)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return None


def _quietly(root: Path, visit: Any) -> None:
    try:
        walk(root, visit)
    except TreeChanged as exc:
        log.warning("%s: %s; set-id bits there were not all checked", root, exc.strerror)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("%s: cannot be checked for set-id bits: %s", root, exc)


def _idents(paths: list[Path]) -> list[Ident]:
    found = []
    for path in paths:
        try:
            info = path.lstat()
        except OSError:
            continue
        found.append((info.st_dev, info.st_ino))
    return found


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"
