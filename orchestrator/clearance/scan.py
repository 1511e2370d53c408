"""Running the content scanners before clearance, and what their results mean for it.

By default the staging package's scanners run (its ``run_scanners`` and ``blocking``);
tests and other stores pass their own :class:`~orchestrator.clearance.store.Scanners`.
Results are shown one finding per line: ``scanner: path: what was seen``.

The ``sensitive-paths`` scanner's findings (files that run code by themselves) are not
overridden with the other blocking findings: `clear` wants each path acknowledged by name,
so they are kept apart, as :attr:`ScanOutcome.sensitive`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from orchestrator.clearance.store import ChangeSet, ChangeStore, ScanFinding, Scanners
from orchestrator.staging.scanners import SENSITIVE

if TYPE_CHECKING:
    from orchestrator.staging import Scanner

__all__ = ["ScanOutcome", "StagingScanners", "describe", "scan"]


@dataclass(frozen=True)
class ScanOutcome:
    """Every finding, and those that block clearance, as one line of text each."""

    findings: tuple[str, ...]
    blocking: tuple[str, ...]
    passed: tuple[str, ...] = ()
    """Names of the scanners that found nothing."""
    sensitive: tuple[str, ...] = ()
    """Paths that run code by themselves: clearing them needs each acknowledged by name."""


class StagingScanners:
    """The staging package's scanners (its defaults, or the ``scanners`` given)."""

    def __init__(self, scanners: Sequence[Scanner] | None = None) -> None:
        self.scanners = scanners

    def run(self, changeset: ChangeSet, store: ChangeStore) -> Sequence[ScanFinding]:
        from orchestrator import staging

        # Clearance reads change sets through its own Protocols; these came from the
        # staging store, so they are the staging package's own types.
        change = cast("staging.ChangeSet", changeset)
        real = cast("staging.ChangeStore", store)
        if self.scanners is None:
            return staging.run_scanners(change, real)
        return staging.run_scanners(change, real, self.scanners)

    def blocking(self, results: Sequence[ScanFinding]) -> Sequence[ScanFinding]:
        from orchestrator import staging

        return staging.blocking(cast("Sequence[staging.ScanResult]", results))


def describe(result: object) -> list[str]:
    """One line per finding of ``result`` (a staging ScanResult, or anything printable)."""
    name = getattr(result, "name", None)
    findings = getattr(result, "findings", None)
    if name is None or findings is None:
        return [str(result)]
    lines = []
    for finding in findings:
        path = getattr(finding, "path", "")
        message = getattr(finding, "message", str(finding))
        lines.append(f"{name}: {path}: {message}" if path else f"{name}: {message}")
    if not lines and getattr(result, "ok", True) is False:
        lines.append(f"{name}: failed")
    return lines


def scan(scanners: Scanners | None, changeset: ChangeSet, store: ChangeStore) -> ScanOutcome:
    """Run ``scanners`` (the staging package's when None) over ``changeset``."""
    runner = scanners if scanners is not None else StagingScanners()
    results = list(runner.run(changeset, store))
    blocked = list(runner.blocking(results))
    blocking = blocked
    sensitive = [
        str(getattr(finding, "path", ""))
        for result in blocked
        if getattr(result, "name", None) == SENSITIVE
        for finding in getattr(result, "findings", ())
    ]
    if sensitive and all(sensitive):  # a finding without a path (a crash) blocks as usual
        blocking = [r for r in blocking if getattr(r, "name", None) != SENSITIVE]
    else:
        sensitive = []
    return ScanOutcome(
        findings=tuple(line for result in results for line in describe(result)),
        blocking=tuple(line for result in blocking for line in describe(result)),
        passed=tuple(
            str(getattr(r, "name", r)) for r in results if not describe(r) and r not in blocked
        ),
        sensitive=tuple(dict.fromkeys(sensitive)),
    )
