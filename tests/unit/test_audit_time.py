"""Timestamps and durations for the audit log and its command line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.audit import parse_duration, parse_time
from orchestrator.audit.timeutil import (
    TIMESTAMP_LENGTH,
    format_timestamp,
    parse_timestamp,
    utc_now,
)

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
        ("1h30m", timedelta(minutes=90)),
        (" 2H ", timedelta(hours=2)),
        ("0s", timedelta(0)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "10", "m", "10x", "-1h", "1.5h", "2 h", "h2"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 10m"):
        parse_duration(text)


def test_parse_time_accepts_durations_ago_and_iso() -> None:
    assert parse_time("2h", now=NOW) == NOW - timedelta(hours=2)
    assert parse_time("2025-03-01T12:00:00Z") == NOW
    assert parse_time("2025-03-01T14:00:00+02:00") == NOW
    assert parse_time("2025-03-01T12:00:00") == NOW  # naive means UTC
    assert parse_time("2025-03-01") == datetime(2025, 3, 1, tzinfo=UTC)
    assert abs(parse_time("0s") - utc_now()) < timedelta(seconds=5)


def test_parse_time_rejects_other_text() -> None:
    with pytest.raises(ValueError, match="neither an ISO 8601 time"):
        parse_time("yesterday")


def test_format_timestamp_is_fixed_width_utc() -> None:
    assert format_timestamp(NOW) == "2025-03-01T12:00:00.000000Z"
    other = datetime(2025, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert format_timestamp(other) == "2025-03-01T12:00:00.000000Z"
    assert format_timestamp(NOW.replace(tzinfo=None)) == "2025-03-01T12:00:00.000000Z"


@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))
def test_timestamps_round_trip_and_sort_as_strings(moment: datetime) -> None:
    text = format_timestamp(moment)
    assert len(text) == TIMESTAMP_LENGTH
    assert parse_timestamp(text) == moment
    later = moment + timedelta(microseconds=1)
    if later.year < 10000:
        assert format_timestamp(later) > text
