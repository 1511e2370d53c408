"""orchestrator: run AI workers in disposable, hardened containers whose access comes from
declarations.

The public API, imported lazily so that the command line starts fast. One object,
:class:`Orchestrator`, owns the engine, the project's audit log, the change store and the
secrets; every run and session goes through it::

    from orchestrator import Orchestrator

    orch = Orchestrator("examples/triage")
    result = orch.run("triage")              # audited; its outbox becomes a change set
    print(result.exit_code, result.outbox)

    with orch.open_session("triage") as session:
        session.list("/")                    # the granted zones
        session.exec("ls -l /input")         # inside the sandbox, as the worker's uid
"""

from __future__ import annotations

import importlib

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

#: ``typing.TYPE_CHECKING`` without importing typing: the entry point (``launcher``) imports
#: this package and nothing else that needs typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from orchestrator.config import Project, Worker, load_project, load_worker
    from orchestrator.docker import DockerEngine
    from orchestrator.plan import ContainerSpec, compile_plan
    from orchestrator.policy import Grant, grant_for
    from orchestrator.prepare import Prepared
    from orchestrator.runner import Orchestrator
    from orchestrator.runtime import RunResult
    from orchestrator.runtime.execs import ExecResult
    from orchestrator.runtime.session import Session, SessionClosed
    from orchestrator.sandbox import SandboxError

_LAZY = {
    "ContainerSpec": "orchestrator.plan",
    "DockerEngine": "orchestrator.docker",
    "ExecResult": "orchestrator.runtime.execs",
    "Grant": "orchestrator.policy",
    "Orchestrator": "orchestrator.runner",
    "Prepared": "orchestrator.prepare",
    "Project": "orchestrator.config",
    "RunResult": "orchestrator.runtime",
    "SandboxError": "orchestrator.sandbox",
    "Session": "orchestrator.runtime.session",
    "SessionClosed": "orchestrator.runtime.session",
    "Worker": "orchestrator.config",
    "compile_plan": "orchestrator.plan",
    "grant_for": "orchestrator.policy",
    "load_project": "orchestrator.config",
    "load_worker": "orchestrator.config",
}

__all__ = [
    "AuditError",
    "ConfigError",
    "ContainerSpec",
    "DockerEngine",
    "EngineError",
    "EngineUnreachable",
    "ExecResult",
    "Grant",
    "ImageBuildError",
    "ImageMissing",
    "Orchestrator",
    "OrchestratorError",
    "PolicyError",
    "Prepared",
    "Project",
    "RunResult",
    "SandboxError",
    "Session",
    "SessionClosed",
    "Worker",
    "compile_plan",
    "grant_for",
    "load_project",
    "load_worker",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
