"""Runtime: the lifecycle of runs over an :class:`Engine`. Imports no engine SDK itself."""

from orchestrator.runtime.engine import (
    Containers,
    Engine,
    ExitState,
    Inventory,
    ManagedObject,
    Networks,
)
from orchestrator.runtime.gc import GcReport, collect
from orchestrator.runtime.preparation import Prepared, open_audit, prepare
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
    "Prepared",
    "RunResult",
    "collect",
    "execute",
    "open_audit",
    "prepare",
]
