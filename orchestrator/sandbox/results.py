"""Typed results of the sandbox file API: plain frozen data, ready for JSON (``as_dict``)."""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.hostfs.entries import Kind

TruncatedBy = Literal["lines", "bytes"]


def as_dict(result: Any) -> dict[str, Any]:
    """A result as JSON-ready data (image bytes become base64 text under ``data``)."""
    data: dict[str, Any] = dataclasses.asdict(result)
    if isinstance(data.get("data"), bytes):
        data["data"] = base64.b64encode(data["data"]).decode("ascii")
    return data


@dataclass(frozen=True)
class TextContent:
    """Lines ``start_line`` .. ``start_line + line_count - 1`` (1-based) of a text file."""

    path: str
    text: str
    start_line: int
    line_count: int
    total_lines: int
    size: int
    truncated: bool
    truncated_by: TruncatedBy | None
    kind: Literal["text"] = "text"


@dataclass(frozen=True)
class ImageContent:
    """An image (PNG, JPEG, GIF or WebP, recognised by its first bytes), whole."""

    path: str
    data: bytes = dataclasses.field(repr=False)
    mime: str
    size: int
    kind: Literal["image"] = "image"


@dataclass(frozen=True)
class BinaryContent:
    """A file that is neither text nor a recognised image (or an image over the cap):
    its size and a plain sentence, never its content."""

    path: str
    size: int
    note: str
    mime: str | None = None
    kind: Literal["binary"] = "binary"


ReadResult = TextContent | ImageContent | BinaryContent


@dataclass(frozen=True)
class Entry:
    """One entry of a listing, as seen without following anything."""

    name: str
    path: str
    kind: Kind
    size: int | None = None


@dataclass(frozen=True)
class Listing:
    path: str
    entries: tuple[Entry, ...]
    truncated: bool = False


@dataclass(frozen=True)
class FileStat:
    """What is at a path (never following a link): kind, size, mode bits, modification time."""

    path: str
    kind: Kind
    size: int | None
    mode: int | None
    modified: float | None
    zone: str | None


@dataclass(frozen=True)
class WriteResult:
    path: str
    size: int
    """The file's size after the write."""
    written: int
    created: bool
    appended: bool
    zone: str
    review: bool = False
    """True when the zone's writes are reviewed (``approval.write: ask``): the file went to
    the run's private copy, and reaches the zone only when its change set is approved."""


@dataclass(frozen=True)
class DeleteResult:
    path: str
    kind: Kind
    removed: int
    """Entries removed (1 for a file; a folder counts everything in it, itself included)."""
    zone: str
    review: bool = False


@dataclass(frozen=True)
class Resolved:
    """Where a virtual path lives on the host. ``host_path`` is for display and logs only:
    opening it by name would follow whatever a worker planted meanwhile."""

    path: str
    zone: str
    relative: str
    host_path: str
    exists: bool
    kind: Kind | None
