"""Timestamps and durations as the audit log writes and reads them.

Every timestamp in the log has one fixed-width form, ``2025-01-31T12:00:00.000000Z``
(UTC, microseconds, ``Z``). Because the width is fixed, two such strings compare in the
same order as the instants they name, which lets queries filter by time without parsing.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = [
    "TIMESTAMP_LENGTH",
    "as_utc",
    "format_timestamp",
    "parse_duration",
    "parse_time",
    "parse_timestamp",
    "utc_now",
]

#: Length of every timestamp the log writes.
TIMESTAMP_LENGTH = len("2025-01-31T12:00:00.000000Z")

_UNITS: dict[str, timedelta] = {
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_DURATION = re.compile(r"(?:\d+[smhdw])+")
_DURATION_PART = re.compile(r"(\d+)([smhdw])")


def utc_now() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """Return ``moment`` in UTC; a naive datetime is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def format_timestamp(moment: datetime) -> str:
    """Format ``moment`` in the log's fixed-width form (naive means UTC)."""
    if moment.tzinfo is not UTC:
        moment = as_utc(moment)
    return moment.isoformat(timespec="microseconds")[:-6] + "Z"  # drop "+00:00"


def parse_timestamp(text: str) -> datetime:
    """Parse an ISO 8601 timestamp into an aware UTC datetime (naive means UTC).

    Raises :class:`ValueError` when ``text`` is not ISO 8601.
    """
    return as_utc(datetime.fromisoformat(text.strip()))


def parse_duration(text: str) -> timedelta:
    """Parse a duration such as ``30s``, ``10m``, ``2h``, ``7d``, ``1w`` or ``1h30m``.

    Raises :class:`ValueError` naming the accepted forms when ``text`` is not one.
    """
    compact = text.strip().lower()
    if not _DURATION.fullmatch(compact):
        raise ValueError(
            f"'{text}' is not a duration; use a number and a unit (s, m, h, d, w), "
            "e.g. 10m, 2h, 7d or 1h30m"
        )
    total = timedelta()
    for amount, unit in _DURATION_PART.findall(compact):
        total += int(amount) * _UNITS[unit]
    return total


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """Parse a point in time: an ISO 8601 timestamp or a duration meaning "that long ago".

    ``2h`` is two hours before ``now`` (default: the current time). Raises
    :class:`ValueError` with the accepted forms when ``text`` is neither.
    """
    try:
        ago = parse_duration(text)
    except ValueError:
        pass
    else:
        return (utc_now() if now is None else as_utc(now)) - ago
    try:
        return parse_timestamp(text)
    except ValueError:
        raise ValueError(
            f"'{text}' is neither an ISO 8601 time (e.g. 2025-01-31T12:00:00Z) "
            "nor a duration ago (e.g. 10m, 2h, 7d)"
        ) from None
