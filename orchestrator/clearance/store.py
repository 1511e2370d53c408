"""What clearance needs from the change-set store and its scanners: typed Protocols.

Clearance depends on these, never on the staging package's classes, so it can be tested
with a tiny fake and the store can change shape behind them. A change set is read through
read-only properties with the types the staging package gives them (a mode is an ``int``,
never the manifest's ``"0644"`` text); the tests' fakes are type-checked against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "ChangeFile",
    "ChangeSet",
    "ChangeStore",
    "ChangeTarget",
    "FileChange",
    "ScanFinding",
    "Scanners",
    "file_changes",
    "status_of",
    "target_of",
]


class ChangeFile(Protocol):
    """One file of a change set, as the manifest lists it."""

    @property
    def path(self) -> str: ...
    @property
    def operation(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def sha256(self) -> str | None: ...
    @property
    def mode(self) -> int | None: ...
    @property
    def base_sha256(self) -> str | None: ...


class ChangeTarget(Protocol):
    """Where a change set goes: ``kind`` ``repo`` (no name) or ``zone`` (its name)."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str | None: ...


class ChangeSet(Protocol):
    """A change set's manifest."""

    @property
    def id(self) -> str: ...
    @property
    def worker(self) -> str: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def trust(self) -> str: ...
    @property
    def target(self) -> ChangeTarget: ...
    @property
    def message(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def files(self) -> Sequence[ChangeFile]: ...


@runtime_checkable
class ChangeStore(Protocol):
    """The store of change sets (``<sandbox root>/changes``)."""

    root: Path

    def get(self, change_id: str) -> ChangeSet: ...

    def set_status(
        self, change_id: str, new: str, *, reason: str, expect: str | None = None
    ) -> object:
        """Compare-and-set the status under the store's lock; raise when ``expect`` differs."""
        ...

    def verify_blobs(self, change_id: str) -> object:
        """Raise when a blob is missing or does not match its sha256."""
        ...

    def blob_path(self, change_id: str, sha256: str) -> Path: ...


class ScanFinding(Protocol):
    """One scanner result; shown to the person clearing with ``str()``."""

    def __str__(self) -> str: ...


class Scanners(Protocol):
    """Runs the content scanners over a change set and says which results block it."""

    def run(self, changeset: ChangeSet, store: ChangeStore) -> Sequence[ScanFinding]: ...

    def blocking(self, results: Sequence[ScanFinding]) -> Sequence[ScanFinding]: ...


@dataclass(frozen=True)
class FileChange:
    """A change-set file, normalised: a create/update carries content, a delete does not."""

    path: str
    operation: str
    size: int
    sha256: str | None
    mode: int | None
    base_sha256: str | None = None
    """The content the change was computed against (update and delete), when known."""

    @property
    def deletes(self) -> bool:
        return self.operation == "delete"


def status_of(changeset: ChangeSet) -> str:
    """The status (``pending``, ``approved``, ...)."""
    return changeset.status


def target_of(changeset: ChangeSet) -> tuple[str, str | None]:
    """``(kind, name)`` of the change set's target."""
    return changeset.target.kind, changeset.target.name


def _mode(value: int | None, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):  # None, or a manifest text
        raise ValueError(f"{path}: mode {value!r} is not 0644 or 0755")
    if value & 0o777 not in (0o644, 0o755) or value & ~0o100777:
        raise ValueError(f"{path}: mode {value:o} is not 0644 or 0755")
    return value & 0o777


def file_changes(changeset: ChangeSet) -> list[FileChange]:
    """The change set's files, checked for a known operation, a hash and a plain mode."""
    changes: list[FileChange] = []
    for entry in changeset.files:
        operation = entry.operation
        if operation not in ("create", "update", "delete"):
            raise ValueError(f"{entry.path}: unknown operation '{operation}'")
        base = entry.base_sha256
        if base is not None and not _is_digest(base):
            raise ValueError(f"{entry.path}: base_sha256 '{base}' is not a hex digest")
        if operation == "delete":
            changes.append(FileChange(entry.path, operation, 0, None, None, base))
            continue
        digest = entry.sha256
        if not _is_digest(digest):
            raise ValueError(f"{entry.path}: sha256 '{digest}' is not a hex digest")
        assert digest is not None
        mode = _mode(entry.mode, entry.path)
        changes.append(FileChange(entry.path, operation, int(entry.size), digest, mode, base))
    return changes


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")
