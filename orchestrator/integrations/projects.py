"""What every harness adapter shares: one orchestrator per project, errors as one line."""

from __future__ import annotations

import threading
from pathlib import Path

from orchestrator.config import Project
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.runner import Orchestrator

__all__ = ["one_line", "orchestrator_for"]

_lock = threading.Lock()
_by_root: dict[Path, Orchestrator] = {}


def orchestrator_for(project: Project | Path) -> Orchestrator:
    """This process's one orchestrator of a project (a loaded one, or its root folder):
    the harness opens many sandboxes, the project is loaded and its audit log opened once."""
    root = project.root if isinstance(project, Project) else project
    with _lock:
        orch = _by_root.get(root)
        if orch is None:
            orch = _by_root[root] = Orchestrator(project)
        return orch


def one_line(exc: OrchestratorError) -> str:
    """An error as the one line a harness shows: a declaration error's problems, else its
    message's first line (or its kind, when it has none)."""
    if isinstance(exc, ConfigError):
        return "; ".join(exc.problems)
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
