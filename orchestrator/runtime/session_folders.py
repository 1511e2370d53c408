"""Session folders (``<sandbox root>/sessions/<id>``): removed when empty, pruned when old.

A run with a new session removes that session's folder at its end when the worker left it
empty, so one-off runs leave nothing behind. Sessions that hold something stay until
``orchestrator gc --sessions-older-than AGE`` prunes them: their age is the time since a
run last started in them (each run start touches the folder), and a session a live
container still uses (its session label) is never pruned.

A session folder is the worker's to fill, so its content is hostile: nothing here follows
a link. An empty folder is removed with ``rmdir`` (which fails on anything that holds an
entry, and on a link), a full one with :func:`shutil.rmtree`, which on Linux walks by
directory descriptors and removes links instead of following them.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import labels
from orchestrator.audit import AuditLog
from orchestrator.hostfs.flags import DIR_FLAGS
from orchestrator.runtime.engine import Inventory, ManagedObject

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def remove_if_empty(folder: Path) -> bool:
    """Remove ``folder`` when it is an empty folder (never a link); True when removed."""
    try:
        parent = os.open(folder.parent, DIR_FLAGS)
    except OSError:
        return False
    try:
        os.rmdir(folder.name, dir_fd=parent)  # ENOTEMPTY, ENOTDIR (a link), ENOENT: kept
    except OSError:
        return False
    finally:
        os.close(parent)
    return True


def touch(folder: Path) -> None:
    """Mark a session as used now (its age for pruning starts again)."""
    os.utime(folder, follow_symlinks=False)


def parse_duration(text: str) -> float:
    """Seconds in a human duration: ``90s``, ``30m``, ``12h``, ``7d``, ``2w``, ``1d12h``."""
    compact = text.strip().lower().replace(" ", "")
    if not compact or _DURATION.sub("", compact):
        raise ValueError(
            f"'{text}' is not a duration; use a number with s, m, h, d or w, e.g. 7d or 12h"
        )
    return sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(compact))


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def sessions_in_use(engine: Inventory) -> set[str]:
    """Sessions of containers whose owner may still be running (alive, or not ours to judge)."""
    return {
        obj.labels[labels.SESSION]
        for obj in engine.list_managed()
        if obj.kind == "container"
        and obj.labels.get(labels.SESSION)
        and labels.owner_state(obj.labels) != "gone"
    }


@dataclass(frozen=True)
class PrunedSession:
    session_id: str
    path: Path
    age_s: float


@dataclass
class SessionPrune:
    """What :func:`prune_sessions` did."""

    removed: list[PrunedSession] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)
    kept: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


def prune_sessions(
    sessions_dir: Path, older_than_s: float, in_use: set[str], *, now: float | None = None
) -> SessionPrune:
    """Remove session folders unused for longer than ``older_than_s`` seconds.

    Sessions in ``in_use`` are kept whatever their age; entries that are not plain folders
    (a link, a file) are reported as failures and left alone.
    """
    report = SessionPrune()
    now = time.time() if now is None else now
    try:
        entries = sorted(os.scandir(sessions_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return report
    for entry in entries:
        info = entry.stat(follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            report.failed.append((entry.name, "not a folder (a link or a file); left alone"))
            continue
        age = now - info.st_mtime
        if age <= older_than_s:
            report.kept += 1
            continue
        if entry.name in in_use:
            report.in_use.append(entry.name)
            continue
        path = Path(entry.path)
        problem = _remove_tree(path)
        if problem:
            report.failed.append((entry.name, problem))
        else:
            report.removed.append(PrunedSession(entry.name, path, age))
    return report


def _remove_tree(path: Path) -> str | None:
    """Remove a folder and everything in it without following links; the first problem."""
    if not shutil.rmtree.avoids_symlink_attacks:  # the fd-based walk exists on Linux
        return "this platform's rmtree may follow links; remove the folder by hand"
    problems: list[str] = []

    def note(_func: object, where: str, info: tuple[object, BaseException, object]) -> None:
        problems.append(f"{where}: {info[1]}")

    shutil.rmtree(path, onerror=note)
    return problems[0] if problems else None


def prune_old_sessions(
    engine: Inventory, sandbox_root: Path, older_than_s: float, audit: AuditLog
) -> SessionPrune:
    """:func:`prune_sessions` over a project's sessions, each removal audited."""
    report = prune_sessions(sandbox_root / "sessions", older_than_s, sessions_in_use(engine))
    for pruned in report.removed:
        audit.record(
            "gc.session_removed",
            session_id=pruned.session_id,
            path=pruned.path,
            metadata={"age_s": round(pruned.age_s), "older_than_s": older_than_s},
        )
    for name, problem in report.failed:
        audit.record("gc.session_failed", allowed=False, reason=problem, session_id=name)
    return report


def remove_empty_sessions(
    engine: Inventory, sandbox_root: Path, removed: list[ManagedObject]
) -> list[str]:
    """After gc removed dead runs' containers (``removed``): remove their session folders
    that are empty, as the runs themselves would have at their end. A session a live
    container still uses is kept, empty or not."""
    dead = {o.labels.get(labels.SESSION) for o in removed if o.kind == "container"}
    names = {s for s in dead - sessions_in_use(engine) if s and "/" not in s and "\0" not in s}
    candidates = sorted(names - {".", ".."})  # a label names one folder, never a path
    return [s for s in candidates if remove_if_empty(sandbox_root / "sessions" / s)]
