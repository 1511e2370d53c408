"""What collection produces, and the rules both collectors share.

:class:`Intake` applies the rules common to tar streams and folders (names, suffixes,
duplicates, counts, per-file and total caps) and records each refused entry as a
:class:`Rejection` instead of failing the whole collection. Blobs are written by
:class:`~.blobs.BlobSink`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from orchestrator.config.models import OutboxLimits
from orchestrator.staging.blobs import BlobSink, Stored
from orchestrator.staging.names import UnsafeName, safe_path, suffix_allowed

__all__ = ["STREAM", "Collected", "CollectedFile", "Intake", "Operation", "Rejection"]

#: The path a rejection carries when it concerns the stream or folder as a whole.
STREAM = "(stream)"

Operation = Literal["create", "update", "delete"]


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


@dataclass
class Intake:
    """The rules shared by both collectors, and what they have accepted so far."""

    limits: OutboxLimits
    suffixes: list[str] | tuple[str, ...] | None
    sink: BlobSink
    files: dict[str, CollectedFile] = field(default_factory=dict)
    total: int = 0
    entries: int = 0
    folders: int = 0
    stopped: bool = False
    unchanged: set[str] = field(default_factory=set)
    rejected: list[Rejection] = field(default_factory=list)
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

    def accept(self, collected: CollectedFile) -> None:
        self.files[collected.path] = collected
        self.total += collected.size

    def take(self, path: str, shown: str, operation: Operation, mode: int, stored: Stored) -> None:
        """Record the outcome of copying one file: accepted, unchanged, or refused."""
        if stored.unchanged:
            self.unchanged.add(path)
        elif stored.sha256 is None or stored.problem:
            self.reject(shown, stored.problem or "not collected")
        else:
            blob = self.sink.path(stored.sha256)
            sha256, base = stored.sha256, stored.base_sha256
            self.accept(CollectedFile(path, operation, stored.size, sha256, mode, blob, base))

    def finish(self, *, truncated: bool = False) -> Collected:
        files = sorted(self.files.values(), key=lambda f: f.path)
        self.sink.close()
        self.sink.prune({f.sha256 for f in files if f.sha256})
        return Collected(
            files=files,
            rejected=list(self.rejected),
            blob_dir=self.sink.folder,
            truncated=truncated or self.stopped,
            unchanged=len(self.unchanged),
        )
