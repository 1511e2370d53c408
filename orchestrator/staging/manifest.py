"""Change sets as data: the manifest, its status machine, and strict (de)serialisation.

A manifest is read back with the same suspicion it was written with: every field is type
checked and every path is checked again with :func:`~.names.safe_path`, so a hand-edited
or damaged manifest is refused instead of steering clearance somewhere unexpected.

Status machine::

    pending ──> approved ──> committed   (repo target)
       │           │    └──> applied     (zone target)
       │           └──> rejected | discarded
       └──> rejected | discarded | committed | applied   (clearance approves by itself)

``rejected``, ``discarded``, ``committed`` and ``applied`` are final.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast, get_args

from orchestrator.config.models import ZONE_NAME
from orchestrator.staging.collected import Operation, Rejection
from orchestrator.staging.errors import InvalidChangeId, TransitionError
from orchestrator.staging.names import UnsafeName, safe_path

__all__ = [
    "FINAL",
    "FORMAT",
    "OPEN",
    "ChangeFile",
    "ChangeMeta",
    "ChangeSet",
    "ChangeTarget",
    "Finding",
    "ScanResult",
    "Status",
    "StatusChange",
    "check_id",
    "check_transition",
]

FORMAT = 1
Status = Literal["pending", "approved", "rejected", "discarded", "committed", "applied"]
STATUSES: tuple[str, ...] = get_args(Status)
OPEN = frozenset({"pending", "approved"})
FINAL = frozenset({"rejected", "discarded", "committed", "applied"})
_NEXT = {
    "pending": frozenset({"approved", "rejected", "discarded", "committed", "applied"}),
    "approved": frozenset({"committed", "applied", "rejected", "discarded"}),
}
ID = re.compile(r"^[0-9a-f]{12}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MODES = {"0644": 0o644, "0755": 0o755}


def check_id(value: str) -> str:
    """Return ``value`` when it is a well-formed change set id, else raise."""
    if not isinstance(value, str) or not ID.match(value):
        raise InvalidChangeId(str(value))
    return value


def check_transition(change: ChangeSet, new: str) -> None:
    """Raise :class:`TransitionError` unless ``change`` may move to status ``new``."""
    if new not in STATUSES:
        raise TransitionError(f"'{new}' is not a status; use one of {', '.join(STATUSES)}")
    if new not in _NEXT.get(change.status, frozenset()):
        final = " (a final status)" if change.status in FINAL else ""
        raise TransitionError(
            f"change set {change.id} is {change.status}{final}; it cannot become {new}"
        )
    wanted = {"committed": "repo", "applied": "zone"}.get(new)
    if wanted is not None and change.target.kind != wanted:
        raise TransitionError(
            f"change set {change.id} targets {change.target}; only a {wanted} target can "
            f"become {new} (use {'applied' if new == 'committed' else 'committed'})"
        )


@dataclass(frozen=True)
class ChangeTarget:
    """Where a change set goes: the project's repo, or one zone."""

    kind: Literal["repo", "zone"]
    name: str | None = None

    def __post_init__(self) -> None:
        if self.kind == "repo" and self.name is not None:
            raise ValueError("a repo target has no name")
        if self.kind == "zone" and not (isinstance(self.name, str) and ZONE_NAME.match(self.name)):
            raise ValueError(f"zone target name {self.name!r} is not a zone name")
        if self.kind not in ("repo", "zone"):
            raise ValueError(f"target kind {self.kind!r} must be 'repo' or 'zone'")

    @classmethod
    def repo(cls) -> ChangeTarget:
        return cls("repo")

    @classmethod
    def zone(cls, name: str) -> ChangeTarget:
        return cls("zone", name)

    def __str__(self) -> str:
        return "repo" if self.kind == "repo" else f"zone {self.name}"

    def to_dict(self) -> dict[str, str]:
        return {"kind": "repo"} if self.kind == "repo" else {"kind": "zone", "name": str(self.name)}


@dataclass(frozen=True)
class ChangeMeta:
    """Who produced a change set and where it goes (given by the runtime, not the worker)."""

    worker: str
    trust: str
    target: ChangeTarget
    run_id: str | None = None
    session_id: str | None = None
    message: str = ""


@dataclass(frozen=True)
class ChangeFile:
    """One file of a change set. ``sha256``/``mode`` are None for a ``delete``."""

    path: str
    operation: Operation
    size: int
    sha256: str | None
    mode: int | None
    base_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        mode = None if self.mode is None else f"{self.mode:04o}"
        return {**asdict(self), "mode": mode}


@dataclass(frozen=True)
class Finding:
    """Something a scanner noticed in one file (``path`` empty: the change set as a whole)."""

    path: str
    message: str


@dataclass(frozen=True)
class ScanResult:
    """One scanner's verdict: ``ok`` False blocks clearance unless overridden."""

    name: str
    ok: bool
    findings: tuple[Finding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "findings": [asdict(f) for f in self.findings]}


@dataclass(frozen=True)
class StatusChange:
    """One step of a change set's history."""

    status: str
    at: str
    reason: str


@dataclass(frozen=True)
class ChangeSet:
    """A change set as its manifest describes it."""

    id: str
    worker: str
    run_id: str | None
    session_id: str | None
    trust: str
    target: ChangeTarget
    message: str
    created_at: str
    status: Status
    files: tuple[ChangeFile, ...]
    rejected: tuple[Rejection, ...] = ()
    truncated: bool = False
    scans: tuple[ScanResult, ...] | None = None
    history: tuple[StatusChange, ...] = field(default=())

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "id": self.id,
            "worker": self.worker,
            "run_id": self.run_id,
            "session_id": self.session_id,
            "trust": self.trust,
            "target": self.target.to_dict(),
            "message": self.message,
            "created_at": self.created_at,
            "status": self.status,
            "files": [f.to_dict() for f in self.files],
            "rejected": [asdict(r) for r in self.rejected],
            "truncated": self.truncated,
            "scans": None if self.scans is None else [s.to_dict() for s in self.scans],
            "history": [asdict(h) for h in self.history],
        }

    @classmethod
    def from_dict(cls, data: object) -> ChangeSet:
        """Parse a manifest, checking every field; raises ``ValueError`` naming the field."""
        top = _map(data, "manifest")
        if top.get("format") != FORMAT:
            raise ValueError(f"format is {top.get('format')!r}, expected {FORMAT}")
        status = _str(top, "status")
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is unknown")
        target = _map(top.get("target"), "target")
        try:
            parsed_target = ChangeTarget(cast(Any, target.get("kind")), target.get("name"))
        except ValueError as exc:
            raise ValueError(f"target: {exc}") from None
        scans = top.get("scans")
        files = tuple(_file(f) for f in _list(top, "files"))
        if len({f.path for f in files}) != len(files):
            raise ValueError("files lists a path twice")
        return cls(
            id=check_id(_str(top, "id")),
            worker=_str(top, "worker"),
            run_id=_opt(top, "run_id"),
            session_id=_opt(top, "session_id"),
            trust=_str(top, "trust"),
            target=parsed_target,
            message=_str(top, "message"),
            created_at=_str(top, "created_at"),
            status=cast(Status, status),
            files=files,
            rejected=tuple(
                Rejection(_str(r, "path"), _str(r, "reason"))
                for r in map(_item, _list(top, "rejected"))
            ),
            truncated=_bool(top, "truncated"),
            scans=None if scans is None else tuple(_scan(s) for s in _list(top, "scans")),
            history=tuple(
                StatusChange(_str(h, "status"), _str(h, "at"), _str(h, "reason"))
                for h in map(_item, _list(top, "history"))
            ),
        )


def _map(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _item(value: object) -> dict[str, Any]:
    return _map(value, "a list item")


def _str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string")
    return value


def _opt(data: dict[str, Any], key: str) -> str | None:
    return None if data.get(key) is None else _str(data, key)


def _bool(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} is not true or false")
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise ValueError(f"{key} is not a list")
    return value


def _sha(data: dict[str, Any], key: str) -> str | None:
    value = _opt(data, key)
    if value is not None and not _SHA256.match(value):
        raise ValueError(f"{key} {value!r} is not a sha256")
    return value


def _file(value: object) -> ChangeFile:
    data = _item(value)
    try:
        path = safe_path(_str(data, "path"))
    except UnsafeName as exc:
        raise ValueError(f"file path {data.get('path')!r}: {exc}") from None
    operation = _str(data, "operation")
    size = data.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"size of {path} is not a byte count")
    sha256, mode_text = _sha(data, "sha256"), _opt(data, "mode")
    if operation == "delete":
        if sha256 is not None or mode_text is not None:
            raise ValueError(f"delete of {path} carries content")
    elif operation in ("create", "update"):
        if sha256 is None or mode_text not in _MODES:
            raise ValueError(f"{operation} of {path} lacks a sha256 or a 0644/0755 mode")
    else:
        raise ValueError(f"operation {operation!r} of {path} is unknown")
    mode = None if mode_text is None else _MODES[mode_text]
    return ChangeFile(
        path, cast(Operation, operation), size, sha256, mode, _sha(data, "base_sha256")
    )


def _scan(value: object) -> ScanResult:
    data = _item(value)
    ok = data.get("ok")
    if not isinstance(ok, bool):
        raise ValueError("scan result 'ok' is not true or false")
    findings = tuple(
        Finding(_str(f, "path"), _str(f, "message")) for f in map(_item, _list(data, "findings"))
    )
    return ScanResult(_str(data, "name"), ok, findings)
