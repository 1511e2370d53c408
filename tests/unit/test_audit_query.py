"""AuditLog queries: each filter, limits, violations, export and the raw-line pre-check."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orchestrator.audit.log as audit_log_module
from orchestrator.audit import AuditEntry, AuditFilter, AuditLog
from orchestrator.audit.entry import GENESIS_HASH, encode_line
from orchestrator.audit.filters import LineMatcher, _after, _before
from orchestrator.audit.timeutil import format_timestamp

START = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

# (operation, allowed, session, run, zone, trust)
ROWS = [
    ("plan.compiled", True, "s1", None, None, "trusted"),
    ("run.started", True, "s1", "r1", "inbox", "untrusted"),
    ("policy.denied", False, "s1", "r1", "secrets", "untrusted"),
    ("run.ended", True, "s1", "r1", "inbox", "untrusted"),
    ("run.started", True, "s2", "r2", "outbox", "trusted"),
    ("policy.denied", False, "s2", "r2", "inbox", "trusted"),
    ("run.ended", True, "s2", "r2", "outbox", "trusted"),
    ("gc.removed", True, None, None, None, None),
]


class Clock:
    """A stand-in for utc_now: each call is one minute after the previous one."""

    def __init__(self, start: datetime) -> None:
        self.now = start - timedelta(minutes=1)

    def __call__(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(START)
    monkeypatch.setattr(audit_log_module, "utc_now", fake)
    return fake


@pytest.fixture
def log(tmp_path: Path, clock: Clock) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl")
    for operation, allowed, session, run, zone, trust in ROWS:
        log.record(
            operation,
            allowed=allowed,
            reason=None if allowed else f"{zone} not granted",
            session_id=session,
            run_id=run,
            zone=zone,
            trust_level=trust,
        )
    return log


def ops(entries: list[AuditEntry]) -> list[tuple[str, str | None]]:
    return [(entry.operation, entry.run_id) for entry in entries]


def test_no_filter_returns_everything_oldest_first(log: AuditLog) -> None:
    entries = log.query()
    assert len(entries) == len(ROWS)
    assert [entry.operation for entry in entries] == [row[0] for row in ROWS]
    assert entries == sorted(entries, key=lambda entry: entry.timestamp)
    assert log.query(AuditFilter()) == entries


def test_filter_by_session(log: AuditLog) -> None:
    entries = log.query(AuditFilter(session="s2"))
    assert [entry.session_id for entry in entries] == ["s2"] * 3


def test_filter_by_run(log: AuditLog) -> None:
    assert ops(log.query(AuditFilter(run="r1"))) == [
        ("run.started", "r1"),
        ("policy.denied", "r1"),
        ("run.ended", "r1"),
    ]
    assert log.query(AuditFilter(run="r")) == []  # equality, not a substring


def test_filter_by_exact_operation(log: AuditLog) -> None:
    assert ops(log.query(AuditFilter(operation="run.started"))) == [
        ("run.started", "r1"),
        ("run.started", "r2"),
    ]
    assert log.query(AuditFilter(operation="run")) == []


def test_filter_by_operation_prefix(log: AuditLog) -> None:
    names = [entry.operation for entry in log.query(AuditFilter(operation="run.*"))]
    assert names == ["run.started", "run.ended", "run.started", "run.ended"]
    assert len(log.query(AuditFilter(operation="*"))) == len(ROWS)


def test_filter_by_zone(log: AuditLog) -> None:
    assert ops(log.query(AuditFilter(zone="inbox"))) == [
        ("run.started", "r1"),
        ("run.ended", "r1"),
        ("policy.denied", "r2"),
    ]


def test_filter_by_trust(log: AuditLog) -> None:
    entries = log.query(AuditFilter(trust="trusted"))
    assert [entry.operation for entry in entries] == [
        "plan.compiled",
        "run.started",
        "policy.denied",
        "run.ended",
    ]


def test_filter_denied_only(log: AuditLog) -> None:
    entries = log.query(AuditFilter(denied_only=True))
    assert ops(entries) == [("policy.denied", "r1"), ("policy.denied", "r2")]
    assert all(not entry.allowed and entry.reason for entry in entries)


def test_filter_since_is_inclusive_and_until_exclusive(log: AuditLog) -> None:
    since = START + timedelta(minutes=2)
    until = START + timedelta(minutes=5)
    entries = log.query(AuditFilter(since=since, until=until))
    assert [entry.timestamp for entry in entries] == [
        START + timedelta(minutes=2),
        START + timedelta(minutes=3),
        START + timedelta(minutes=4),
    ]
    naive = log.query(AuditFilter(since=since.replace(tzinfo=None)))
    assert len(naive) == len(ROWS) - 2
    assert log.query(AuditFilter(until=START)) == []


def test_filters_combine(log: AuditLog) -> None:
    entries = log.query(AuditFilter(session="s1", denied_only=True, zone="secrets"))
    assert ops(entries) == [("policy.denied", "r1")]
    assert log.query(AuditFilter(session="s1", run="r2")) == []


def test_limit_keeps_the_most_recent(log: AuditLog) -> None:
    entries = log.query(AuditFilter(limit=3))
    assert [entry.operation for entry in entries] == ["policy.denied", "run.ended", "gc.removed"]
    assert entries == log.query()[-3:]
    assert log.query(AuditFilter(run="r1", limit=2)) == log.query(AuditFilter(run="r1"))[-2:]
    assert log.query(AuditFilter(limit=0)) == []
    assert log.query(AuditFilter(limit=100)) == log.query()
    with pytest.raises(ValueError, match="limit"):
        AuditFilter(limit=-1)


def test_violations_are_the_recent_denials(log: AuditLog) -> None:
    assert ops(log.violations()) == [("policy.denied", "r1"), ("policy.denied", "r2")]
    assert ops(log.violations(limit=1)) == [("policy.denied", "r2")]


def test_export_writes_a_json_array(log: AuditLog) -> None:
    out = io.StringIO()
    count = log.export(AuditFilter(run="r2"), out)
    data = json.loads(out.getvalue())
    assert count == len(data) == 3
    assert data == [entry.to_dict() for entry in log.query(AuditFilter(run="r2"))]
    empty = io.StringIO()
    assert log.export(AuditFilter(run="none"), empty) == 0
    assert json.loads(empty.getvalue()) == []


def test_filter_matches_an_entry_object(log: AuditLog) -> None:
    entry = log.query(AuditFilter(denied_only=True))[0]
    assert AuditFilter(run="r1", denied_only=True).matches(entry)
    assert not AuditFilter(run="r2").matches(entry)


def test_queries_skip_damaged_lines(log: AuditLog) -> None:
    with log.path.open("ab") as handle:
        handle.write(b'{"run_id":"r1", not json\n["r1"]\n\n')
    log.record("run.ended", run_id="r1")
    assert len(log.query(AuditFilter(run="r1"))) == 4
    with log.path.open("ab") as handle:
        handle.write(b'{"allowed":false,"run_id":"r1"')  # a torn write at the end
    assert len(log.query(AuditFilter(run="r1", denied_only=True))) == 1
    assert len(log.query(AuditFilter(run="r1", limit=10))) == 4


def test_times_in_other_iso_forms_are_compared_as_times(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    line, _ = encode_line(
        {
            "id": "x",
            "timestamp": "2025-03-01T14:00:00+02:00",  # 12:00 UTC
            "operation": "run.started",
            "allowed": True,
            "metadata": {},
            "prev": GENESIS_HASH,
        }
    )
    path.write_bytes(line)
    log = AuditLog(path)
    assert len(log.query(AuditFilter(since=START))) == 1
    assert log.query(AuditFilter(since=START + timedelta(seconds=1))) == []
    assert log.query(AuditFilter(until=START)) == []


# -- the raw-line pre-check never drops a match -----------------------------------------

VALUES = st.one_of(
    st.none(),
    st.sampled_from(["r1", "r10", 'q"uote', "back\\slash", "ünï", "false", "run.x"]),
    st.text(max_size=6),
)
FILTER_VALUES = st.one_of(st.none(), st.sampled_from(["r1", 'q"uote', "back\\slash", "ünï"]))


@given(
    session=VALUES,
    run=VALUES,
    zone=VALUES,
    trust=VALUES,
    operation=st.sampled_from(["run.started", "run.x", "policy.denied", "ünï"]),
    allowed=st.booleans(),
    metadata=st.dictionaries(st.text(max_size=5), VALUES, max_size=3),
    flt=st.builds(
        AuditFilter,
        session=FILTER_VALUES,
        run=FILTER_VALUES,
        zone=FILTER_VALUES,
        trust=FILTER_VALUES,
        operation=st.one_of(st.none(), st.sampled_from(["run.*", "run.x", "ünï", "policy.*"])),
        denied_only=st.booleans(),
    ),
)
@settings(max_examples=400)
def test_line_matcher_agrees_with_a_plain_comparison(
    session: str | None,
    run: str | None,
    zone: str | None,
    trust: str | None,
    operation: str,
    allowed: bool,
    metadata: dict[str, object],
    flt: AuditFilter,
) -> None:
    body = {
        "id": "0" * 32,
        "timestamp": "2025-03-01T12:00:00.000000Z",
        "operation": operation,
        "allowed": allowed,
        "reason": None,
        "worker": None,
        "run_id": run,
        "session_id": session,
        "trust_level": trust,
        "zone": zone,
        "path": None,
        "metadata": metadata,
        "prev": GENESIS_HASH,
    }
    line, _ = encode_line(body)
    expected = (
        (flt.session is None or flt.session == session)
        and (flt.run is None or flt.run == run)
        and (flt.zone is None or flt.zone == zone)
        and (flt.trust is None or flt.trust == trust)
        and (
            flt.operation is None
            or (
                operation.startswith(flt.operation[:-1])
                if flt.operation.endswith("*")
                else operation == flt.operation
            )
        )
        and (not flt.denied_only or not allowed)
    )
    assert (LineMatcher(flt).match(line.rstrip(b"\n")) is not None) == expected


def test_a_timestamp_inside_metadata_does_not_fool_time_filters(
    tmp_path: Path, clock: Clock
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.record(
        "run.ended",
        reason='"timestamp":"1999-01-01T00:00:00.000000Z"',
        metadata={"timestamp": "1999-01-01T00:00:00.000000Z", "inner": {"timestamp": "x"}},
    )
    assert len(log.query(AuditFilter(since=START))) == 1
    assert len(log.query(AuditFilter(since=START, until=START + timedelta(seconds=1)))) == 1
    assert log.query(AuditFilter(until=START)) == []
    assert log.query(AuditFilter(since=START + timedelta(seconds=1))) == []


@given(
    stamps=st.lists(
        st.datetimes(
            min_value=datetime(2025, 2, 27),
            max_value=datetime(2025, 3, 3),
            timezones=st.just(UTC),
        ),
        max_size=12,
    ),
    since=st.one_of(st.none(), st.integers(-3, 3)),
    until=st.one_of(st.none(), st.integers(-3, 3)),
    reverse=st.booleans(),
)
@settings(max_examples=200)
def test_time_prefilter_never_drops_a_match(
    stamps: list[datetime], since: int | None, until: int | None, reverse: bool
) -> None:
    lines = [b"garbage", b'{"allowed":true,"timestamp":"2025-03-01T12:00:00.000000Z"']
    for number, stamp in enumerate(stamps):
        text = format_timestamp(stamp)
        if number % 3 == 0:
            text = stamp.isoformat()  # another ISO form, compared by parsing
        body = {
            "id": f"{number:032x}",
            "timestamp": text,
            "operation": "run.started",
            "allowed": True,
            "metadata": {"timestamp": "2000-01-01T00:00:00.000000Z"},
            "prev": GENESIS_HASH,
        }
        lines.append(encode_line(body)[0].rstrip(b"\n"))
    flt = AuditFilter(
        since=None if since is None else START + timedelta(days=since),
        until=None if until is None else START + timedelta(days=until),
    )
    matcher = LineMatcher(flt)
    chunk = b"\n".join(lines)
    everything = [line for line in lines if matcher.match(line) is not None]
    if reverse:
        everything.reverse()
    selected = [line for line in matcher.candidates(chunk, reverse=reverse) if matcher.match(line)]
    assert selected == everything


@given(
    bound=st.binary(min_size=1, max_size=5).filter(lambda b: b'"' not in b and b"\n" not in b),
    text=st.binary(min_size=0, max_size=5).filter(lambda b: b'"' not in b and b"\n" not in b),
)
@settings(max_examples=500)
def test_time_patterns_order_strings_like_comparisons(bound: bytes, text: bytes) -> None:
    candidate = text.ljust(len(bound), b"0")[: len(bound)] + b'"'
    assert (re.fullmatch(_after(bound), candidate) is not None) == (candidate[:-1] >= bound)
    assert (re.fullmatch(_before(bound), candidate) is not None) == (candidate[:-1] < bound)
