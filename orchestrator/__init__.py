"""orchestrator: run AI workers in disposable, hardened containers whose access comes from
declarations.

The public API, imported lazily so that the command line starts fast::

    from orchestrator import load_project, load_worker, prepare, execute, DockerEngine

    project = load_project("examples/triage")
    prepared = prepare(project, load_worker(project, "triage"))
    result = execute(DockerEngine(), prepared)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from orchestrator.errors import (
    AuditError,
    ConfigError,
    EngineError,
    EngineUnreachable,
    ImageBuildError,
    ImageMissing,
    OrchestratorError,
    PolicyError,
)

if TYPE_CHECKING:
    from orchestrator.config import Project, Worker, load_project, load_worker
    from orchestrator.docker import DockerEngine
    from orchestrator.plan import ContainerSpec, compile_plan
    from orchestrator.policy import Grant, grant_for
    from orchestrator.runtime import RunResult, collect, execute, prepare

_LAZY = {
    "ContainerSpec": "orchestrator.plan",
    "DockerEngine": "orchestrator.docker",
    "Grant": "orchestrator.policy",
    "Project": "orchestrator.config",
    "RunResult": "orchestrator.runtime",
    "Worker": "orchestrator.config",
    "collect": "orchestrator.runtime",
    "compile_plan": "orchestrator.plan",
    "execute": "orchestrator.runtime",
    "grant_for": "orchestrator.policy",
    "load_project": "orchestrator.config",
    "load_worker": "orchestrator.config",
    "prepare": "orchestrator.runtime",
}

__all__ = [
    "AuditError",
    "ConfigError",
    "ContainerSpec",
    "DockerEngine",
    "EngineError",
    "EngineUnreachable",
    "Grant",
    "ImageBuildError",
    "ImageMissing",
    "OrchestratorError",
    "PolicyError",
    "Project",
    "RunResult",
    "Worker",
    "collect",
    "compile_plan",
    "execute",
    "grant_for",
    "load_project",
    "load_worker",
    "prepare",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
