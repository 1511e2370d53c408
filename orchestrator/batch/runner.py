"""``Orchestrator.batch``: expand, open the batch folder, run, stage, summarise."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.batch.folder import BatchFolder
from orchestrator.batch.inputs import BatchInput, expand, file_sha256
from orchestrator.batch.scheduler import DONE, BatchResult, BatchScheduler, Event, RunOne
from orchestrator.batch.staging import BatchStaging, make_change_set
from orchestrator.errors import ConfigError
from orchestrator.prepare.inputs import LinkFree, shown
from orchestrator.runtime.pool import Preparer
from orchestrator.runtime.removal import Interrupted
from orchestrator.runtime.run import RunResult, collect_garbage, execute

if TYPE_CHECKING:
    from collections.abc import Mapping

    from orchestrator.audit import AuditLog
    from orchestrator.config import Project, Worker
    from orchestrator.prepare import Prepared
    from orchestrator.runtime.backend import Backend
    from orchestrator.runtime.outbox import StagingReader
    from orchestrator.runtime.pool import WarmPool

__all__ = ["BatchOwner", "run_batch", "worker_hash"]


class BatchOwner(Preparer, Protocol):
    """What a batch needs of its owner (an :class:`~orchestrator.Orchestrator`): the
    project, its backend, audit log and change store, and runs prepared, pooled and given
    their secrets."""

    @property
    def project(self) -> Project: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def staging(self) -> StagingReader: ...

    def secrets_for(self, prepared: Prepared) -> Mapping[str, str]: ...

    def pool(self, worker: str | Worker, *, size: int = ..., **options: Any) -> WarmPool: ...


def worker_hash(worker: Worker) -> str:
    """The worker definition's hash: its file's bytes (a changed file means re-run)."""
    return hashlib.sha256(worker.file.read_bytes()).hexdigest()


def run_batch(
    orch: BatchOwner,
    worker: str | Worker,
    inputs: Sequence[str | os.PathLike[str]] = (),
    *,
    concurrency: int = 4,
    resume: str | None = None,
    fail_fast: bool = False,
    on_event: Callable[[Event], None] | None = None,
    use_pool: bool | None = None,
    run_one: RunOne | None = None,
    cancel: Callable[[str], None] | None = None,
    **options: Any,
) -> BatchResult:
    """See :meth:`orchestrator.Orchestrator.batch`. ``run_one`` runs one input (default:
    a run on the owner's backend, pooled when it can hold runs idling, else cold) and
    ``cancel(run_id)`` removes a running one (default: the backend's)."""
    if concurrency < 1:
        raise ConfigError([f"--concurrency {concurrency}: use 1 or more"])
    first = orch.prepare(worker, **options)  # refused here, before anything is made
    name, digest = first.worker.name, worker_hash(first.worker)
    sandbox = orch.project.sandbox_root
    if resume is None:
        items = expand(inputs, sandbox_root=sandbox)
        folder = BatchFolder.create(
            sandbox,
            {
                "worker": name,
                "worker_hash": digest,
                "trust": first.spec.trust,
                "inputs": [i.to_dict() for i in items],
                "staged": [],
                "change_ids": [],
            },
        )
    else:
        folder = BatchFolder.open(sandbox, resume)
        try:
            items = _resumed_inputs(folder, name, inputs, sandbox)
        except BaseException:
            folder.close()
            raise
        _known_staged(folder)
    emit = _emitter(on_event)
    try:
        todo, earlier = _todo(folder, items, digest)
        result = BatchResult(
            folder.batch_id, str(folder.folder), skipped=len(earlier), earlier=earlier
        )
        emit(
            {
                "event": "batch",
                "batch_id": folder.batch_id,
                "folder": str(folder.folder),
                "worker": name,
                "total": len(items),
                "todo": len(todo),
                "skipped": len(earlier),
                "already": {s: result.already(s) for s in sorted(DONE)},
            }
        )
        staging = BatchStaging(orch.staging, folder.blobs)
        pool = _pool(orch, worker, todo, concurrency, use_pool, run_one, options)
        try:
            one = run_one or (_pooled(pool) if pool else _cold(orch, worker, options))
            batch = BatchScheduler(
                folder,
                todo,
                one,
                cancel or orch.backend.cancel,
                worker_hash=digest,
                staging=staging,
                concurrency=concurrency,
                fail_fast=fail_fast,
                emit=emit,
            )
            try:  # a signal while the threads start must halt those already running
                batch.start()
                batch.join()
            except (Interrupted, KeyboardInterrupt) as exc:
                result.interrupted = getattr(exc, "signum", signal.SIGINT)
                emit({"event": "interrupted", "signal": result.interrupted})
                with _ignoring_signals():
                    batch.halt(f"cancelled by {signal.Signals(result.interrupted).name}")
                    batch.join()
        finally:
            if pool is not None:
                with _ignoring_signals():
                    pool.close()
        result.records = batch.records
        with _ignoring_signals():
            _stage(orch, folder, first, result)
        emit({"event": "summary", **result.summary()})
        return result
    finally:
        folder.close()


def _resumed_inputs(
    folder: BatchFolder,
    name: str,
    inputs: Sequence[str | os.PathLike[str]],
    sandbox: Path,
) -> list[BatchInput]:
    """The batch's own inputs, once the worker (and ``inputs``, when given) match it."""
    if folder.meta.get("worker") != name:
        raise ConfigError(
            [
                f"batch {folder.batch_id} ran worker '{folder.meta.get('worker')}', not "
                f"'{name}'; resume it with that worker"
            ]
        )
    items = folder.inputs
    if inputs:  # the killed command re-typed with --resume: the same inputs, or refused
        _same_inputs(folder.batch_id, items, expand(inputs, sandbox_root=sandbox))
    return items


def _same_inputs(batch_id: str, items: list[BatchInput], given: list[BatchInput]) -> None:
    """Refuse ``--inputs`` that do not name the batch's own inputs (the same files in the
    same order: keys follow the order), naming the first differences. Contents may have
    changed: resuming re-runs those inputs."""
    ours, theirs = [i.path for i in items], [i.path for i in given]
    if ours == theirs:
        return
    extra = [p for p in theirs if p not in set_ours] if (set_ours := set(ours)) else theirs
    missing = [p for p in ours if p not in set(theirs)]
    parts = []
    if extra:
        parts.append(f"--inputs also names {_listed(extra)}")
    if missing:
        parts.append(f"the batch also has {_listed(missing)}")
    if not parts:
        parts.append("--inputs names the same files in another order (keys follow the order)")
    raise ConfigError(
        [
            f"--resume {batch_id}: {'; '.join(parts)}; give the batch's own --inputs "
            f"({len(ours)} files) or none"
        ]
    )


def _listed(paths: list[Path], most: int = 3) -> str:
    shown_ = ", ".join(shown(p) for p in paths[:most])
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return f"{shown_}{more}"


def _todo(
    folder: BatchFolder, items: list[BatchInput], digest: str
) -> tuple[list[BatchInput], list[dict[str, Any]]]:
    """The inputs still to run (no final result for this content and worker definition),
    and the final results of the others. A result's hash is of the bytes its run was given
    (placed and hashed once), so an input changed back after a run saw other bytes runs
    again."""
    done = folder.results()
    todo: list[BatchInput] = []
    earlier: list[dict[str, Any]] = []
    for item in items:
        record = done.get(item.key)
        if (
            record
            and record.get("status") in DONE
            and record.get("worker_hash") == digest
            and record.get("sha256") == _current_sha256(item.path)
        ):
            earlier.append(record)
        else:
            todo.append(item)
    return todo, earlier


def _current_sha256(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None  # gone, a link now, another kind: its run reports the problem


def _stage(orch: BatchOwner, folder: BatchFolder, first: Prepared, result: BatchResult) -> None:
    """One change set of every final result not staged yet; then the blobs can go.

    A result is known by its input's key, content and run (``batch.json``'s ``staged``):
    an input re-run after its content or the worker file changed is a new result to
    stage, even though its key was staged before."""
    staged = folder.meta.get("staged", [])
    records = [
        r for k, r in folder.results().items() if r["status"] in DONE and not _staged(r, staged)
    ]
    change_id, files = make_change_set(
        orch.staging,
        orch.audit,
        folder.blobs,
        batch_id=folder.batch_id,
        worker=first.spec.worker,
        trust=first.spec.trust,
        records=records,
    )
    folder.meta["staged"] = [*staged, *(_staged_entry(r) for r in records)]
    if change_id is not None:
        folder.meta["change_ids"] = [*folder.meta.get("change_ids", []), change_id]
    folder.set_change(change_id or folder.meta.get("change_id"))
    result.change_id, result.change_files = change_id, files
    if all(r.get("status") in DONE for r in folder.results().values()):
        folder.drop_blobs()


def _staged_entry(record: dict[str, Any]) -> dict[str, Any]:
    return {name: record.get(name) for name in ("key", "sha256", "run_id")}


def _staged(record: dict[str, Any], staged: list[Any]) -> bool:
    """Whether this very result (key, input content, run) is in a change set already."""
    return _staged_entry(record) in staged


def _known_staged(folder: BatchFolder) -> None:
    """An older batch folder lists bare keys as staged: each stood for that key's latest
    result, which is still its latest before a resumed batch runs anything."""
    latest = folder.results()
    folder.meta["staged"] = [
        _staged_entry(latest[s]) if isinstance(s, str) and s in latest else s
        for s in folder.meta.get("staged", [])
        if isinstance(s, dict) or s in latest
    ]


def _cold(orch: BatchOwner, worker: str | Worker, options: dict[str, Any]) -> RunOne:
    def one(item: BatchInput, staging: BatchStaging, started: Callable[[str], None]) -> RunResult:
        prepared = orch.prepare(worker, inputs=[LinkFree(item.path)], **options)
        started(prepared.spec.run_id)
        return execute(
            orch.backend,
            prepared,
            audit=orch.audit,
            staging=staging,
            secrets=orch.secrets_for(prepared),
        )

    return one


def _pool(
    orch: BatchOwner,
    worker: str | Worker,
    todo: list[BatchInput],
    concurrency: int,
    use_pool: bool | None,
    run_one: RunOne | None,
    options: dict[str, Any],
) -> WarmPool | None:
    if run_one is not None or use_pool is False or not todo or options.get("session_id"):
        return None
    if not orch.backend.capabilities.exec:
        return None  # a backend that cannot hold a run idling: cold starts
    if importlib.util.find_spec("orchestrator.runtime.inputs") is None:
        return None  # inputs cannot be placed into a pooled run: cold starts
    # What dead owners left is removed once here, not as each run opens; no run is opened
    # beyond the inputs; a worker without an outbox runs as its container's own process
    # (create ahead; then start, wait, remove: no idling supervisor, no execs), and its
    # output, which a batch keeps none of, is not attached to.
    collect_garbage(orch.backend, orch.audit)
    return orch.pool(
        worker,
        size=max(1, min(concurrency, len(todo))),
        total=len(todo),
        keep_alive=False,
        gc=False,
        output=False,
        input_slot=True,
        **options,
    )


def _pooled(pool: WarmPool) -> RunOne:
    def one(item: BatchInput, staging: BatchStaging, started: Callable[[str], None]) -> RunResult:
        run = pool.take()
        run.staging = staging
        started(run.spec.run_id)
        try:
            run.place_inputs([LinkFree(item.path)])  # recorded as run.inputs
            run.run_worker()
            run.collect()
        except BaseException:
            run.close(failed=True)
            raise
        return run.close()

    return one


def _emitter(on_event: Callable[[Event], None] | None) -> Callable[[Event], None]:
    import threading

    lock = threading.Lock()

    def emit(event: Event) -> None:
        if on_event is not None:
            with lock:
                on_event(event)

    return emit


class _ignoring_signals:
    """SIGINT/SIGTERM ignored while cleaning up (a second Ctrl-C must not cut it short)."""

    def __enter__(self) -> None:
        self.previous = {}
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *_exc: object) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)
