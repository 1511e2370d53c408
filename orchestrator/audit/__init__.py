"""The audit log: an append-only, hash-chained record of what the orchestrator did.

The log is ``<sandbox root>/audit.jsonl``, one JSON object per line. Each entry carries
the hash of the one before it (``prev``) and its own ``hash`` over ``prev`` plus its
canonical JSON, so editing, deleting or reordering lines is detected by
:meth:`AuditLog.verify`. Registered secret values never reach the file::

    log = AuditLog(project.sandbox_root / "audit.jsonl", redact=[token])
    log.record("run.started", worker="reader", run_id=run_id, zone="inbox")
    log.record("policy.denied", allowed=False, reason="zone 'secrets' not granted")
    for entry in log.query(AuditFilter(run=run_id)):
        ...
    assert log.verify().ok

Appends are serialised across processes with a lock file and are durable (``fsync``)
when :meth:`AuditLog.record` returns. See ``docs/audit.md`` for the file format, the
chain and prune rules, and the command line.
"""

from orchestrator.audit.chain import ChainProblem, VerifyResult
from orchestrator.audit.entry import GENESIS_HASH, PRUNE_OPERATION, AuditEntry
from orchestrator.audit.filters import AuditFilter
from orchestrator.audit.log import AuditLog
from orchestrator.audit.prune import PruneResult
from orchestrator.audit.redact import MIN_SECRET_LENGTH, REDACTED
from orchestrator.audit.timeutil import parse_duration, parse_time

__all__ = [
    "GENESIS_HASH",
    "MIN_SECRET_LENGTH",
    "PRUNE_OPERATION",
    "REDACTED",
    "AuditEntry",
    "AuditFilter",
    "AuditLog",
    "ChainProblem",
    "PruneResult",
    "VerifyResult",
    "parse_duration",
    "parse_time",
]
