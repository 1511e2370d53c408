"""What collection produces, and the rules both collectors share.

:class:`BlobSink` copies untrusted content into a private temporary folder, hashing it on
the way and stopping one byte past a cap; blobs are named by their SHA-256, so the folder
never holds anything else. :class:`Intake` applies the rules common to tar streams and
folders (names, suffixes, duplicates, counts, per-file and total caps) and records each
refused entry as a :class:`Rejection` instead of failing the whole collection.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from orchestrator.config.models import OutboxLimits
from orchestrator.staging.errors import CollectionError
from orchestrator.staging.names import UnsafeName, safe_path, suffix_allowed

__all__ = ["CHUNK", "STREAM", "BlobSink", "Collected", "CollectedFile", "Intake", "Rejection"]

#: Bytes read and written at a time.
CHUNK = 1 << 20
#: The path a rejection carries when it concerns the stream or folder as a whole.
STREAM = "(stream)"

Operation = Literal["create", "update", "delete"]
Reader = Callable[[int], bytes]


@dataclass(frozen=True)
class Rejection:
    """An entry that was not collected: ``path`` is printable (``\\xNN`` escapes)."""

    path: str
    reason: str


@dataclass(frozen=True)
class CollectedFile:
    """One accepted file, or a deletion (``sha256``, ``mode`` and ``blob`` are then None).

    ``base_sha256`` is the content the change was computed against (``update`` and
    ``delete`` from :func:`collect_dir` with a base), so applying it can check the target
    has not changed since.
    """

    path: str
    operation: Operation
    size: int
    sha256: str | None
    mode: int | None
    blob: Path | None
    base_sha256: str | None = None


@dataclass
class Collected:
    """The outcome of one collection: accepted files, rejections, and the blob folder.

    The blob folder is temporary: hand the result to :meth:`ChangeStore.create` and then
    :meth:`cleanup` it (or use ``with collect_...(...) as collected:``).
    """

    files: list[CollectedFile]
    rejected: list[Rejection]
    blob_dir: Path
    truncated: bool = False
    """True when part of the input was not examined (a cut stream, too many entries)."""
    unchanged: int = 0
    """Files equal to their base (``collect_dir`` with a base): not in ``files``."""

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def cleanup(self) -> None:
        """Remove the temporary blob folder (the store keeps its own copies)."""
        shutil.rmtree(self.blob_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


class SourceFailed(Exception):
    """Reading the untrusted source failed (a cut stream, an I/O error): not our fault."""


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class BlobSink:
    """A private temporary folder of blobs named by SHA-256."""

    def __init__(self, tmp_dir: Path | None = None) -> None:
        try:
            self.folder = Path(tempfile.mkdtemp(prefix="orchestrator-blobs-", dir=tmp_dir))
        except OSError as exc:
            where = tmp_dir or tempfile.gettempdir()
            raise CollectionError(
                f"cannot create a blob folder in {where}: {exc.strerror}; "
                "make it writable or pass another tmp_dir"
            ) from None
        self._parts = itertools.count()

    def path(self, sha256: str) -> Path:
        return self.folder / sha256

    def digest(self, read: Reader, cap: int) -> tuple[str, int] | None:
        """Hash what ``read`` gives, without keeping it; None past ``cap`` bytes."""
        return self._pump(read, cap, None)

    @staticmethod
    def digest_fd(fd: int) -> str:
        """Hash everything ``fd`` holds from its current offset (trusted input only)."""
        digest = hashlib.sha256()
        while data := os.read(fd, CHUNK):
            digest.update(data)
        return digest.hexdigest()

    def write(self, read: Reader, cap: int) -> tuple[str, int] | None:
        """Store what ``read`` gives as a blob; None (nothing kept) past ``cap`` bytes."""
        part = self.folder / f".part-{next(self._parts)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        kept = False
        try:
            fd = os.open(part, flags, 0o600)
            try:
                result = self._pump(read, cap, fd)
            finally:
                os.close(fd)
            if result is None:
                return None
            final = self.path(result[0])
            if final.exists():
                return result  # the same content is already here
            os.rename(part, final)
            kept = True
            return result
        except OSError as exc:
            raise CollectionError(
                f"cannot write a blob in {self.folder}: {exc.strerror}; check that filesystem "
                "(free space, permissions) or collect into another tmp_dir"
            ) from None
        finally:
            if not kept:
                part.unlink(missing_ok=True)

    @staticmethod
    def _pump(read: Reader, cap: int, fd: int | None) -> tuple[str, int] | None:
        digest = hashlib.sha256()
        size = 0
        while True:
            try:
                data = read(min(CHUNK, cap + 1 - size))
            except Exception as exc:
                raise SourceFailed(str(exc) or type(exc).__name__) from exc
            if not data:
                return digest.hexdigest(), size
            size += len(data)
            if size > cap:
                return None
            digest.update(data)
            if fd is not None:
                _write_all(fd, data)

    def prune(self, keep: set[str]) -> None:
        """Delete blobs no accepted file refers to (left by a later-refused duplicate)."""
        for entry in os.scandir(self.folder):
            if entry.name not in keep:
                os.unlink(entry.path)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class Intake:
    """The rules shared by both collectors, and what they have accepted so far."""

    limits: OutboxLimits
    suffixes: list[str] | tuple[str, ...] | None
    sink: BlobSink
    files: dict[str, CollectedFile] = field(default_factory=dict)
    rejected: list[Rejection] = field(default_factory=list)
    total: int = 0
    entries: int = 0
    folders: int = 0
    unchanged: int = 0
    stopped: bool = False
    _kinds: dict[str, str] = field(default_factory=dict)
    _duplicated: set[str] = field(default_factory=set)

    def reject(self, shown: str, reason: str) -> None:
        self.rejected.append(Rejection(shown, reason))

    def count(self, shown: str, *, folder: bool = False) -> bool:
        """Count one entry; past ``max_files``, record it, stop, and return False."""
        limit = self.limits.max_files
        if folder:
            self.folders += 1
            over = self.folders > limit
        else:
            self.entries += 1
            over = self.entries > limit
        if over:
            what = "folders" if folder else "entries"
            self.reject(shown, f"more than {limit} {what}: this and every later entry were skipped")
            self.stopped = True
        return not over

    def name(self, raw: str, shown: str, *, suffix: bool = True) -> str | None:
        """The normalised path for ``raw``, or None after recording why it is refused."""
        try:
            path = safe_path(raw)
        except UnsafeName as exc:
            self.reject(shown, str(exc))
            return None
        if suffix and not suffix_allowed(path, self.suffixes):
            allowed = ", ".join(self.suffixes or ())
            self.reject(shown, f"suffix not allowed here (allowed: {allowed})")
            return None
        return path

    def place(self, path: str, shown: str, *, folder: bool = False) -> bool:
        """Claim ``path``; refuse duplicates and names that are both a file and a folder."""
        kind = "folder" if folder else "file"
        seen = self._kinds.get(path)
        if path in self._duplicated or (seen == "file" and not folder):
            self._duplicated.add(path)
            earlier = self.files.pop(path, None)
            if earlier is not None:
                self.total -= earlier.size
                self.reject(shown, "duplicate name: no copy of it is kept")
            self.reject(shown, "duplicate name: no copy of it is kept")
            return False
        if seen is not None and seen != kind:
            self.reject(shown, "this name is both a file and a folder")
            return False
        parts = path.split("/")
        ancestors = ["/".join(parts[:n]) for n in range(1, len(parts))]
        for ancestor in ancestors:
            if self._kinds.get(ancestor) == "file":
                self.reject(shown, f"its folder '{ancestor}' is a file")
                return False
        for ancestor in ancestors:
            self._kinds[ancestor] = "folder"
        self._kinds[path] = kind
        return True

    def over(self, size: int) -> str | None:
        """Why a file of ``size`` bytes cannot be accepted now, or None."""
        if size > self.limits.max_file_size:
            return f"larger than the per-file cap of {self.limits.max_file_size} bytes"
        if self.total + size > self.limits.size:
            return (
                f"would bring the total over the cap of {self.limits.size} bytes "
                f"({self.total} already collected)"
            )
        return None

    def cap(self) -> int:
        """The most bytes the next file may have."""
        return min(self.limits.max_file_size, self.limits.size - self.total)

    def accept(self, collected: CollectedFile) -> None:
        self.files[collected.path] = collected
        self.total += collected.size

    def finish(self, *, truncated: bool = False) -> Collected:
        self.sink.prune({f.sha256 for f in self.files.values() if f.sha256})
        return Collected(
            files=[self.files[path] for path in sorted(self.files)],
            rejected=list(self.rejected),
            blob_dir=self.sink.folder,
            truncated=truncated or self.stopped,
            unchanged=self.unchanged,
        )
