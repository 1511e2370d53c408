"""Selecting entries: :class:`AuditFilter` and the fast line matcher behind queries.

A query over a large log must not parse every line. :class:`LineMatcher` first looks,
in a whole block of lines at once, for a value the filter asks for as it would be
written (``"run-42"`` with its quotes; ``false`` for denials): most lines do not hold
it and are never looked at again. A filter on time alone uses a regular expression
that matches only the fixed-width timestamps within bounds (the log's timestamps sort
as strings), plus any timestamp in another form. Only the lines found are parsed and
checked field by field, so every criterion is exact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.audit.entry import AuditEntry, decode_line
from orchestrator.audit.files import select_lines, select_lines_reverse
from orchestrator.audit.timeutil import TIMESTAMP_LENGTH, format_timestamp, parse_timestamp
from orchestrator.escaping import escape_surrogates

__all__ = ["AuditFilter", "LineMatcher"]

# Filter attribute -> entry key, for the filters that compare one string field.
_FIELD_FILTERS = (
    ("session", "session_id"),
    ("run", "run_id"),
    ("zone", "zone"),
    ("trust", "trust_level"),
)


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which entries a query returns. Unset criteria match everything.

    ``session``, ``run``, ``zone`` and ``trust`` must equal the entry's ``session_id``,
    ``run_id``, ``zone`` and ``trust_level``. ``operation`` is an exact name, or a prefix
    followed by ``*`` (``run.*`` matches ``run.started`` and ``run.ended``).
    ``denied_only`` keeps entries with ``allowed`` false. ``since`` is inclusive and
    ``until`` exclusive (naive datetimes are UTC). ``limit`` keeps the most recent N.
    """

    session: str | None = None
    run: str | None = None
    operation: str | None = None
    zone: str | None = None
    trust: str | None = None
    denied_only: bool = False
    since: datetime | None = None
    until: datetime | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        """Reject a negative limit."""
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit must be 0 or more, not {self.limit}")

    def matches(self, entry: AuditEntry) -> bool:
        """Tell whether ``entry`` meets every criterion (``limit`` aside)."""
        return LineMatcher(self).matches_record(entry.to_dict())


def _json_string(value: str) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


class LineMatcher:
    """Match raw log lines against one :class:`AuditFilter`."""

    def __init__(self, flt: AuditFilter) -> None:
        """Prepare the substring checks and field comparisons for ``flt``."""
        self._fields: list[tuple[str, str]] = []
        needles: list[bytes] = []
        for attribute, key in _FIELD_FILTERS:
            wanted = getattr(flt, attribute)
            if wanted is not None:
                wanted = escape_surrogates(wanted)  # as the log records it
                self._fields.append((key, wanted))
                needles.append(_json_string(wanted))
        self._operation: str | None = None
        self._operation_prefix: str | None = None
        if flt.operation is not None:
            operation = escape_surrogates(flt.operation)
            if operation.endswith("*"):
                self._operation_prefix = operation[:-1]
                needles.append(_json_string(self._operation_prefix)[:-1])  # no closing quote
            else:
                self._operation = operation
                needles.append(_json_string(operation))
        self._denied_only = flt.denied_only
        if flt.denied_only:
            needles.append(b"false")
        # Longest first: the rarest substring most likely rejects the line soonest.
        self._needles = tuple(sorted(needles, key=len, reverse=True))
        self._since = None if flt.since is None else format_timestamp(flt.since)
        self._until = None if flt.until is None else format_timestamp(flt.until)
        self._time_pattern = _time_pattern(self._since, self._until)

    @property
    def needle(self) -> bytes | None:
        """A substring every matching line holds (None when the filter names none).

        Readers search whole blocks for it and hand :meth:`match` only the lines that
        hold it.
        """
        return self._needles[0] if self._needles else None

    def candidates(self, chunk: bytes, *, reverse: bool = False) -> Iterable[bytes]:
        """Return the lines of ``chunk`` that may match, in order (or last first).

        Cheap checks only: the filter's rarest substring, or else a pattern for the
        timestamps within bounds, searched in the whole chunk at once. Each line returned
        still has to pass :meth:`match`.
        """
        if self.needle is not None or self._time_pattern is None:
            select = select_lines_reverse if reverse else select_lines
            return select(chunk, self.needle)
        assert self._time_pattern is not None
        kept = list(select_lines(chunk, None, self._time_pattern))
        if reverse:
            kept.reverse()
        return kept

    def match(self, raw: bytes) -> AuditEntry | None:
        """Return the entry on line ``raw`` if it matches; None otherwise or if damaged."""
        for needle in self._needles:
            if needle not in raw:
                return None
        try:
            record = decode_line(raw)
            if not self.matches_record(record):
                return None
            return AuditEntry.from_dict(record)
        except (ValueError, KeyError, TypeError):
            return None

    def matches_record(self, record: Mapping[str, Any]) -> bool:
        """Tell whether a parsed record meets every criterion."""
        for key, wanted in self._fields:
            if record.get(key) != wanted:
                return False
        operation = record.get("operation")
        if self._operation is not None and operation != self._operation:
            return False
        if self._operation_prefix is not None and not (
            isinstance(operation, str) and operation.startswith(self._operation_prefix)
        ):
            return False
        if self._denied_only and record.get("allowed") is not False:
            return False
        if self._since is not None or self._until is not None:
            stamp = _comparable_timestamp(record.get("timestamp"))
            if stamp is None:
                return False
            if self._since is not None and stamp < self._since:
                return False
            if self._until is not None and stamp >= self._until:
                return False
        return True


# A timestamp key, and the log's own fixed-width form of its value (closing quote included).
_STAMP_KEY = rb'"timestamp"[ \t]*:[ \t]*"'
_FIXED_STAMP = rb'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"'


def _after(bound: bytes) -> bytes:
    """A regex for the strings as long as ``bound`` that sort at or after it, then ``"``.

    Nested so the engine walks it once: the same byte and the rest at or after the rest
    of ``bound``, or a greater byte and anything.
    """
    if not bound:
        return b'"'
    rest = rb'[^"\n]{%d}"' % (len(bound) - 1)
    greater = rb"|[\x%02x-\xff]%s" % (bound[0] + 1, rest) if bound[0] < 0xFF else b""
    return rb"(?:\x%02x%s%s)" % (bound[0], _after(bound[1:]), greater)


def _before(bound: bytes) -> bytes:
    """A regex for the strings as long as ``bound`` that sort strictly before it, then ``"``."""
    if not bound:
        return b"(?!)"  # equal is not before
    rest = rb'[^"\n]{%d}"' % (len(bound) - 1)
    lower = rb"|[\x00-\x%02x]%s" % (bound[0] - 1, rest) if bound[0] else b""
    return rb"(?:\x%02x%s%s)" % (bound[0], _before(bound[1:]), lower)


def _time_pattern(since: str | None, until: str | None) -> re.Pattern[bytes] | None:
    """Compile a regex finding the timestamps that may lie within [since, until).

    It matches a timestamp in the log's fixed-width form only when it is within bounds,
    and a timestamp in any other form always (those are compared after parsing). A
    nested ``timestamp`` key in metadata may add a candidate, never remove one.
    """
    if since is None and until is None:
        return None
    within = b""
    if since is not None and until is not None:
        within = b"(?=%s)%s" % (_after(since.encode()), _before(until.encode()))
    elif since is not None:
        within = _after(since.encode())
    elif until is not None:
        within = _before(until.encode())
    return re.compile(b"%s(?:(?!%s)|%s)" % (_STAMP_KEY, _FIXED_STAMP, within))


def _comparable_timestamp(value: object) -> str | None:
    """Return ``value`` in the log's fixed-width form, or None when it is no timestamp."""
    if not isinstance(value, str):
        return None
    if len(value) == TIMESTAMP_LENGTH and value.endswith("Z") and value[10:11] == "T":
        return value
    try:
        return format_timestamp(parse_timestamp(value))
    except ValueError:
        return None
