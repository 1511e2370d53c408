"""Verifying the chain (tampering, torn writes) and pruning it."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import orchestrator.audit.log as audit_log_module
from orchestrator.audit import PRUNE_OPERATION, AuditFilter, AuditLog, VerifyResult
from orchestrator.errors import AuditError

START = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    """A stand-in for utc_now that tests move by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(START)
    monkeypatch.setattr(audit_log_module, "utc_now", fake)
    return fake


@pytest.fixture
def log(tmp_path: Path) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl")
    for number in range(6):
        log.record("run.started", run_id=f"r{number}", metadata={"n": number})
    return log


def lines(log: AuditLog) -> list[bytes]:
    return log.path.read_bytes().splitlines(keepends=True)


def rehash(line: bytes, prev: str | None = None) -> bytes:
    """Re-seal an edited line the way a forger would."""
    record = json.loads(line)
    record.pop("hash")
    if prev is not None:
        record["prev"] = prev
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    record["hash"] = hashlib.sha256((record["prev"] + canonical).encode()).hexdigest()
    return json.dumps(record).encode() + b"\n"


def broken(result: VerifyResult) -> list[int]:
    return [problem.line for problem in result.problems]


def test_an_intact_log_verifies(log: AuditLog) -> None:
    result = log.verify()
    assert result.ok
    assert result.count == 6
    assert result.line is None
    assert result.reason is None
    assert str(result) == "6 entries, chain intact"


def test_an_edited_line_is_named(log: AuditLog) -> None:
    content = lines(log)
    content[2] = content[2].replace(b'"r2"', b'"rX"')
    log.path.write_bytes(b"".join(content))
    result = log.verify()
    assert not result.ok
    assert result.line == 3
    assert result.reason is not None
    assert "edited" in result.reason
    assert broken(result) == [3]
    assert "line 3" in str(result)


def test_an_edited_and_resealed_line_breaks_the_next_link(log: AuditLog) -> None:
    content = lines(log)
    content[2] = rehash(content[2].replace(b'"r2"', b'"rX"'))
    log.path.write_bytes(b"".join(content))
    result = log.verify()
    assert broken(result) == [4]
    assert result.reason is not None
    assert "line 3" in result.reason


def test_a_deleted_line_is_named(log: AuditLog) -> None:
    content = lines(log)
    del content[3]
    log.path.write_bytes(b"".join(content))
    result = log.verify()
    assert not result.ok
    assert result.line == 4
    assert broken(result) == [4]
    assert result.count == 5


def test_deleting_the_first_line_is_detected(log: AuditLog) -> None:
    log.path.write_bytes(b"".join(lines(log)[1:]))
    result = log.verify()
    assert result.line == 1
    assert result.reason is not None
    assert "first entry" in result.reason


def test_deleting_the_last_line_is_not_detectable(log: AuditLog) -> None:
    # A known limit of a hash chain kept in one file: see docs/audit.md.
    log.path.write_bytes(b"".join(lines(log)[:-1]))
    assert log.verify().ok


def test_reordered_lines_are_named(log: AuditLog) -> None:
    content = lines(log)
    content[1], content[2] = content[2], content[1]
    log.path.write_bytes(b"".join(content))
    result = log.verify()
    assert not result.ok
    assert result.line == 2
    assert broken(result)[0] == 2


def test_a_duplicated_line_is_named(log: AuditLog) -> None:
    content = lines(log)
    content.insert(3, content[2])
    log.path.write_bytes(b"".join(content))
    assert log.verify().line == 4


def test_a_torn_last_line(log: AuditLog) -> None:
    content = lines(log)
    last_hash = json.loads(content[-1])["hash"]
    with log.path.open("ab") as handle:
        handle.write(b'{"allowed":true,"id":"abc","metadata":{"n"')  # cut short
    result = log.verify()
    assert not result.ok
    assert result.line == 7
    assert result.reason is not None
    assert "torn" in result.reason
    assert result.count == 6
    assert len(log.query()) == 6

    entry = log.record("run.ended", run_id="after")
    assert entry.prev == last_hash
    after = log.verify()
    assert broken(after) == [7]  # only the torn line; the chain itself holds
    assert after.count == 7
    assert log.path.read_bytes().endswith(b"\n")
    assert [e.run_id for e in log.query(AuditFilter(limit=1))] == ["after"]
    assert len(log.path.read_bytes().splitlines()) == 8


def test_a_last_line_missing_only_its_newline(log: AuditLog) -> None:
    log.path.write_bytes(log.path.read_bytes()[:-1])
    result = log.verify()
    assert broken(result) == [6]
    assert result.reason is not None
    assert "newline" in result.reason
    assert len(log.query()) == 6
    log.record("run.ended")
    assert log.verify().ok
    assert log.verify().count == 7


def test_a_log_that_is_only_a_torn_line(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.path.write_bytes(b'{"allowed":tr')
    log.record("run.started")
    result = log.verify()
    assert broken(result) == [1]
    assert result.count == 1


# -- prune -----------------------------------------------------------------------------


def fill(log: AuditLog, clock: Clock, days: int) -> None:
    """One entry per day, the oldest ``days`` days ago."""
    for day in range(days):
        clock.now = START + timedelta(days=day)
        log.record("run.started", run_id=f"day{day}")
    clock.now = START + timedelta(days=days)


def test_prune_drops_old_entries_and_stays_verifiable(tmp_path: Path, clock: Clock) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    fill(log, clock, 10)
    before = log.query()
    result = log.prune(timedelta(days=4, hours=12))
    assert (result.dropped, result.kept) == (6, 4)
    entries = log.query()
    anchor = entries[0]
    assert anchor.operation == PRUNE_OPERATION
    assert entries[1:] == before[6:]  # kept entries are unchanged, hashes included
    assert anchor.prev == before[5].hash == anchor.metadata["last_pruned_hash"]
    assert anchor.metadata["pruned"] == 6
    assert anchor.metadata["first_timestamp"] == "2025-03-01T12:00:00.000000Z"
    assert anchor.metadata["last_timestamp"] == "2025-03-06T12:00:00.000000Z"
    verified = log.verify()
    assert verified.ok, verified
    assert verified.count == 5

    log.record("run.ended")
    assert log.verify().ok

    clock.now += timedelta(days=2)
    again = log.prune(timedelta(days=4))
    assert again.dropped == 2
    anchor = log.query()[0]
    assert anchor.metadata["pruned_total"] == 8
    assert anchor.metadata["first_timestamp"] == "2025-03-01T12:00:00.000000Z"
    assert log.verify().ok


def test_prune_with_nothing_old_enough_leaves_the_file_alone(tmp_path: Path, clock: Clock) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    fill(log, clock, 3)
    data = log.path.read_bytes()
    result = log.prune(timedelta(days=30))
    assert (result.dropped, result.kept) == (0, 3)
    assert log.path.read_bytes() == data


def test_prune_everything_then_append(tmp_path: Path, clock: Clock) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    fill(log, clock, 3)
    assert log.prune(timedelta(0)).kept == 0
    assert [e.operation for e in log.query()] == [PRUNE_OPERATION]
    assert log.verify().ok
    log.record("run.started")
    log.record("run.ended")
    assert log.verify().ok
    assert log.verify().count == 3
    clock.now += timedelta(seconds=1)
    assert log.prune(timedelta(0)).dropped == 2
    assert log.verify().ok


def test_prune_of_a_missing_log(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    assert log.prune(timedelta(days=1)).dropped == 0
    with pytest.raises(ValueError, match="negative"):
        log.prune(timedelta(days=-1))


def test_prune_refuses_a_broken_chain(tmp_path: Path, clock: Clock) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    fill(log, clock, 5)
    content = lines(log)
    del content[1]
    log.path.write_bytes(b"".join(content))
    with pytest.raises(AuditError, match="line 2") as caught:
        log.prune(timedelta(days=1))
    assert "left unchanged" in str(caught.value)
    assert log.path.read_bytes() == b"".join(content)


def test_prune_drops_torn_lines(tmp_path: Path, clock: Clock) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    fill(log, clock, 3)
    with log.path.open("ab") as handle:
        handle.write(b'{"torn"')
    log.record("run.ended")
    result = log.prune(timedelta(days=1, hours=12))
    assert (result.dropped, result.kept, result.damaged) == (2, 2, 1)
    assert log.verify().ok
    assert log.query()[0].metadata["damaged_lines_dropped"] == 1


def test_tampering_with_the_anchor_is_detected(tmp_path: Path, clock: Clock) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    fill(log, clock, 5)
    log.prune(timedelta(days=2, hours=12))
    content = lines(log)
    edited = content[0].replace(b'"pruned":3', b'"pruned":1')
    log.path.write_bytes(b"".join([edited, *content[1:]]))
    assert log.verify().line == 1
    log.path.write_bytes(b"".join(content[1:]))  # anchor removed
    assert log.verify().line == 1
    log.path.write_bytes(b"".join(content))
    assert log.verify().ok
