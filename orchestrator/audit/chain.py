"""Checking the hash chain, line by line.

The rules :func:`verify_file` applies, in order, to each line (numbered from 1):

1. The line must be a JSON object with well-formed ``prev`` and ``hash`` (a torn write
   leaves a line that is not); such a line is reported and skipped, and the chain goes on
   from the last entry before it.
2. ``hash`` must equal ``sha256(prev + canonical JSON of the rest)``; otherwise the line
   was edited.
3. ``prev`` must equal the hash of the entry before it; otherwise a line was deleted,
   inserted or moved. The first entry's ``prev`` must be 64 zeros, unless it is a prune
   anchor.
4. A prune anchor is a first entry of operation ``audit.pruned`` whose ``prev`` (not
   zeros) equals its ``metadata.last_pruned_hash``: the hash of the last entry the prune
   removed. The anchor is transparent: the entry after it must carry that same ``prev``,
   exactly as it did before the prune, so kept entries are never rewritten.
5. The last line must end with a newline; a missing one means the last write was cut
   short (the next append completes the line).

After a problem the check goes on from the offending line's own hash, so one edit is
reported once and every independent problem is listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.audit.entry import GENESIS_HASH, chain_hash, decode_line, is_anchor
from orchestrator.audit.files import audit_error, ends_with_newline, iter_lines, open_snapshot

__all__ = ["MAX_PROBLEMS", "ChainProblem", "ChainWalker", "VerifyResult", "verify_file"]

#: At most this many problems are kept in a :class:`VerifyResult`.
MAX_PROBLEMS = 100


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One line that breaks the log: its 1-based number and what is wrong with it."""

    line: int
    reason: str

    def __str__(self) -> str:
        """Return ``line N: reason``."""
        return f"line {self.line}: {self.reason}"


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The outcome of checking a whole log.

    ``count`` is the number of lines that are entries (damaged lines excluded; a prune
    anchor included). ``line`` and ``reason`` describe the first problem; ``problems``
    lists up to :data:`MAX_PROBLEMS` of them in file order.
    """

    ok: bool
    count: int
    line: int | None = None
    reason: str | None = None
    problems: tuple[ChainProblem, ...] = field(default=())

    def __str__(self) -> str:
        """Return a one-line summary."""
        if self.ok:
            return f"{self.count} entries, chain intact"
        return f"chain broken at line {self.line}: {self.reason}"


class ChainWalker:
    """Feed lines in order; collects problems and counts entries."""

    def __init__(self) -> None:
        """Start before the first line of a log."""
        self.expected = GENESIS_HASH
        self.count = 0
        self.problems: list[ChainProblem] = []
        self.problem_count = 0
        self.last_problem: ChainProblem | None = None
        self._last_entry_line = 0

    def _report(self, line: int, reason: str) -> None:
        self.problem_count += 1
        self.last_problem = ChainProblem(line, reason)
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(self.last_problem)

    def feed(self, line: int, raw: bytes) -> dict[str, Any] | None:
        """Check line number ``line``; return its record, or None when it is damaged."""
        if not raw.strip():
            self._report(line, "empty line")
            return None
        try:
            record = decode_line(raw)
        except ValueError as exc:
            self._report(line, str(exc))
            return None
        first = self.count == 0
        self.count += 1
        stored = str(record["hash"])
        prev = str(record["prev"])
        if chain_hash(record) != stored:
            self._report(line, "content does not match its hash: the line was edited")
        elif first and is_anchor(record):
            self.expected = prev  # transparent: the next entry chains from the same hash
            self._last_entry_line = line
            return record
        elif prev != self.expected:
            self._report(line, self._break_reason(first))
        self.expected = stored
        self._last_entry_line = line
        return record

    def _break_reason(self, first: bool) -> str:
        if first:
            return (
                "the first entry's prev is not 64 zeros and it is no prune anchor: "
                "entries before it were removed"
            )
        before = self._last_entry_line
        return (
            f"prev does not match the hash of line {before}: a line was deleted, inserted "
            f"or moved here, or line {before} was rewritten"
        )

    def finish(self, last_line: int, newline_at_end: bool, last_damaged: bool) -> None:
        """Report a last line with no newline (when it was not reported already)."""
        if last_line and not newline_at_end and not last_damaged:
            self._report(
                last_line,
                "no newline at the end: the write was cut short (the next append ends it)",
            )

    def result(self) -> VerifyResult:
        """Return the outcome so far."""
        if not self.problems:
            return VerifyResult(ok=True, count=self.count)
        first = self.problems[0]
        return VerifyResult(
            ok=False,
            count=self.count,
            line=first.line,
            reason=first.reason,
            problems=tuple(self.problems),
        )


def verify_file(path: Path) -> VerifyResult:
    """Check the whole log at ``path``; a missing log is intact and empty."""
    snapshot = open_snapshot(path)
    if snapshot is None:
        return VerifyResult(ok=True, count=0)
    handle, size = snapshot
    walker = ChainWalker()
    number = 0
    last_damaged = False
    with handle:
        try:
            for number, raw in enumerate(iter_lines(handle, size), start=1):
                last_damaged = walker.feed(number, raw) is None
            newline_at_end = ends_with_newline(handle.fileno(), size)
        except OSError as exc:
            raise audit_error(path, "read", exc) from None
    walker.finish(number, newline_at_end, last_damaged)
    return walker.result()
