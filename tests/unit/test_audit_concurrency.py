"""Several processes appending to one audit log at once."""

from __future__ import annotations

import json
import multiprocessing
from datetime import timedelta
from pathlib import Path

from orchestrator.audit import PRUNE_OPERATION, AuditLog

PROCESSES = 4
APPENDS = 250


def append_many(path: str, name: str, count: int) -> None:
    log = AuditLog(Path(path))
    for number in range(count):
        log.record(
            "run.started",
            worker=name,
            run_id=f"{name}-{number}",
            metadata={"n": number, "padding": "x" * (number % 97)},
        )
    log.close()


def prune_repeatedly(path: str, times: int) -> None:
    log = AuditLog(Path(path))
    for _ in range(times):
        log.prune(timedelta(0))


def run_all(targets: list[tuple[object, tuple[object, ...]]]) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=args) for target, args in targets]  # type: ignore[arg-type]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0


def test_processes_appending_at_once_keep_one_valid_chain(tmp_path: Path) -> None:
    path = tmp_path / "sandbox" / "audit.jsonl"
    run_all([(append_many, (str(path), f"p{i}", APPENDS)) for i in range(PROCESSES)])

    result = AuditLog(path).verify()
    assert result.ok, result
    assert result.count == PROCESSES * APPENDS
    data = path.read_bytes()
    assert data.endswith(b"\n")
    records = [json.loads(line) for line in data.splitlines()]
    assert len(records) == PROCESSES * APPENDS
    assert len({record["id"] for record in records}) == len(records)
    for i in range(PROCESSES):
        numbers = [r["metadata"]["n"] for r in records if r["worker"] == f"p{i}"]
        assert numbers == list(range(APPENDS))  # each process's own order is kept


def test_appends_racing_a_prune(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    run_all(
        [
            (append_many, (str(path), "a", 150)),
            (append_many, (str(path), "b", 150)),
            (prune_repeatedly, (str(path), 20)),
        ]
    )
    log = AuditLog(path)
    result = log.verify()
    assert result.ok, result
    entries = log.query()
    anchors = [entry for entry in entries if entry.operation == PRUNE_OPERATION]
    assert len(anchors) <= 1
    pruned = anchors[0].metadata["pruned_total"] if anchors else 0
    assert pruned + len(entries) - len(anchors) == 300
