"""The batch scheduler over a fake runner: results, resume, retries, fail-fast, change set."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import tarfile
import threading
import time

import pytest

from orchestrator import Orchestrator
from orchestrator.batch import BatchFolder, expand
from orchestrator.batch.inputs import key_for
from orchestrator.cli.options import signals_interrupt
from orchestrator.errors import ConfigError, EngineError
from orchestrator.runtime.run import RunResult


def _tar(files: dict[str, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


class FakeRunner:
    """Runs an 'input' by reading it: content 'fail' exits 1, 'flaky' fails the engine once.
    Like a real run, it reports the hash of the bytes it was given (placed)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.flaky_seen: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, item, staging, started):
        run_id = f"r{len(self.calls):04d}"
        with self.lock:
            self.calls.append(item.key)
        started(run_id)
        text = item.path.read_text()
        if text == "flaky" and item.key not in self.flaky_seen:
            self.flaky_seen.add(item.key)
            raise EngineError("engine hiccup")
        if text == "boom":
            raise EngineError("engine down")
        outbox = staging.outbox(None, _tar({"out.txt": text.encode(), "../evil": b"x"}))
        code = 1 if text == "fail" else 0
        return RunResult(
            run_id, "w", code, "exited", 0.01, "", "", True, outbox=outbox, inputs=placed(item)
        )


def placed(item) -> list[dict]:
    """What a run reports of its input: the hash of the bytes it was given."""
    return [{"name": item.path.name, "sha256": hashlib.sha256(item.path.read_bytes()).hexdigest()}]


@pytest.fixture
def orch(project):
    project.worker("w", 'command: ["true"]')
    return Orchestrator(project.root)


@pytest.fixture
def inputs(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(6):
        (folder / f"doc{n}.txt").write_text("fail" if n == 2 else f"text {n}")
    return folder


def test_results_change_set_and_exit_code(orch, inputs):
    events = []
    result = orch.batch("w", [inputs], run_one=FakeRunner(), on_event=events.append)
    assert result.count("succeeded") == 5 and result.count("failed") == 1
    assert result.exit_code == 1
    lines = orch.project.sandbox_root / "batches" / result.batch_id / "results.jsonl"
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(records) == 6 and {r["key"] for r in records} == {
        f"000{n}-doc{n - 1}.txt" for n in range(1, 7)
    }
    change = orch.staging.store.get(result.change_id)
    paths = {f.path for f in change.files}
    assert "0001-doc0.txt/out.txt" in paths and "BATCH-MANIFEST.json" in paths
    assert any(r.path.startswith("0001-doc0.txt/") for r in change.rejected)
    assert events[0]["event"] == "batch" and events[-1]["event"] == "summary"


def test_engine_errors_are_retried_then_recorded(orch, tmp_path):
    (tmp_path / "a").write_text("flaky")
    (tmp_path / "b").write_text("boom")
    runner = FakeRunner()
    result = orch.batch("w", [tmp_path / "a", tmp_path / "b"], run_one=runner)
    by_key = {r["key"]: r for r in result.records}
    assert by_key["0001-a"]["status"] == "succeeded" and by_key["0001-a"]["attempts"] == 2
    assert by_key["0002-b"]["status"] == "error" and by_key["0002-b"]["attempts"] == 3
    assert result.exit_code == 125


def test_resume_runs_only_what_is_not_done_and_reruns_after_a_worker_change(orch, inputs, project):
    first = orch.batch("w", [inputs], run_one=FakeRunner())
    again = FakeRunner()
    resumed = orch.batch("w", resume=first.batch_id, run_one=again)
    assert again.calls == [] and resumed.skipped == 6
    (inputs / "doc1.txt").write_text("changed")
    again = FakeRunner()
    orch.batch("w", resume=first.batch_id, run_one=again)
    assert again.calls == ["0002-doc1.txt"]
    project.worker("w", 'command: ["false"]')
    again = FakeRunner()
    orch.batch("w", resume=first.batch_id, run_one=again)
    assert len(again.calls) == 6


def test_fail_fast_stops(orch, inputs):
    result = orch.batch("w", [inputs], run_one=FakeRunner(), concurrency=1, fail_fast=True)
    assert [r["status"] for r in result.records] == ["succeeded", "succeeded", "failed"]


def test_input_names_are_checked_and_keyed(tmp_path, project):
    odd = ["new\nline", "-rf", "..x", "\u202eevil.txt"]
    for name in odd:
        (tmp_path / name).write_text("x")
    items = expand([str(tmp_path / "*")], sandbox_root=project.root / ".sandbox")
    for item in items:
        assert item.key.isprintable() and not item.key.startswith(("-", "."))
        assert "/" not in item.key and item.key.isascii()
    os.symlink("/etc/passwd", tmp_path / "link")
    with pytest.raises(ConfigError, match="symbolic link"):
        expand([tmp_path], sandbox_root=project.root / ".sandbox")
    with pytest.raises(ConfigError, match="matches nothing"):
        expand([str(tmp_path / "nope*")], sandbox_root=project.root / ".sandbox")
    assert key_for(3, tmp_path / "..") == "0003-input"


def test_a_running_batch_is_locked(orch, inputs):
    folder = BatchFolder.create(orch.project.sandbox_root, {"worker": "w", "inputs": []})
    with pytest.raises(Exception, match="another process"):
        BatchFolder.open(orch.project.sandbox_root, folder.batch_id)
    folder.close()


def test_resume_stages_the_new_output_of_an_input_whose_content_changed(orch, inputs):
    first = orch.batch("w", [inputs], run_one=FakeRunner())
    (inputs / "doc1.txt").write_text("changed")
    resumed = orch.batch("w", resume=first.batch_id, run_one=FakeRunner())
    assert [r["key"] for r in resumed.records] == ["0002-doc1.txt"]
    assert resumed.change_id is not None and resumed.change_id != first.change_id
    change = orch.staging.store.get(resumed.change_id)
    staged = {f.path: f for f in change.files}
    assert set(staged) == {"0002-doc1.txt/out.txt", "BATCH-MANIFEST.json"}
    assert staged["0002-doc1.txt/out.txt"].sha256 == hashlib.sha256(b"changed").hexdigest()
    meta = json.loads(
        (orch.project.sandbox_root / "batches" / first.batch_id / "batch.json").read_text()
    )
    new_sha = hashlib.sha256(b"changed").hexdigest()
    assert {"key": "0002-doc1.txt", "sha256": new_sha, "run_id": "r0000"} in meta["staged"]
    assert meta["change_ids"] == [first.change_id, resumed.change_id]
    again = orch.batch("w", resume=first.batch_id, run_one=FakeRunner())
    assert again.change_id is None and again.records == []  # nothing staged twice


def test_an_older_batch_folder_with_bare_staged_keys_resumes_the_same_way(orch, inputs):
    first = orch.batch("w", [inputs], run_one=FakeRunner())
    file = orch.project.sandbox_root / "batches" / first.batch_id / "batch.json"
    meta = json.loads(file.read_text())
    meta["staged"] = sorted(entry["key"] for entry in meta["staged"])  # as it was written
    file.write_text(json.dumps(meta))
    (inputs / "doc1.txt").write_text("changed")
    resumed = orch.batch("w", resume=first.batch_id, run_one=FakeRunner())
    change = orch.staging.store.get(resumed.change_id)
    assert {f.path for f in change.files} == {"0002-doc1.txt/out.txt", "BATCH-MANIFEST.json"}


class BlockingRunner:
    """``first`` runs until cancelled, and a cancelled run reports what a container removed
    under its exec often does: the worker 'exited 125'. The other inputs fail (exit 1) once
    ``first`` has started, or, with ``interrupt``, send this process SIGINT."""

    def __init__(self, first: str, *, interrupt: bool = False) -> None:
        self.first, self.interrupt = first, interrupt
        self.running = threading.Event()
        self.removed = threading.Event()
        self.cancelled: list[str] = []

    def cancel(self, run_id: str) -> None:
        self.cancelled.append(run_id)
        self.removed.set()

    def __call__(self, item, staging, started):
        run_id = f"run-{item.key}"
        started(run_id)
        if item.key == self.first:
            self.running.set()
            assert self.removed.wait(10)
            time.sleep(0.3)  # a removal takes a while: the batch must wait for its end
            return RunResult(run_id, "w", 125, "exited", 0.01, "", "", True)
        assert self.running.wait(10)
        if self.interrupt:
            time.sleep(0.3)  # the signal comes while the batch waits for its runs
            os.kill(os.getpid(), signal.SIGINT)
            assert self.removed.wait(10)
            raise EngineError("container abc is no longer running")
        return RunResult(run_id, "w", 1, "exited", 0.01, "", "", True, inputs=placed(item))


def test_fail_fast_records_the_removed_run_as_cancelled_not_failed(orch, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).write_text(name)
    runner = BlockingRunner("0001-a")
    result = orch.batch(
        "w", [tmp_path / "a", tmp_path / "b"], run_one=runner, cancel=runner.cancel,
        concurrency=2, fail_fast=True,
    )  # fmt: skip
    by_key = {r["key"]: r for r in result.records}
    assert runner.cancelled == ["run-0001-a"]
    assert by_key["0002-b"]["status"] == "failed"
    assert by_key["0001-a"]["status"] == "cancelled", by_key["0001-a"]
    assert "fail-fast" in by_key["0001-a"]["error"]
    resumed = orch.batch("w", resume=result.batch_id, run_one=FakeRunner())
    assert [r["key"] for r in resumed.records] == ["0001-a"]


def test_ctrl_c_records_every_run_it_ended_as_cancelled(orch, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).write_text(name)
    runner = BlockingRunner("0001-a", interrupt=True)
    with signals_interrupt():
        result = orch.batch(
            "w", [tmp_path / "a", tmp_path / "b"], run_one=runner, cancel=runner.cancel,
            concurrency=2,
        )  # fmt: skip
    assert result.exit_code == 130
    assert sorted(runner.cancelled) == ["run-0001-a", "run-0002-b"]
    assert sorted(r["key"] for r in result.records) == ["0001-a", "0002-b"]
    for record in result.records:
        assert record["status"] == "cancelled", record
        assert record["error"] == "cancelled by SIGINT", record
    resumed = orch.batch("w", resume=result.batch_id, run_one=FakeRunner())
    assert sorted(r["key"] for r in resumed.records) == ["0001-a", "0002-b"]


def test_resume_keeps_an_earlier_failure_in_the_exit_code_and_summary(orch, inputs):
    first = orch.batch("w", [inputs], run_one=FakeRunner())
    assert first.exit_code == 1
    resumed = orch.batch("w", resume=first.batch_id, run_one=FakeRunner())
    assert resumed.records == [] and resumed.skipped == 6
    summary = resumed.summary()
    assert summary["already"] == {"failed": 1, "oom": 0, "succeeded": 5, "timeout": 0}
    assert resumed.exit_code == 1 and summary["exit_code"] == 1


def test_resume_takes_the_batchs_own_inputs_and_refuses_others(orch, inputs, tmp_path):
    first = orch.batch("w", [inputs / "doc0.txt", inputs / "doc1.txt"], run_one=FakeRunner())
    again = FakeRunner()
    resumed = orch.batch(
        "w", [inputs / "doc0.txt", inputs / "doc1.txt"], resume=first.batch_id, run_one=again
    )
    assert again.calls == [] and resumed.skipped == 2
    with pytest.raises(ConfigError, match="another order"):
        orch.batch("w", [inputs / "doc1.txt", inputs / "doc0.txt"], resume=first.batch_id)
    with pytest.raises(ConfigError, match=r"the batch also has .*doc1\.txt; give"):
        orch.batch("w", [inputs / "doc0.txt"], resume=first.batch_id)
    with pytest.raises(ConfigError, match=r"--inputs also names .*doc2\.txt, .*doc3\.txt, "):
        orch.batch("w", [inputs], resume=first.batch_id)
    # a refusal leaves the batch free to resume (its lock was let go)
    assert orch.batch("w", resume=first.batch_id, run_one=FakeRunner()).skipped == 2
