"""E2B's wire shapes, pure: its REST error body, Connect RPC's JSON envelopes and errors,
and the file entries the filesystem service answers with (no I/O, no engine)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ENVD_VERSION",
    "ConnectFailure",
    "Entry",
    "api_error",
    "connect_status",
    "end_frame",
    "frame",
    "parse_entries",
    "unframe",
]

#: The envd version the sandboxes report: the SDK picks its calls by it (0.5.7: the
#: default user is the sandbox's, uploads may be raw bodies).
ENVD_VERSION = "0.5.7"

#: Connect's codes, and the HTTP status of each for a unary call's error.
_HTTP_OF = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "unauthenticated": 401,
}


class ConnectFailure(Exception):
    """A Connect RPC's failure, with its code (one of :data:`_HTTP_OF`'s)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def api_error(status: int, message: str) -> dict[str, Any]:
    """E2B's REST error body (its SDK reads ``message``)."""
    return {"code": status, "message": message}


def connect_status(code: str) -> int:
    """The HTTP status of a unary Connect error with ``code``."""
    return _HTTP_OF.get(code, 500)


def connect_error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


def frame(message: dict[str, Any], flags: int = 0) -> bytes:
    """One message of a Connect stream: a flag byte, the length, the JSON."""
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_frame(failure: ConnectFailure | None = None) -> bytes:
    """The end of a Connect stream (flag 2), with its error if it failed."""
    body: dict[str, Any] = {}
    if failure is not None:
        body["error"] = connect_error(failure.code, failure.message)
    return frame(body, flags=2)


def unframe(body: bytes) -> Iterator[dict[str, Any]]:
    """The JSON messages of a Connect streaming request's body."""
    at = 0
    while at < len(body):
        if len(body) - at < 5:
            raise ConnectFailure("invalid_argument", "a truncated Connect envelope")
        flags, size = struct.unpack(">BI", body[at : at + 5])
        data = body[at + 5 : at + 5 + size]
        if len(data) != size:
            raise ConnectFailure("invalid_argument", "a truncated Connect envelope")
        at += 5 + size
        if flags & 2:
            return
        if flags & 1:
            raise ConnectFailure("invalid_argument", "compressed messages are not accepted")
        yield message_of(data)


def message_of(data: bytes) -> dict[str, Any]:
    """A request message (a JSON object), or invalid_argument."""
    try:
        value = json.loads(data or b"{}")
    except ValueError:
        raise ConnectFailure("invalid_argument", "the request is not JSON") from None
    if not isinstance(value, dict):
        raise ConnectFailure("invalid_argument", "the request is not a JSON object")
    return value


@dataclass(frozen=True)
class Entry:
    """A file or folder as the filesystem service describes it (``filesystem.EntryInfo``)."""

    kind: str  # find's %y: f, d, l, ...
    size: int
    mode: int
    owner: str
    group: str
    mtime: float
    target: str
    path: str

    def to_json(self) -> dict[str, Any]:
        kinds = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY"}
        stamp = datetime.fromtimestamp(self.mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        out: dict[str, Any] = {
            "name": self.path.rstrip("/").rsplit("/", 1)[-1] or "/",
            "type": kinds.get(self.kind, "FILE_TYPE_UNSPECIFIED"),
            "path": self.path,
            "size": str(self.size),
            "mode": self.mode,
            "permissions": _permissions(self.kind, self.mode),
            "owner": self.owner,
            "group": self.group,
            "modifiedTime": stamp,
        }
        if self.kind == "l":
            out["symlinkTarget"] = self.target
            out["isSymlink"] = True
        return out


def _permissions(kind: str, mode: int) -> str:
    letters = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return ("d" if kind == "d" else "l" if kind == "l" else "-") + letters


#: find's -printf format for :func:`parse_entries` (one record per NUL).
FIND_FORMAT = r"%y\t%s\t%m\t%u\t%g\t%T@\t%l\t%p\0"


def parse_entries(output: bytes) -> list[Entry]:
    """The records find printed with :data:`FIND_FORMAT`."""
    entries = []
    for record in output.split(b"\0"):
        if not record:
            continue
        fields = record.decode("utf-8", errors="replace").split("\t", 7)
        if len(fields) != 8:
            continue
        kind, size, mode, owner, group, mtime, target, path = fields
        entries.append(
            Entry(kind, int(size), int(mode, 8), owner, group, float(mtime), target, path)
        )
    return entries
