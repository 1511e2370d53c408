"""Runtime: the lifecycle of runs over an :class:`Engine`. Imports no engine SDK itself.

A run is prepared (checked and compiled, touching nothing) by :mod:`orchestrator.prepare`.
"""

from orchestrator.runtime.engine import (
    Containers,
    Engine,
    ExitState,
    Inventory,
    ManagedObject,
    Networks,
)
from orchestrator.runtime.gc import GcReport, collect
from orchestrator.runtime.host_folders import open_audit
from orchestrator.runtime.run import Interrupted, RunResult, execute

__all__ = [
    "Containers",
    "Engine",
    "ExitState",
    "GcReport",
    "Interrupted",
    "Inventory",
    "ManagedObject",
    "Networks",
    "RunResult",
    "collect",
    "execute",
    "open_audit",
]
