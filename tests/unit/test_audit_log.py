"""AuditLog: writing entries, the chain they form, redaction and file errors."""

from __future__ import annotations

import enum
import hashlib
import itertools
import json
import multiprocessing
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.audit import (
    GENESIS_HASH,
    REDACTED,
    AuditEntry,
    AuditFilter,
    AuditLog,
)
from orchestrator.audit.redact import TextRedactor
from orchestrator.errors import AuditError, OrchestratorError

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
KEYS = {
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
}


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "sandbox" / "audit.jsonl"


def read_records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def expected_hash(record: dict[str, object]) -> str:
    """The chain rule, written out independently of the package."""
    body = {key: value for key, value in record.items() if key != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256((str(record["prev"]) + canonical).encode("utf-8")).hexdigest()


def test_entries_form_a_hash_chain(log_path: Path) -> None:
    with AuditLog(log_path) as log:
        log.record("plan.compiled", worker="reader")
        log.record("run.started", worker="reader", run_id="r1")
        log.record("run.ended", worker="reader", run_id="r1", metadata={"exit_code": 0})
    records = read_records(log_path)
    assert len(records) == 3
    assert records[0]["prev"] == GENESIS_HASH == "0" * 64
    for before, after in itertools.pairwise(records):
        assert after["prev"] == before["hash"]
    for record in records:
        assert record["hash"] == expected_hash(record)
    assert log.verify().ok


def test_entry_has_every_field_in_the_documented_form(log_path: Path) -> None:
    log = AuditLog(log_path)
    entry = log.record(
        "policy.denied",
        allowed=False,
        reason="zone 'secrets' is not granted",
        worker="reader",
        run_id="r1",
        session_id="s1",
        trust_level="untrusted",
        zone="secrets",
        path=Path("/data/secrets/key"),
        metadata={"attempt": 2, "nested": {"ok": [1, 2.5, None, True]}},
    )
    (record,) = read_records(log_path)
    assert set(record) == KEYS
    assert re.fullmatch(r"[0-9a-f]{32}", str(record["id"]))
    assert TIMESTAMP.match(str(record["timestamp"]))
    assert record["path"] == "/data/secrets/key"
    assert record["allowed"] is False
    assert entry.to_dict() == record
    assert log.query() == [entry]
    assert isinstance(entry.timestamp, datetime)
    assert entry.timestamp.tzinfo is not None
    assert entry.expected_hash() == entry.hash


def test_the_log_file_is_canonical_json_lines(log_path: Path) -> None:
    log = AuditLog(log_path)
    for number in range(3):
        log.record("run.started", run_id=f"r{number}", metadata={"é": "ünïcode"})
    data = log_path.read_bytes()
    assert data.endswith(b"\n")
    assert "ünïcode".encode() in data  # not \\u-escaped
    for line in data.splitlines():
        assert line.startswith(b'{"allowed":')
        assert line.endswith(b'"}')


def test_nothing_is_created_until_the_first_record(tmp_path: Path) -> None:
    path = tmp_path / "not" / "yet" / "audit.jsonl"
    log = AuditLog(path)
    assert log.query() == []
    assert log.violations() == []
    result = log.verify()
    assert result.ok
    assert result.count == 0
    assert not path.parent.exists()
    log.record("run.started")
    assert path.is_file()
    assert (path.parent / "audit.jsonl.lock").exists()


def test_record_rejects_reserved_and_empty_operations(log_path: Path) -> None:
    log = AuditLog(log_path)
    with pytest.raises(ValueError, match="reserved"):
        log.record("audit.pruned")
    with pytest.raises(ValueError, match="non-empty"):
        log.record("  ")
    with pytest.raises(TypeError, match="mapping"):
        log.record("run.started", metadata=["not", "a", "mapping"])  # type: ignore[arg-type]


class Colour(enum.Enum):
    RED = "red"


def test_metadata_of_any_type_is_written_as_json(log_path: Path) -> None:
    cyclic: dict[str, object] = {"name": "loop"}
    cyclic["self"] = cyclic
    metadata: dict[Any, object] = {
        "path": Path("/tmp/x"),
        "when": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        "tags": {"one"},
        "nan": float("nan"),
        "colour": Colour.RED,
        "raw": b"bytes",
        "cyclic": cyclic,
        7: "int key",
        None: "none key",
    }
    log = AuditLog(log_path)
    entry = log.record("run.ended", metadata=metadata)
    assert entry.metadata["path"] == "/tmp/x"
    assert entry.metadata["when"] == "2025-01-02T03:04:05+00:00"
    assert entry.metadata["tags"] == ["one"]
    assert entry.metadata["nan"] == "nan"
    assert entry.metadata["colour"] == "red"
    assert entry.metadata["raw"] == "bytes"
    assert entry.metadata["cyclic"] == {"name": "loop", "self": "[cycle]"}
    assert entry.metadata["7"] == "int key"
    assert entry.metadata["null"] == "none key"
    assert log.verify().ok
    assert log.query()[0] == entry


# -- redaction -------------------------------------------------------------------------

TOKEN = "ghp_s3cr3tT0kenValue42"  # a made-up secret


def test_secrets_never_reach_the_disk(tmp_path: Path) -> None:
    folder = tmp_path / "sandbox"
    log = AuditLog(folder / "audit.jsonl", redact=[TOKEN])
    other = "second-secret-value"
    log.add_secret(other)
    log.record(
        f"run.started {TOKEN}",
        allowed=False,
        reason=f"token {TOKEN} rejected",
        worker=f"w-{TOKEN}",
        run_id=TOKEN,
        session_id=f"{TOKEN}{TOKEN}",
        trust_level=TOKEN,
        zone=TOKEN,
        path=Path("/keys") / TOKEN,
        metadata={
            "env": {"GITHUB_TOKEN": TOKEN, TOKEN: "as a key", "list": [f"x{TOKEN}y", other]},
            "argv": ("--token", TOKEN),
            f"key-{other}": {"deep": [[{"deeper": f"pre{other}post"}]]},
        },
    )
    log.record("run.ended", metadata={"echo": TOKEN})
    log.prune(timedelta(days=1))
    with (tmp_path / "export.json").open("w", encoding="utf-8") as out:
        log.export(AuditFilter(), out)
    for file in [*folder.rglob("*"), tmp_path / "export.json"]:
        if file.is_file():
            data = file.read_bytes()
            assert TOKEN.encode() not in data, file
            assert other.encode() not in data, file
    first = log.query()[0]
    assert first.run_id == REDACTED
    assert first.session_id == REDACTED + REDACTED
    assert first.metadata["env"] == {
        "GITHUB_TOKEN": REDACTED,
        REDACTED: "as a key",
        "list": [f"x{REDACTED}y", REDACTED],
    }
    assert log.verify().ok


def test_short_secrets_are_ignored(log_path: Path) -> None:
    log = AuditLog(log_path, redact=["", "abc"])
    log.add_secret("on")
    entry = log.record("run.started", worker="abc", zone="on")
    assert entry.worker == "abc"
    assert entry.zone == "on"


def test_overlapping_secrets_leave_no_fragment() -> None:
    redactor = TextRedactor(["abcd1234", "1234wxyz", "zzzz"])
    assert redactor.redact_text("<abcd1234wxyz>") == f"<{REDACTED}>"
    assert redactor.redact_text("zzzzzz") == REDACTED
    assert redactor.redact_text("zzzz-abcd1234") == f"{REDACTED}-{REDACTED}"
    assert redactor.redact_text("nothing here") == "nothing here"
    assert len(redactor) == 3
    with pytest.raises(TypeError):
        redactor.add(1234)  # type: ignore[arg-type]


@given(
    secrets=st.lists(st.text(alphabet="abc", min_size=4, max_size=8), max_size=4),
    text=st.text(alphabet="abc-", max_size=60),
)
@settings(max_examples=300)
def test_redaction_removes_every_occurrence(secrets: list[str], text: str) -> None:
    redactor = TextRedactor(secrets)
    result = redactor.redact_text(text)
    for secret in secrets:
        assert secret not in result
    if not any(secret in text for secret in secrets):
        assert result == text


# -- errors ---------------------------------------------------------------------------


def test_a_directory_in_place_of_the_log_is_an_audit_error(log_path: Path) -> None:
    log_path.mkdir(parents=True)
    log = AuditLog(log_path)
    with pytest.raises(AuditError, match="directory is in its place") as caught:
        log.record("run.started")
    message = str(caught.value)
    assert str(log_path) in message
    assert "\n" not in message
    assert isinstance(caught.value, OrchestratorError)
    with pytest.raises(AuditError, match=re.escape(str(log_path))):
        log.query()
    with pytest.raises(AuditError, match="cannot read"):
        log.verify()
    with pytest.raises(AuditError):
        log.prune(timedelta(days=1))


def test_a_file_in_place_of_the_folder_is_an_audit_error(tmp_path: Path) -> None:
    (tmp_path / "sandbox").write_text("not a folder")
    log = AuditLog(tmp_path / "sandbox" / "audit.jsonl")
    with pytest.raises(AuditError, match="file is in place of one of its folders"):
        log.record("run.started")


def test_a_directory_in_place_of_the_lock_is_an_audit_error(log_path: Path) -> None:
    (log_path.parent / "audit.jsonl.lock").mkdir(parents=True)
    with pytest.raises(AuditError, match=r"audit\.jsonl\.lock"):
        AuditLog(log_path).record("run.started")


def test_the_log_replaced_by_a_directory_after_opening(log_path: Path) -> None:
    log = AuditLog(log_path)
    log.record("run.started")
    log_path.unlink()
    log_path.mkdir()
    with pytest.raises(AuditError, match="directory"):
        log.record("run.ended")


# -- several writers in one process ----------------------------------------------------


def test_two_objects_on_one_log_keep_one_chain(log_path: Path) -> None:
    first, second = AuditLog(log_path), AuditLog(log_path)
    for number in range(10):
        (first if number % 3 else second).record("tick", metadata={"n": number})
    result = first.verify()
    assert result.ok
    assert result.count == 10


def test_an_append_after_another_process_rewrote_the_log(log_path: Path) -> None:
    writer, pruner = AuditLog(log_path), AuditLog(log_path)
    writer.record("old")
    pruner.prune(timedelta(0))  # replaces the file writer has open
    writer.record("new")
    result = writer.verify()
    assert result.ok, result
    assert [entry.operation for entry in writer.query()] == ["audit.pruned", "new"]


def test_threads_sharing_one_log(log_path: Path) -> None:
    log = AuditLog(log_path)

    def work(name: str) -> None:
        for number in range(50):
            log.record("tick", worker=name, metadata={"n": number})

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = log.verify()
    assert result.ok
    assert result.count == 200


_FORKED_LOG: AuditLog | None = None


def _append_from_fork(count: int) -> None:
    assert _FORKED_LOG is not None
    for _ in range(count):
        _FORKED_LOG.record("forked")


def test_a_log_object_inherited_across_fork(log_path: Path) -> None:
    global _FORKED_LOG
    _FORKED_LOG = AuditLog(log_path)
    _FORKED_LOG.record("parent")  # opens the descriptors before the fork
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_from_fork, args=(50,)) for _ in range(3)]
    for worker in workers:
        worker.start()
    _append_from_fork(50)
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    result = _FORKED_LOG.verify()
    assert result.ok, result
    assert result.count == 201
    _FORKED_LOG.close()
    _FORKED_LOG = None


def test_close_then_reuse(log_path: Path) -> None:
    log = AuditLog(log_path)
    log.record("one")
    log.close()
    log.close()
    log.record("two")
    assert log.verify().count == 2
    assert repr(log) == f"AuditLog({str(log_path)!r})"


def test_entry_from_dict_rejects_malformed_records() -> None:
    good = {
        "id": "x",
        "timestamp": "2025-01-01T00:00:00.000000Z",
        "operation": "run.started",
        "allowed": True,
        "prev": GENESIS_HASH,
        "hash": GENESIS_HASH,
    }
    entry = AuditEntry.from_dict(good)
    assert entry.metadata == {}
    assert entry.timestamp == datetime(2025, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="allowed"):
        AuditEntry.from_dict({**good, "allowed": "yes"})
    with pytest.raises(ValueError, match="metadata"):
        AuditEntry.from_dict({**good, "metadata": [1]})
    with pytest.raises(KeyError):
        AuditEntry.from_dict({key: value for key, value in good.items() if key != "id"})


def test_names_that_are_not_utf8_are_recorded_escaped_and_verify(log_path: Path) -> None:
    # A worker's file name b"bad\xff.txt", as os.fsdecode gives it to the host.
    name = "/out/bad\udcff.txt"
    log = AuditLog(log_path, redact=["tok\udcffen"])
    entry = log.record(
        "sandbox.delete",
        allowed=False,
        reason=f"Cannot delete '{name}': x",
        worker="w\ud800",
        zone="z\udcff",
        path=name,
        metadata={"name\udcfe": [name, "has tok\udcffen inside"]},
    )
    assert entry.path == "/out/bad\\xff.txt" and entry.worker == "w\\ud800"
    assert entry.reason == "Cannot delete '/out/bad\\xff.txt': x"
    assert entry.metadata == {"name\\xfe": ["/out/bad\\xff.txt", f"has {REDACTED} inside"]}
    (record,) = read_records(log_path)
    assert record["path"] == "/out/bad\\xff.txt"
    assert log.verify().ok
    assert log.query(AuditFilter(zone="z\udcff")) == [entry]


def test_a_line_forged_with_a_lone_surrogate_fails_verification_without_crashing(
    log_path: Path,
) -> None:
    log = AuditLog(log_path)
    log.record("run.started", path="/a")
    line = log_path.read_bytes().replace(b'"/a"', b'"/a\\udcff"')
    log_path.write_bytes(line)
    result = log.verify()
    assert not result.ok and result.line == 1
