"""Running a batch: one disposable container per input, N at a time, every result kept.

Each input runs in its own new container (from the warm pool when inputs can be placed
into a pooled run, else a cold :func:`~orchestrator.runtime.run.execute`), never reused.
A worker's failure is recorded and the batch goes on; an engine error is retried (at most
:data:`ATTEMPTS` times); ``fail_fast`` stops at the first failure. Stopping (fail-fast,
Ctrl-C, SIGTERM) removes the containers still running, records their inputs as
``cancelled`` and keeps every result so far; ``--resume`` re-runs exactly those.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.batch.folder import BatchFolder
from orchestrator.batch.inputs import BatchInput
from orchestrator.batch.staging import BatchOutbox, BatchStaging
from orchestrator.errors import EngineError, OrchestratorError
from orchestrator.exits import Exit, signalled
from orchestrator.runtime.run import RunResult

__all__ = ["ATTEMPTS", "DONE", "WORKER_FAILED", "BatchResult", "RunOne"]

#: Tries per input when the engine fails (not the worker): the first and two retries.
ATTEMPTS = 3
#: Statuses that are final for an input: a resumed batch does not run it again.
DONE = frozenset({"succeeded", "failed", "timeout", "oom"})
#: ... of which the worker failed.
WORKER_FAILED = frozenset({"failed", "timeout", "oom"})

Event = dict[str, Any]
#: Runs one input in a new container with the batch's staging; ``started(run_id)`` is
#: called once the run has its id (so that it can be cancelled).
RunOne = Callable[[BatchInput, BatchStaging, Callable[[str], None]], RunResult]


@dataclass
class BatchResult:
    """What a batch did (this invocation and, after ``resume``, the earlier ones)."""

    batch_id: str
    folder: str
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    """Inputs already done by an earlier invocation (``resume``)."""
    earlier: list[dict[str, Any]] = field(default_factory=list)
    """The final results of those inputs (their latest lines in ``results.jsonl``): an
    earlier failure still counts in the exit code and the summary."""
    change_id: str | None = None
    change_files: int = 0
    interrupted: int | None = None
    """The signal that stopped the batch, if one did."""

    def count(self, *statuses: str) -> int:
        return sum(1 for r in self.records if r["status"] in statuses)

    @property
    def exit_code(self) -> int:
        """0 every input succeeded, 1 some worker failed (in this invocation or an earlier
        one of the batch), 125 an orchestrator error."""
        if self.interrupted is not None:
            return signalled(self.interrupted)
        if self.count("error"):
            return Exit.ERROR
        if self.count(*WORKER_FAILED, "cancelled") or self.already(*WORKER_FAILED):
            return 1
        return 0

    def already(self, *statuses: str) -> int:
        """How many inputs an earlier invocation finished with one of ``statuses``."""
        return sum(1 for r in self.earlier if r.get("status") in statuses)

    def summary(self) -> dict[str, Any]:
        counts = {
            s: self.count(s)
            for s in ("succeeded", "failed", "timeout", "oom", "error", "cancelled")
        }
        return {
            "batch_id": self.batch_id,
            "folder": self.folder,
            "ran": len(self.records),
            "skipped": self.skipped,
            "already": {s: self.already(s) for s in sorted(DONE)},
            **counts,
            "change_id": self.change_id,
            "change_files": self.change_files,
            "interrupted": self.interrupted,
            "exit_code": self.exit_code,
        }


def _placed_sha256(result: RunResult) -> str | None:
    """The hash of the bytes the run was given (its one input, as placed and hashed)."""
    hashes = [placed.get("sha256") for placed in result.inputs]
    return hashes[0] if len(hashes) == 1 else None


def status_of(result: RunResult) -> str:
    if result.status == "exited":
        return "succeeded" if result.exit_code == 0 else "failed"
    if result.status in ("timeout", "oom"):
        return result.status
    if result.status == "error" and result.exit_code in (Exit.CANNOT_INVOKE, Exit.NOT_FOUND):
        return "failed"  # the worker's command cannot run: the worker's problem
    return "error"


class BatchScheduler:
    """The threads of one batch invocation: N at a time, retries, fail-fast and halting
    (see :func:`~orchestrator.batch.runner.run_batch`)."""

    def __init__(
        self,
        folder: BatchFolder,
        todo: list[BatchInput],
        run_one: RunOne,
        cancel: Callable[[str], None],
        *,
        worker_hash: str,
        staging: BatchStaging,
        concurrency: int,
        fail_fast: bool,
        emit: Callable[[Event], None],
    ) -> None:
        self.folder, self.run_one, self.cancel = folder, run_one, cancel
        self.worker_hash, self.staging, self.fail_fast = worker_hash, staging, fail_fast
        self.concurrency = max(1, min(concurrency, len(todo) or 1))
        self.emit = emit
        self.queue: queue.SimpleQueue[BatchInput] = queue.SimpleQueue()
        for item in todo:
            self.queue.put(item)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.in_flight: dict[str, str] = {}  # key -> run id
        self.cancelled: set[str] = set()  # keys in flight when the batch was halted
        self.reason = "cancelled: the batch was stopped"
        self.records: list[dict[str, Any]] = []
        self.ended = [threading.Event() for _ in range(self.concurrency)]
        self.threads = [
            threading.Thread(target=self._work, args=(ended,), name=f"batch-{n}", daemon=True)
            for n, ended in enumerate(self.ended)
        ]

    def start(self) -> None:
        """Start every thread with SIGINT and SIGTERM held back meanwhile: a signal arrives
        (and can halt them) once all have started, never with some half-started and
        out of :meth:`join`'s and :meth:`halt`'s reach."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for thread in self.threads:
                thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def join(self) -> None:
        """Wait for the threads, in short steps so that signals reach the main thread.

        Each thread's own "ended" event is waited on, not ``Thread.join``: a signal handler
        that raises inside ``join`` can leave a thread that still runs marked as stopped
        (CPython 3.11), and the batch would then be staged without that thread's input."""
        for thread, ended in zip(self.threads, self.ended, strict=True):
            while thread.ident is not None and not ended.wait(0.2):
                pass

    def halt(self, reason: str = "cancelled: the batch was stopped") -> None:
        """Stop taking inputs and remove the containers still running. Every input in flight
        now (or that gets its run id from now on) is recorded ``cancelled``, whatever its
        run reports: a run ended by this removal may look like the worker's own failure
        (an exec cut short reads as exit 125) or an engine error, and neither is final."""
        with self.lock:
            if not self.stop.is_set():
                self.reason = reason
            self.stop.set()
            running = list(self.in_flight.items())
            self.cancelled.update(key for key, _ in running)
        for _key, run_id in running:
            self.cancel(run_id)

    def _work(self, ended: threading.Event) -> None:
        try:
            self._take_inputs()
        finally:
            ended.set()

    def _take_inputs(self) -> None:
        while not self.stop.is_set():
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            record = self._one(item)
            with self.lock:
                self.in_flight.pop(item.key, None)
                if item.key in self.cancelled or (
                    self.stop.is_set() and record["status"] not in DONE
                ):
                    record.update(status="cancelled", error=self.reason, files=[], rejected=[])
                self.folder.append(record)
                self.records.append(record)
                self.emit({"event": "finished", **record})
            if self.fail_fast and record["status"] not in ("succeeded", "cancelled"):
                self.halt(f"cancelled: --fail-fast stopped the batch after {item.key}")

    def _one(self, item: BatchInput) -> dict[str, Any]:
        record: dict[str, Any] = {
            "key": item.key,
            "input": str(item.path),
            "sha256": None,  # of the bytes placed for the run, once they are
            "worker_hash": self.worker_hash,
            "run_id": None,
            "exit_code": int(Exit.ERROR),
            "status": "error",
            "duration_s": 0.0,
            "attempts": 0,
            "files": [],
            "rejected": [],
            "error": None,
        }
        started = time.monotonic()

        def note(run_id: str) -> None:
            record["run_id"] = run_id
            with self.lock:
                self.in_flight[item.key] = run_id
                late = self.stop.is_set()  # halted between taking the input and now
                if late:
                    self.cancelled.add(item.key)
            self.emit(
                {"event": "started", "key": item.key, "input": str(item.path), "run_id": run_id}
            )
            if late:
                self.cancel(run_id)

        for attempt in range(1, ATTEMPTS + 1):
            if self.stop.is_set():
                break  # halted before this attempt began: recorded as cancelled
            record["attempts"] = attempt
            try:
                result = self.run_one(item, self.staging, note)
            except EngineError as exc:
                record["error"] = str(exc)
                if attempt < ATTEMPTS and not self.stop.is_set():
                    self.emit(
                        {"event": "retry", "key": item.key, "attempt": attempt, "error": str(exc)}
                    )
                    time.sleep(0.5 * attempt)
                    continue
                break
            except OrchestratorError as exc:
                record["error"] = str(exc)
                break
            except Exception as exc:  # noqa: BLE001 - recorded; the batch goes on
                record["error"] = f"{type(exc).__name__}: {exc}"
                break
            outbox = result.outbox if isinstance(result.outbox, BatchOutbox) else BatchOutbox()
            record.update(
                run_id=result.run_id,
                exit_code=result.exit_code,
                status=status_of(result),
                error=result.error,
                files=outbox.files,
                rejected=outbox.rejected,
                sha256=_placed_sha256(result),
            )
            break
        record["duration_s"] = round(time.monotonic() - started, 3)
        return record
