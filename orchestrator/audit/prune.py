"""Dropping old entries while keeping the rest verifiable.

A prune removes the longest run of entries at the head of the log whose timestamps are
before the cutoff (the chain only allows removing a prefix), and writes in their place
one anchor entry of operation ``audit.pruned``. The anchor's ``prev`` and its
``metadata.last_pruned_hash`` are both the hash of the last removed entry, which is what
the first kept entry's ``prev`` already holds; kept entries are copied byte for byte.
See :mod:`orchestrator.audit.chain` for how verification treats the anchor.

Lines that are not entries (torn writes) are dropped and counted in the anchor. A log
whose chain is broken is not pruned: that would destroy the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from orchestrator.audit.chain import ChainWalker
from orchestrator.audit.entry import PRUNE_OPERATION, encode_line, is_anchor, new_id
from orchestrator.audit.files import atomic_rewrite, audit_error, iter_lines
from orchestrator.audit.timeutil import TIMESTAMP_LENGTH, format_timestamp, parse_timestamp
from orchestrator.errors import AuditError

__all__ = ["PruneResult", "prune_locked"]


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune did: entries ``dropped``, entries ``kept`` (the new anchor not
    counted), and ``damaged`` lines that were not entries and were dropped too."""

    dropped: int
    kept: int
    damaged: int = 0


def _older(stamp: object, cutoff: str) -> bool:
    if not isinstance(stamp, str):
        return False
    if len(stamp) != TIMESTAMP_LENGTH or not stamp.endswith("Z"):
        try:
            stamp = format_timestamp(parse_timestamp(stamp))
        except ValueError:
            return False
    return stamp < cutoff


@dataclass
class _Plan:
    """The outcome of the reading pass: what to drop and what the anchor says."""

    dropped: int = 0
    kept: int = 0
    damaged: frozenset[int] = frozenset()
    first_kept_line: int = 0
    head: str = ""
    first_timestamp: str | None = None
    last_timestamp: str | None = None
    previous_total: int = 0


def _plan(handle: BinaryIO, size: int, cutoff: str, path: Path) -> _Plan:
    plan = _Plan()
    walker = ChainWalker()
    damaged: set[int] = set()
    in_prefix = True
    for number, raw in enumerate(iter_lines(handle, size), start=1):
        record = walker.feed(number, raw)
        if record is None:
            damaged.add(number)
            continue
        if walker.problem_count > len(damaged):
            problem = walker.last_problem
            raise AuditError(
                f"cannot prune audit log {path}: {problem}; the log is left unchanged — "
                "inspect it with `orchestrator audit verify` before pruning"
            )
        if not in_prefix:
            plan.kept += 1
        elif walker.count == 1 and is_anchor(record):
            metadata: dict[str, Any] = record["metadata"]
            plan.previous_total = int(metadata.get("pruned_total", 0) or 0)
            plan.first_timestamp = metadata.get("first_timestamp")
        elif _older(record.get("timestamp"), cutoff):
            plan.dropped += 1
            plan.head = walker.expected
            plan.first_timestamp = plan.first_timestamp or str(record["timestamp"])
            plan.last_timestamp = str(record["timestamp"])
        else:
            in_prefix = False
            plan.first_kept_line = number
            plan.kept += 1
    plan.damaged = frozenset(damaged)
    return plan


def prune_locked(path: Path, cutoff: datetime, now: datetime) -> PruneResult:
    """Drop the entries of the log at ``path`` older than ``cutoff``.

    The caller must hold the log's exclusive lock. Nothing is rewritten when no entry is
    old enough. Raises :class:`AuditError` when the log cannot be read or replaced, or
    when its chain is broken.
    """
    cutoff_text = format_timestamp(cutoff)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return PruneResult(dropped=0, kept=0)
    except OSError as exc:
        raise audit_error(path, "read", exc) from None
    with handle:
        try:
            size = handle.seek(0, 2)
            plan = _plan(handle, size, cutoff_text, path)
            if plan.dropped == 0:
                return PruneResult(dropped=0, kept=plan.kept, damaged=len(plan.damaged))
            anchor, _ = encode_line(
                {
                    "id": new_id(),
                    "timestamp": format_timestamp(now),
                    "operation": PRUNE_OPERATION,
                    "allowed": True,
                    "reason": None,
                    "worker": None,
                    "run_id": None,
                    "session_id": None,
                    "trust_level": None,
                    "zone": None,
                    "path": None,
                    "metadata": {
                        "pruned": plan.dropped,
                        "pruned_total": plan.previous_total + plan.dropped,
                        "first_timestamp": plan.first_timestamp,
                        "last_timestamp": plan.last_timestamp,
                        "last_pruned_hash": plan.head,
                        "cutoff": cutoff_text,
                        "damaged_lines_dropped": len(plan.damaged),
                    },
                    "prev": plan.head,
                }
            )

            def write(out: BinaryIO) -> None:
                out.write(anchor)
                if plan.kept == 0:
                    return
                for number, raw in enumerate(iter_lines(handle, size), start=1):
                    if number >= plan.first_kept_line and number not in plan.damaged:
                        out.write(raw + b"\n")

            atomic_rewrite(path, write)
        except OSError as exc:
            raise audit_error(path, "prune", exc) from None
    return PruneResult(dropped=plan.dropped, kept=plan.kept, damaged=len(plan.damaged))
