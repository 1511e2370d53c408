"""One audit entry, its canonical encoding and the hash that chains it to the one before.

Each line of the log is one JSON object. Its ``hash`` is the SHA-256 (hex) of the
previous entry's hash followed by the entry's canonical JSON without ``hash``::

    hash = sha256(prev + json.dumps(entry_without_hash, sort_keys=True,
                                    separators=(",", ":"), ensure_ascii=False))

The first entry's ``prev`` is :data:`GENESIS_HASH` (64 zeros).

Every string is recorded through :func:`orchestrator.escaping.escape_surrogates` (the
redactor does it): a file name a worker made from bytes that are not UTF-8 reaches the host
as a string with a lone surrogate, which UTF-8 cannot carry, and is recorded with the text
``\\xff`` in its place. The line, its hash and a later verification all see that text.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.audit.timeutil import format_timestamp, parse_timestamp

__all__ = [
    "FIELDS",
    "GENESIS_HASH",
    "PRUNE_OPERATION",
    "AuditEntry",
    "canonical_json",
    "chain_hash",
    "decode_line",
    "encode_line",
    "is_anchor",
    "new_id",
]

#: ``prev`` of the first entry of a log that was never pruned.
GENESIS_HASH = "0" * 64

#: Operation of the anchor entry a prune writes at the head of the log.
PRUNE_OPERATION = "audit.pruned"

#: Every key of an entry, in the order :meth:`AuditEntry.to_dict` produces them.
FIELDS = (
    "id",
    "timestamp",
    "operation",
    "allowed",
    "reason",
    "worker",
    "run_id",
    "session_id",
    "trust_level",
    "zone",
    "path",
    "metadata",
    "prev",
    "hash",
)

_HEX = frozenset("0123456789abcdef")

# One encoder for every call: json.dumps would build a new one each time.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def new_id() -> str:
    """Return a random UUID 4 as 32 hex digits (the same as ``uuid.uuid4().hex``)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


def canonical_json(obj: Mapping[str, Any]) -> str:
    """Serialise ``obj`` in the canonical form the hash is computed over.

    That is ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``.
    """
    return _CANONICAL.encode(obj)


def chain_hash(record: Mapping[str, Any]) -> str:
    """Return the hash ``record`` must carry, given its ``prev`` and other keys.

    A ``hash`` key in ``record`` is ignored.
    """
    body = {key: value for key, value in record.items() if key != "hash"}
    text = str(body.get("prev", "")) + canonical_json(body)
    # A line edited to hold a "\\udcff" escape parses to a lone surrogate: hash it anyway,
    # so verification reports a mismatch instead of failing.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def encode_line(body: Mapping[str, Any]) -> tuple[bytes, str]:
    """Encode ``body`` (every key but ``hash``, ``prev`` included) as one log line.

    Returns the line, newline included, and the entry's hash. The line is the canonical
    JSON with ``hash`` appended as the last key.
    """
    text = canonical_json(body)
    digest = hashlib.sha256((str(body["prev"]) + text).encode("utf-8")).hexdigest()
    line = f'{text[:-1]},"hash":"{digest}"}}\n'  # body is never empty: it holds "prev"
    return line.encode("utf-8"), digest


def _is_hash(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def decode_line(raw: bytes) -> dict[str, Any]:
    """Parse one line into an entry record, checking its shape but not its hash.

    Raises :class:`ValueError` with a short reason when the line is not valid UTF-8 JSON,
    not an object, or lacks a well-formed ``prev``, ``hash`` or ``operation``.
    """
    try:
        record = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise ValueError("not valid JSON (a torn or damaged write)") from None
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if not _is_hash(record.get("hash")):
        raise ValueError("no valid 'hash' field")
    if not _is_hash(record.get("prev")):
        raise ValueError("no valid 'prev' field")
    if not isinstance(record.get("operation"), str):
        raise ValueError("no 'operation' field")
    return record


def is_anchor(record: Mapping[str, Any]) -> bool:
    """Tell whether ``record`` is a prune anchor: see :mod:`orchestrator.audit.chain`."""
    metadata = record.get("metadata")
    return (
        record.get("operation") == PRUNE_OPERATION
        and record.get("prev") != GENESIS_HASH
        and isinstance(metadata, dict)
        and metadata.get("last_pruned_hash") == record.get("prev")
    )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One entry of the audit log, as written (secrets already redacted).

    ``timestamp`` is an aware UTC datetime; ``reason`` is set when ``allowed`` is false;
    ``prev`` and ``hash`` chain the entry to the one before it.
    """

    id: str
    timestamp: datetime
    operation: str
    allowed: bool
    reason: str | None = None
    worker: str | None = None
    run_id: str | None = None
    session_id: str | None = None
    trust_level: str | None = None
    zone: str | None = None
    path: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    prev: str = GENESIS_HASH
    hash: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return the entry as the JSON object the log holds (keys in :data:`FIELDS` order)."""
        return {
            "id": self.id,
            "timestamp": format_timestamp(self.timestamp),
            "operation": self.operation,
            "allowed": self.allowed,
            "reason": self.reason,
            "worker": self.worker,
            "run_id": self.run_id,
            "session_id": self.session_id,
            "trust_level": self.trust_level,
            "zone": self.zone,
            "path": self.path,
            "metadata": dict(self.metadata),
            "prev": self.prev,
            "hash": self.hash,
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> AuditEntry:
        """Build an entry from a parsed log line.

        Raises :class:`ValueError` (or :class:`KeyError`) when a required key is missing
        or malformed.
        """
        metadata = record.get("metadata")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise ValueError("'metadata' is not an object")
        allowed = record["allowed"]
        if not isinstance(allowed, bool):
            raise ValueError("'allowed' is not a boolean")
        return cls(
            id=str(record["id"]),
            timestamp=parse_timestamp(str(record["timestamp"])),
            operation=str(record["operation"]),
            allowed=allowed,
            reason=_optional_str(record.get("reason")),
            worker=_optional_str(record.get("worker")),
            run_id=_optional_str(record.get("run_id")),
            session_id=_optional_str(record.get("session_id")),
            trust_level=_optional_str(record.get("trust_level")),
            zone=_optional_str(record.get("zone")),
            path=_optional_str(record.get("path")),
            metadata=metadata,
            prev=str(record["prev"]),
            hash=str(record["hash"]),
        )

    def expected_hash(self) -> str:
        """Recompute the hash this entry should carry from its other fields."""
        return chain_hash(self.to_dict())
