"""The change-set store: ``<sandbox root>/changes/<id>/{manifest.json, blobs/<sha256>}``.

Creation is atomic: a change set is built in a temporary folder inside the store (same
filesystem), every file and folder is fsynced, and the folder is renamed to its fresh
random id while the store lock is held and the id is checked to be unused. A crash leaves
the whole change set or none of it; leftover ``.tmp-<pid>-*`` folders are invisible to
readers and removed once their process is gone. Existing change sets are never rewritten
except for their manifest's status, scans and history, each update a whole new manifest
renamed into place under an exclusive ``flock`` of ``<store>/.lock``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from orchestrator.audit.files import fsync_dir
from orchestrator.audit.timeutil import format_timestamp, utc_now
from orchestrator.hostfs.files import locked, write_durably
from orchestrator.labels import pid_alive
from orchestrator.staging.blobs import CHUNK
from orchestrator.staging.collected import Collected
from orchestrator.staging.errors import (
    BlobMismatch,
    ChangeNotFound,
    InvalidChangeId,
    ManifestError,
    StagingError,
    StatusConflict,
)
from orchestrator.staging.manifest import (
    FINAL,
    ID,
    OPEN,
    ChangeFile,
    ChangeMeta,
    ChangeSet,
    ScanResult,
    StatusChange,
    check_id,
    check_transition,
)

__all__ = ["MANIFEST", "ChangeStore"]

MANIFEST = "manifest.json"
MAX_MESSAGE = 64 << 10
_PREFIX = re.compile(r"^[0-9a-f]{4,11}$")
_TEMP = re.compile(r"^\.tmp-(\d+)-")
_STALE_AFTER = 24 * 3600.0


def _now() -> str:
    return format_timestamp(utc_now())


def _encode(change: ChangeSet) -> bytes:
    return (json.dumps(change.to_dict(), indent=2, ensure_ascii=False) + "\n").encode()


def _digest_fd(fd: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while data := os.read(fd, CHUNK):
        digest.update(data)
        size += len(data)
    return digest.hexdigest(), size


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class ChangeStore:
    """Change sets under ``root`` (normally ``<sandbox root>/changes``)."""

    def __init__(self, root: Path, *, folder: int | None = None) -> None:
        """The store at ``root``; with ``folder``, a descriptor of that folder (checked by
        the caller), which the store then owns (closed when it is collected) and reaches
        everything through: ``root`` only names it, and a folder or link swapped in for
        ``root``'s name (or one above it) after the check is never used."""
        self.root = Path(root)
        self._folder = folder
        if folder is not None:
            weakref.finalize(self, _close_quietly, folder)

    @property
    def _at(self) -> Path:
        """Where the store is reached: ``root``, or the held folder by this process's id
        (a path git, run by this process, can open too)."""
        if self._folder is None:
            return self.root
        return Path(f"/proc/{os.getpid()}/fd/{self._folder}")

    @property
    def lock_file(self) -> Path:
        return self._at / ".lock"

    def __repr__(self) -> str:
        return f"ChangeStore({str(self.root)!r})"

    # -- paths -----------------------------------------------------------------------

    def _ensure(self) -> None:
        self._at.mkdir(mode=0o700, parents=True, exist_ok=True)

    def folder(self, change_id: str) -> Path:
        """The folder of change set ``change_id`` (the id is checked, never a path)."""
        return self._at / check_id(change_id)

    def blob_path(self, change_id: str, sha256: str) -> Path:
        """Where the blob ``sha256`` of ``change_id`` is stored."""
        if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise StagingError(f"'{str(sha256)[:80]!r}' is not a sha256; blobs are named by one")
        return self.folder(change_id) / "blobs" / sha256

    def open_blob(self, change_id: str, sha256: str) -> BinaryIO:
        """Open a blob for reading, refusing anything but a regular file (no links)."""
        path = self.blob_path(change_id, sha256)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise BlobMismatch(
                f"change set {change_id}: blob {sha256[:12]} cannot be opened ({exc.strerror}); "
                "discard the change set"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BlobMismatch(f"change set {change_id}: blob {sha256[:12]} is not a regular file")
        return os.fdopen(fd, "rb")

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """A private temporary folder inside the store, for collecting on its filesystem."""
        self._ensure()
        folder = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=self._at))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # -- creating --------------------------------------------------------------------

    def create(self, collected: Collected, meta: ChangeMeta) -> ChangeSet:
        """Store ``collected`` as a new ``pending`` change set; atomic, never overwrites."""
        self._ensure()
        self.clean_stale()
        building = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=self._at))
        try:
            blobs = building / "blobs"
            blobs.mkdir(mode=0o700)
            placed: set[str] = set()
            for item in collected.files:
                if item.sha256 is None or item.sha256 in placed:
                    continue
                if item.blob is None:
                    raise StagingError(f"collected file {item.path} has no blob; collect again")
                self._place(item.blob, blobs / item.sha256, item.sha256, item.size)
                placed.add(item.sha256)
            fsync_dir(blobs)
            now = _now()
            change = ChangeSet(
                id=secrets.token_hex(6),
                worker=meta.worker,
                run_id=meta.run_id,
                session_id=meta.session_id,
                trust=meta.trust,
                target=meta.target,
                message=meta.message[:MAX_MESSAGE].encode("utf-8", "backslashreplace").decode(),
                created_at=now,
                status="pending",
                files=tuple(
                    ChangeFile(f.path, f.operation, f.size, f.sha256, f.mode, f.base_sha256)
                    for f in collected.files
                ),
                rejected=tuple(collected.rejected),
                truncated=collected.truncated,
                history=(StatusChange("pending", now, "created"),),
            )
            try:  # what get() would refuse is refused now, before anything is published
                ChangeSet.from_dict(change.to_dict())
            except ValueError as exc:
                raise StagingError(f"cannot store this change set: {exc}") from None
            return self._publish(building, change)
        finally:
            shutil.rmtree(building, ignore_errors=True)

    def _place(self, source: Path, target: Path, sha256: str, size: int) -> None:
        """Link (or copy) one blob into the change set, then check its content."""
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise StagingError(f"cannot read collected blob {source}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StagingError(f"collected blob {source} is not a regular file")
            try:  # the check below opens the result without following anything
                os.link(source, target, follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                with os.fdopen(os.dup(fd), "rb") as data, open(target, "xb") as out:
                    shutil.copyfileobj(data, out, CHUNK)
        finally:
            os.close(fd)
        try:
            check = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise BlobMismatch(
                f"collected blob {source} cannot be stored: {exc.strerror}"
            ) from None
        try:
            os.fchmod(check, 0o444)
            if not stat.S_ISREG(os.fstat(check).st_mode) or _digest_fd(check) != (sha256, size):
                raise BlobMismatch(f"collected blob {source} does not hold {sha256[:12]}")
            os.fsync(check)
        finally:
            os.close(check)

    def _publish(self, building: Path, change: ChangeSet) -> ChangeSet:
        with locked(self.lock_file):
            while (self._at / change.id).exists() or (self._at / change.id).is_symlink():
                change = dataclasses.replace(change, id=secrets.token_hex(6))
            write_durably(building / MANIFEST, _encode(change), mode=0o400)
            fsync_dir(building)
            os.rename(building, self._at / change.id)
            fsync_dir(self._at)
        return change

    def clean_stale(self) -> int:
        """Remove temporary folders whose process is gone (or that are a day old)."""
        removed = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self._at) as entries:
            for entry in entries:
                match = _TEMP.match(entry.name)
                if not match or not entry.is_dir(follow_symlinks=False):
                    continue
                age = time.time() - entry.stat(follow_symlinks=False).st_mtime
                if not pid_alive(int(match.group(1))) or age > _STALE_AFTER:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
        return removed

    # -- reading ---------------------------------------------------------------------

    def get(self, change_id: str) -> ChangeSet:
        """The change set ``change_id`` (its manifest, fully checked)."""
        folder = self.folder(change_id)
        try:
            fd = os.open(folder / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if folder.is_dir():
                raise ManifestError(
                    f"change set {change_id} has no {MANIFEST}; remove {self.root / change_id}"
                ) from None
            raise ChangeNotFound(change_id, self.root) from None
        except OSError as exc:
            raise ManifestError(
                f"cannot read the manifest of change set {change_id}: {exc.strerror}"
            ) from None
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(64 << 20)
        try:
            change = ChangeSet.from_dict(json.loads(raw))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(
                f"manifest of change set {change_id} is damaged ({exc}); inspect or remove "
                f"{self.root / change_id}"
            ) from None
        if change.id != change_id:
            shown = self.root / change_id
            raise ManifestError(f"manifest in {shown} names another id ({change.id})")
        return change

    def resolve(self, text: str) -> str:
        """Turn a full id, or a unique prefix of 4+ hex digits, into an id."""
        if isinstance(text, str) and ID.match(text):
            return text
        if not isinstance(text, str) or not _PREFIX.match(text):
            raise InvalidChangeId(str(text))
        matches = sorted(i for i in self._ids() if i.startswith(text))
        if not matches:
            raise ChangeNotFound(text, self.root)
        if len(matches) > 1:
            raise InvalidChangeId(text, f" on its own (it matches {', '.join(matches[:5])})")
        return matches[0]

    def _ids(self) -> builtins.list[str]:
        try:
            with os.scandir(self._at) as entries:
                return [
                    e.name for e in entries if ID.match(e.name) and e.is_dir(follow_symlinks=False)
                ]
        except FileNotFoundError:
            return []

    def list(self, status: str | Iterable[str] | None = None) -> builtins.list[ChangeSet]:
        """Every change set (optionally only those with ``status``), oldest first."""
        wanted = {status} if isinstance(status, str) else None if status is None else set(status)
        changes = [self.get(i) for i in self._ids()]
        changes = [c for c in changes if wanted is None or c.status in wanted]
        return sorted(changes, key=lambda c: (c.created_at, c.id))

    def conflicts(self, change_id: str) -> builtins.list[tuple[str, builtins.list[str]]]:
        """Other open change sets for the same target touching the same paths (or a parent)."""
        change = self.get(change_id)
        mine = set(change.paths)
        found = []
        for other in self.list(status=OPEN):
            if other.id == change.id or other.target != change.target:
                continue
            theirs = set(other.paths)
            clash = sorted(p for p in mine if any(_overlap(p, q) for q in theirs))
            if clash:
                found.append((other.id, clash))
        return found

    # -- changing --------------------------------------------------------------------

    def set_status(
        self, change_id: str, new: str, *, reason: str, expect: str | None = None
    ) -> ChangeSet:
        """Move ``change_id`` to ``new``; with ``expect``, only if it is ``expect`` now."""
        with locked(self._lock_for(change_id)):
            change = self.get(change_id)
            if expect is not None and change.status != expect:
                raise StatusConflict(
                    f"change set {change_id} is {change.status}, not {expect}: someone else "
                    "moved it first; look at it again with `orchestrator staged show`"
                )
            check_transition(change, new)
            step = StatusChange(new, _now(), reason)
            updated = dataclasses.replace(
                change,
                status=new,  # type: ignore[arg-type]  # checked by check_transition
                history=(*change.history, step),
            )
            self._rewrite(updated)
            return updated

    def record_scans(self, change_id: str, results: Iterable[ScanResult]) -> ChangeSet:
        """Store scanner results in the manifest (not once the change set is final)."""
        with locked(self._lock_for(change_id)):
            change = self.get(change_id)
            if change.status in FINAL:
                raise StagingError(f"change set {change_id} is {change.status}; scans are closed")
            updated = dataclasses.replace(change, scans=tuple(results))
            self._rewrite(updated)
            return updated

    def _lock_for(self, change_id: str) -> Path:
        self.folder(change_id)  # validates the id before anything is created
        self._ensure()
        return self.lock_file

    def _rewrite(self, change: ChangeSet) -> None:
        folder = self.folder(change.id)
        for stray in folder.glob(".manifest-*.tmp"):  # a crash mid-rewrite (we hold the lock)
            stray.unlink(missing_ok=True)
        temp = folder / f".manifest-{secrets.token_hex(4)}.tmp"
        try:
            write_durably(temp, _encode(change), mode=0o400)
            os.rename(temp, folder / MANIFEST)
        finally:
            temp.unlink(missing_ok=True)
        fsync_dir(folder)

    # -- checking --------------------------------------------------------------------

    def verify_blobs(self, change_id: str) -> ChangeSet:
        """Re-hash every blob of ``change_id``; raise :class:`BlobMismatch` on a difference."""
        change = self.get(change_id)
        for item in change.files:
            if item.sha256 is None:
                continue
            with self.open_blob(change_id, item.sha256) as blob:
                digest, size = _digest_fd(blob.fileno())
            if (digest, size) != (item.sha256, item.size):
                raise BlobMismatch(
                    f"change set {change_id}: the blob of {item.path} no longer matches its "
                    f"manifest (sha256 {digest[:12]}, {size} bytes; expected "
                    f"{item.sha256[:12]}, {item.size} bytes); it was altered: discard it"
                )
        return change


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")
