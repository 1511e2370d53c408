"""Giving the worker's uid the access its grant says when the orchestrator runs as root.

A worker never runs as root: an orchestrator running as root (a CI job's container, where
every file is root's) runs it as the sudo caller, the project folder's owner, or
``nobody``. Files and folders that uid could not use as the grant says (read; write too
in a writable mount; search on folders) are opened up for the run only, and put back
after it. This covers each host folder the grant mounts (zones, ``/session``,
``/workspace``, ``/repo``, ``/workers``, the read-only binds over policy files and
``.git``; not the outbox or ``ask`` copies, which are the run's own) whose owner is not
the worker's uid:

- **Before the container exists**, the tree is walked, never following anything (see
  :mod:`~orchestrator.hostfs.walk`). What each entry to change has (owner, mode,
  every extended attribute) is written and fsynced to the run's folder first (see
  :mod:`~orchestrator.runtime.access_record`). Then, under runc, the entry gets a named
  ACL entry for the worker's uid (:mod:`~orchestrator.runtime.acl`); gVisor checks
  permissions on owner and mode bits alone, so there (and on a file system without ACLs)
  the entry is lent to the uid: its owner for the run, with the owner bits it needs.
  Never opened up: a regular file with hard links outside the walked trees (its other
  names may be anywhere on the host), and a setuid, setgid or capability-bearing file
  (a write would drop those bits, and putting them back would bless new content).
- **After the container is gone** (:meth:`~orchestrator.runtime.run.Run.close`, which
  one-shot runs, sessions, batch and the warm pool all go through), the trees are walked
  again. Every recorded entry, wherever the worker moved it, gets back exactly its owner,
  attributes and mode. In writable trees, everything else the worker's uid owns (what it
  made) is given to the project folder's owner, loses ACL entries naming the worker, and
  (regular files) setuid and setgid bits. Links are changed themselves, never followed.
- **After a crash** (SIGKILL) the record stays: ``orchestrator gc``, and the next run that
  needs access, put back what a dead process's record lists. A record that is not the
  orchestrator's own (its HMAC does not verify) or names a folder outside the project is
  never applied: it is reported (a warning line and ``access.record_refused`` in the audit
  log) and left where it is for a person to look at.

Runs at the same time may share folders (the workspace, an output zone, a child and its
parent). Each step holds one lock per project; an entry another live run also opened up
stays open until the last of them ends, and what the worker made in a folder another
live run writes to is handed over by the last of them. While a run lasts, every process
of the same uid shares its access: a uid nothing else on the host runs as is best.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator import labels
from orchestrator.audit import AuditLog
from orchestrator.config import Project
from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.files import locked
from orchestrator.hostfs.paths import PathRefused
from orchestrator.hostfs.walk import Entry, TreeChanged, walk
from orchestrator.prepare import Prepared
from orchestrator.runtime import acl
from orchestrator.runtime.access_record import (
    RECORD,
    Ident,
    Record,
    RecordRefused,
    Saved,
    Tree,
    snapshot,
)
from orchestrator.runtime.access_record import restore as restore_saved

__all__ = ["RECORD", "WorkerAccess", "project_folders", "remove_run_dir", "sweep", "trees_for"]

log = logging.getLogger(__name__)

_LOCK = "access.lock"
_CAPABILITY = "security.capability"


class WorkerAccess:
    """The worker's access to one run's folders: :meth:`grant` before its container
    exists, :meth:`release` after it is gone (safe twice, and when nothing was granted)."""

    def __init__(self, prepared: Prepared, audit: AuditLog | None = None) -> None:
        self.uid, self.gid = prepared.uid, prepared.gid
        self.audit = audit
        self.allowed = project_folders(prepared.project)
        self.sandbox_root = prepared.paths.sandbox_root
        self.trees = trees_for(prepared) if os.geteuid() == 0 else []
        # gVisor decides on owner and mode bits alone: lend ownership there.
        self.lend = prepared.spec.isolation == "gvisor"
        info = prepared.project.root.stat()
        self.record = Record(
            prepared.paths.run_dir / RECORD,
            self.uid,
            self.gid,
            (info.st_uid, info.st_gid),
            labels.current_owner().labels(),
            self.trees,
        )
        self.skipped: list[str] = []
        """Files left as they were: hard links out of the trees, privileged files."""
        self.swept: list[Record] = []
        """Records of dead runs this grant put back first."""
        self._granted = False

    def grant(self) -> int:
        """Open the trees up for the worker's uid; the number of entries changed."""
        if not self.trees:
            return 0
        with locked(self.sandbox_root / _LOCK):
            others = _records(
                self.sandbox_root, self.allowed, exclude=self.record.file, audit=self.audit
            )
            for dead in [r for r in others if not r.alive]:  # what a SIGKILL left
                if not _release(dead, others=[r for r in others if r is not dead]):
                    others.remove(dead)
                    remove_run_dir(dead.file.parent)
                    self.swept.append(dead)
            shared = {ident: s for r in others for ident, s in r.saved.items()}
            wants = self._plan(shared)
            self.record.write()
            self._granted = True
            self._apply(wants)
        return len(self.record.saved)

    def release(self) -> list[str]:
        """Put back what :meth:`grant` changed and give the worker's files to the project
        folder's owner; the problems (the record is kept for ``gc`` when there are any)."""
        if not self._granted:
            return []
        with locked(self.sandbox_root / _LOCK):
            others = _records(
                self.sandbox_root, self.allowed, exclude=self.record.file, audit=self.audit
            )
            problems = _release(self.record, others=others)
        self._granted = bool(problems)
        return problems

    def summary(self) -> dict[str, Any]:
        """For the audit log."""
        return {
            "uid": self.uid,
            "method": "owner" if self.lend else "acl",
            "trees": [
                {"path": str(t.path), "mode": "rw" if t.writable else "ro"} for t in self.trees
            ],
            "entries": len(self.record.saved),
            "left_alone": self.skipped,
        }

    # -- steps ----------------------------------------------------------------------------

    def _plan(self, shared: dict[Ident, Saved]) -> dict[Ident, int]:
        """Walk the trees: what each entry needs, and what it has now (into the record)."""
        wants: dict[Ident, int] = {}
        names: dict[Ident, set[str]] = {}  # the walked names of files with hard links
        nlink: dict[Ident, int] = {}
        saved = self.record.saved
        for tree in self.trees:

            def visit(entry: Entry, tree: Tree = tree) -> bool:
                info, ident = entry.info, entry.ident
                if ident in tree.skip:
                    return False
                if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                    return True
                if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                    # Trees may overlap: count canonical paths, not visits.
                    names.setdefault(ident, set()).add(str(tree.path / entry.path))
                    nlink[ident] = info.st_nlink
                want = acl.wanted(info, tree.writable)
                if ident in shared:  # another live run opened it up: keep it so for us too
                    saved.setdefault(ident, shared[ident])
                elif ident not in saved:
                    found = None if info.st_uid == self.uid else self._look(entry, tree, want)
                    if found is None:
                        return True
                    saved[ident] = found
                wants[ident] = wants.get(ident, 0) | want
                return True

            _walk(tree, visit)
        for ident, count in nlink.items():
            if ident in wants and ident not in shared and len(names[ident]) < count:
                self.skipped.append(f"{saved.pop(ident).path} (hard links elsewhere)")
                del wants[ident]
        return wants

    def _look(self, entry: Entry, tree: Tree, want: int) -> Saved | None:
        """What ``entry`` has now, when the worker's uid lacks ``want`` on it."""
        fd = entry.open()
        if fd is None:
            return None
        try:
            info = os.fstat(fd)
            xattrs = snapshot(fd)
            raw = None if self.lend else xattrs.get(acl.ACCESS)
            if acl.allows(raw, info, self.uid, self.gid, want):
                return None
            where = f"{tree.path}/{entry.path}" if entry.path else str(tree.path)
            privileged = info.st_mode & stat.S_ISUID or (
                info.st_mode & stat.S_ISGID and info.st_mode & stat.S_IXGRP
            )
            if stat.S_ISREG(info.st_mode) and (privileged or _CAPABILITY in xattrs):
                self.skipped.append(f"{where} (setuid, setgid or file capabilities)")
                return None
            return Saved(where, info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), xattrs)
        finally:
            os.close(fd)

    def _apply(self, wants: dict[Ident, int]) -> None:
        """Walk again and give the worker's uid what each recorded entry needs."""
        done: set[Ident] = set()
        for tree in self.trees:

            def visit(entry: Entry, tree: Tree = tree) -> bool:
                ident = entry.ident
                if ident in tree.skip:
                    return False
                want = wants.get(ident)
                if want is None or ident in done:
                    return True
                fd = entry.open()
                if fd is None:
                    return True
                try:
                    self._open_up(fd, want)
                except OSError as exc:
                    where = f"{tree.path}/{entry.path}" if entry.path else str(tree.path)
                    raise OrchestratorError(
                        f"{tree.label}: cannot give the worker's uid {self.uid} access to "
                        f"{where}: {exc.strerror or exc}; `chown -R {self.uid}:{self.gid} "
                        f"{tree.path}`, or run the orchestrator as the folder's owner"
                    ) from None
                finally:
                    os.close(fd)
                done.add(ident)
                return True

            _walk(tree, visit)

    def _open_up(self, fd: int, want: int) -> None:
        """An ACL entry for the worker's uid, or (gVisor, no ACLs here) lent ownership."""
        info = os.fstat(fd)
        if not self.lend:
            try:
                raw = acl.read(fd)
                if not acl.allows(raw, info, self.uid, self.gid, want):
                    acl.write(fd, acl.with_user(raw, info.st_mode, self.uid, want))
                return
            except acl.AclUnsupported:
                pass  # lend ownership instead
        if info.st_uid != self.uid:
            os.fchown(fd, self.uid, -1)
        mode = stat.S_IMODE(info.st_mode) & ~stat.S_IRWXU | want << 6  # the grant's, exactly
        if stat.S_ISREG(info.st_mode):
            mode &= ~(stat.S_ISUID | stat.S_ISGID)
        os.fchmod(fd, mode)


def trees_for(prepared: Prepared) -> list[Tree]:
    """The host folders of ``prepared``'s mounts whose owner is not the worker's uid."""
    grant, paths = prepared.grant, prepared.paths
    mounted = [z for z in grant.zones if not (z.outbox or z.ask_base is not None)]
    trees: list[Tree] = []
    for zone in mounted:
        try:
            info = zone.host_path.lstat()
        except OSError:
            continue
        if info.st_uid == prepared.uid:
            continue
        if not (stat.S_ISDIR(info.st_mode) or (zone.read_only and stat.S_ISREG(info.st_mode))):
            continue  # a policy file or .git mounted read-only is a file; nothing else is
        covered = [
            other.host_path
            for other in grant.zones
            if other is not zone and other.target.startswith(zone.target + "/")
        ]
        covered += [
            zone.host_path / mask[len(zone.target) + 1 :]
            for mask in grant.masks
            if mask.startswith(zone.target + "/")
        ]
        if paths.sandbox_root != zone.host_path and paths.sandbox_root.is_relative_to(
            zone.host_path
        ):
            covered.append(paths.sandbox_root)
        trees.append(
            Tree(
                zone.host_path,  # walked without following links (treewalk)
                not zone.read_only,
                f"zone '{zone.name}' ({zone.target})",
                frozenset(_idents(covered)),
            )
        )
    return trees


def project_folders(project: Project) -> list[Path]:
    """The folders a run of ``project`` may open up: an access record naming any other
    tree is refused."""
    return [
        project.sandbox_root,
        project.workers_dir,
        project.repo,
        project.file,
        *(zone.host_path for zone in project.zones.values()),
    ]


def sweep(
    project: Project, *, everything: bool = False, audit: AuditLog | None = None
) -> list[str]:
    """Put back what runs of dead orchestrators left opened up (``orchestrator gc``); with
    ``everything``, also those of other pid namespaces. The ids of the runs swept, each
    recorded in ``audit`` as ``gc.access_restored``."""
    swept: list[str] = []
    sandbox_root = project.sandbox_root
    if not (sandbox_root / "runs").is_dir():
        return swept
    with locked(sandbox_root / _LOCK):
        records = _records(sandbox_root, project_folders(project), audit=audit)
        for record in records:
            state = labels.owner_state(record.process)
            if state == "alive" or (state == "foreign" and not everything):
                continue
            others = [r for r in records if r is not record]
            problems = _release(record, others=others)
            for problem in problems:
                log.warning("gc could not put back access of %s: %s", record.file.parent, problem)
            if not problems:
                remove_run_dir(record.file.parent)
                swept.append(record.file.parent.name)
                if audit is not None:
                    audit.record(
                        "gc.access_restored",
                        run_id=record.file.parent.name,
                        metadata={"uid": record.uid, "entries": len(record.saved)},
                    )
    return swept


def remove_run_dir(run_dir: Path) -> None:
    """Remove a run's folder, but keep an access record that still lists changes (for gc).

    ``rmtree`` walks by directory descriptors and never follows a link the worker planted.
    """
    if not (run_dir / RECORD).exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for child in run_dir.iterdir():
        if child.name == RECORD:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


# -- putting things back ------------------------------------------------------------------


def _release(record: Record, *, others: list[Record]) -> list[str]:
    """Undo ``record`` (see the module's docstring); the problems, record kept if any."""
    live = [r for r in others if r.alive]
    held = {ident for r in live for ident in r.saved}
    shared_roots = set(_idents(t.path for r in live for t in r.trees if t.writable))
    problems: list[str] = []
    restored: set[Ident] = set()
    for tree in record.trees:
        try:
            _put_back(record, tree, held, shared_roots, restored)
        except FileNotFoundError:
            continue  # the folder is gone, and what was in it
        except OSError as exc:
            problems.append(f"{tree.label}: {exc.filename or tree.path}: {exc.strerror or exc}")
    if not problems:
        record.file.unlink(missing_ok=True)
    return problems


def _put_back(
    record: Record,
    tree: Tree,
    held: set[Ident],
    shared_roots: set[Ident],
    restored: set[Ident],
) -> None:
    uid, owner = record.uid, record.owner
    shared: list[str] = []  # folders (paths from the root) another live run writes to

    def visit(entry: Entry) -> bool:
        info, ident = entry.info, entry.ident
        if ident in tree.skip:
            return False
        if stat.S_ISDIR(info.st_mode) and ident in shared_roots:
            shared.append(entry.path)
        if ident in held:
            return True  # another live run still needs it as it is; it puts it back
        saved = record.saved.get(ident)

        def in_shared() -> bool:
            return any(_under(entry.path, folder) for folder in shared)

        if saved is not None:
            if ident not in restored:
                _restore(entry, saved)
                restored.add(ident)
        elif tree.writable and info.st_uid == uid and owner[0] != uid and not in_shared():
            _give(entry, owner, uid)
        return True

    walk(tree.path, visit)


def _restore(entry: Entry, saved: Saved) -> None:
    fd = entry.open()
    if fd is None:
        return
    try:
        restore_saved(fd, saved)
    finally:
        os.close(fd)


def _give(entry: Entry, owner: tuple[int, int], uid: int) -> None:
    """Give what the worker made to the project folder's owner, without its privileges."""
    fd = entry.open()
    if fd is None:
        if not stat.S_ISDIR(entry.info.st_mode):
            # A link, FIFO or socket: changed itself, never what it points to.
            now = os.lstat(entry.name, dir_fd=entry.folder)
            if (now.st_dev, now.st_ino) == entry.ident and now.st_uid == uid:
                os.chown(entry.name, *owner, dir_fd=entry.folder, follow_symlinks=False)
        return
    try:
        os.fchown(fd, *owner)
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        names = [acl.ACCESS, acl.DEFAULT] if stat.S_ISDIR(info.st_mode) else [acl.ACCESS]
        for name in names:
            raw = _read_or_none(fd, name)
            if raw is not None and acl.names_user(raw, uid):
                kept, group = acl.without_user(raw, uid)
                acl.write(fd, kept, name)
                if name == acl.ACCESS and group is not None:
                    mode = mode & ~0o070 | group << 3
        if stat.S_ISREG(info.st_mode):
            mode &= ~(stat.S_ISUID | stat.S_ISGID)
        if mode != stat.S_IMODE(os.fstat(fd).st_mode):
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


# -- helpers ------------------------------------------------------------------------------


def _walk(tree: Tree, visit: Callable[[Entry], bool]) -> None:
    """Walk a tree to open it up: a folder moved meanwhile is a one-line error."""
    try:
        walk(tree.path, visit)
    except TreeChanged as exc:
        raise OrchestratorError(
            f"{tree.label}: {exc.strerror} (another run of the same uid moving folders?); run again"
        ) from None
    except PathRefused as exc:
        if exc.missing:
            return  # nothing there to open up
        raise OrchestratorError(
            f"{tree.label}: {exc.reason}, on its path; refusing to change access through it "
            "(a worker may have planted it): remove it and check what it pointed at"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return  # nothing there to open up
        raise


def _records(
    sandbox_root: Path,
    allowed: list[Path],
    *,
    exclude: Path | None = None,
    audit: AuditLog | None = None,
) -> list[Record]:
    """The access records of the project's runs; those refused are reported and left."""
    found: list[Record] = []
    for file in sorted((sandbox_root / "runs").glob(f"*/{RECORD}")):
        if file == exclude:
            continue
        try:
            found.append(Record.load(file, allowed))
        except RecordRefused as exc:
            log.warning(
                "refusing the access record %s: %s; nothing it lists is changed. Look at "
                "it, then remove it (`rm %s`)", file, exc, file,
            )  # fmt: skip
            if audit is not None:
                audit.record(
                    "access.record_refused",
                    allowed=False,
                    reason=str(exc),
                    run_id=file.parent.name,
                    path=str(file),
                )
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("ignoring the unreadable access record %s: %s", file, exc)
    return found


def _idents(paths: Iterable[Path]) -> Iterator[Ident]:
    for path in paths:
        try:
            info = path.lstat()
        except OSError:
            continue
        yield info.st_dev, info.st_ino


def _read_or_none(fd: int, name: str) -> bytes | None:
    try:
        return acl.read(fd, name)
    except acl.AclUnsupported:
        return None


def _under(path: str, folder: str) -> bool:
    return folder == "" or path == folder or path.startswith(folder + "/")
