"""Batches: one worker over many inputs, one disposable container per input.

::

    from orchestrator import Orchestrator

    orch = Orchestrator("examples/triage")
    result = orch.batch("triage", ["downloads/"], concurrency=4)
    print(result.summary())          # counts, the batch id, the change set of every outbox

See ``docs/batch.md``: inputs (:mod:`.inputs`), the batch folder and ``results.jsonl``
(:mod:`.folder`), the single change set keyed by input (:mod:`.staging`), threads,
retries, fail-fast and interruption (:mod:`.scheduler`), resume (:mod:`.runner`).
"""

from orchestrator.batch.folder import BATCHES_FOLDER, BatchFolder, BatchLocked
from orchestrator.batch.inputs import BatchInput, expand
from orchestrator.batch.runner import run_batch, worker_hash
from orchestrator.batch.scheduler import ATTEMPTS, DONE, WORKER_FAILED, BatchResult
from orchestrator.batch.staging import MANIFEST_NAME, BatchOutbox, BatchStaging

__all__ = [
    "ATTEMPTS",
    "BATCHES_FOLDER",
    "DONE",
    "MANIFEST_NAME",
    "WORKER_FAILED",
    "BatchFolder",
    "BatchInput",
    "BatchLocked",
    "BatchOutbox",
    "BatchResult",
    "BatchStaging",
    "expand",
    "run_batch",
    "worker_hash",
]
