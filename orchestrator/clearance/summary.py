"""What a clearance is about to do (shown before confirming) and what it did."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.escaping import escape

__all__ = [
    "ClearResult",
    "Summary",
    "SummaryFile",
    "clean_message",
    "commit_message",
    "trailer_value",
]

_TRAILER_VALUE_MAX = 128
_MESSAGE_MAX = 64 << 10


@dataclass(frozen=True)
class SummaryFile:
    """One file of the change set as the summary shows it."""

    path: str
    operation: str
    size: int
    mode: int | None


@dataclass(frozen=True)
class Summary:
    """Everything the person confirming needs to see, computed before anything changes."""

    change_id: str
    worker: str
    run_id: str
    trust: str
    message: str
    repo: Path
    branch: str
    new_branch: bool
    """The branch does not exist yet: it is created from HEAD."""
    work_tree: bool
    """The branch is checked out: files are written into the work tree and the index."""
    files: tuple[SummaryFile, ...]
    scans: tuple[str, ...]
    blocking: tuple[str, ...]
    override_scanners: bool
    push: bool
    remote: str | None
    credential: str | None
    passed: tuple[str, ...] = ()
    """Names of the scanners that found nothing."""
    resume: bool = False
    """Some paths already hold the change set's content (an interrupted clearance)."""
    commit: str | None = None
    """Set when the change set is committed already: only the push is left to do."""
    acknowledged: tuple[str, ...] = ()
    """Files that run code by themselves, acknowledged by name (``--ack-sensitive``)."""

    def render(self) -> str:
        """The summary as lines of text for a terminal (control characters shown escaped)."""
        return "\n".join(_printable(line) for line in self._lines())

    def _lines(self) -> list[str]:
        where = f"branch {self.branch}" + (" (new, from HEAD)" if self.new_branch else "")
        if not self.work_tree:
            where += "; the work tree and the checked-out branch are not touched"
        lines = [
            f"change set {self.change_id}: worker {self.worker}, run {self.run_id}, "
            f"trust {self.trust}",
            f"repository {self.repo}, {where}",
        ]
        if self.commit is not None:
            lines.append(f"already committed as {self.commit}")
        else:
            first = self.message.splitlines()[0] if self.message else ""
            lines.append(f"message: {first}")
            for item in self.files:
                mode = f" {item.mode:o}" if item.mode is not None else ""
                size = f"{item.size:>10,d} B" if item.operation != "delete" else " " * 12
                lines.append(f"  {item.operation:<6} {size}{mode:>5}  {item.path}")
            lines += [f"  ACKNOWLEDGED (runs code by itself): {p}" for p in self.acknowledged]
            state = "OVERRIDDEN" if self.override_scanners else "blocks clearance"
            lines += [f"  BLOCKING ({state}): {scan}" for scan in self.blocking]
            lines += [f"  scan: {scan}" for scan in self.scans if scan not in self.blocking]
            if self.passed:
                lines.append(f"  scanners with no findings: {', '.join(self.passed)}")
            elif not self.scans:
                lines.append("  scan: nothing found")
            if self.resume:
                lines.append("resuming: some files already hold this change set's content")
        if self.push:
            with_credential = f" with credential '{self.credential}'" if self.credential else ""
            lines.append(f"then push {self.branch} to '{self.remote}'{with_credential}")
        return lines


def _printable(text: str) -> str:
    """Every character that could drive a terminal or reorder text (a worker's commit
    message may hold them) shown escaped, as review listings show it."""
    return escape(text, keep="\\")


@dataclass(frozen=True)
class ClearResult:
    """The outcome of :func:`~orchestrator.clearance.clear`."""

    change_id: str
    commit: str | None
    """The commit holding the change set (None: marked committed but not found locally)."""
    branch: str
    files: int
    pushed: bool = False
    remote: str | None = None
    already: bool = False
    """It was committed before this call; nothing was applied again."""
    resumed: bool = False
    """An interrupted clearance was finished (the work tree already held some files)."""


def trailer_value(field: str, value: object) -> str:
    """A manifest value fit for a trailer: one short token, no spaces or control chars."""
    text = str(getattr(value, "value", value))
    if (
        not text
        or len(text) > _TRAILER_VALUE_MAX
        or any(c.isspace() or ord(c) < 0x20 for c in text)
    ):
        raise ValueError(f"{field} {text!r} cannot be written as a commit trailer")
    return text


def clean_message(message: object, worker: str) -> str:
    """A worker's commit message made safe: control characters dropped, lines trimmed,
    at most 64 KiB; a default when nothing is left."""
    text = str(message or "")[:_MESSAGE_MAX].replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(c for c in text if c in "\n\t" or (ord(c) >= 0x20 and ord(c) != 0x7F))
    body = "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")
    return body or f"Changes from worker {worker}"


def commit_message(change_id: str, message: str, trailers: dict[str, str]) -> str:
    """The cleaned message, then ``Staged-Id`` and ``trailers`` as the last paragraph.

    Whatever the worker's message holds, the trailer block written here is always the last
    paragraph, the only one read when a commit is matched to its change set.
    """
    body = clean_message(message, trailers.get("Worker", "unknown"))
    block = "".join(f"{key}: {value}\n" for key, value in trailers.items())
    return f"{body}\n\nStaged-Id: {change_id}\n{block}"
