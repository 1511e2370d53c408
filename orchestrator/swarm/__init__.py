"""Running workers on Docker Swarm: each run one ``replicated-job`` service.

``orchestrator run WORKER --engine swarm`` and ``orchestrator batch WORKER --engine swarm``
(see ``docs/scale-out.md``). :mod:`.render` turns a plan into a service (pure), :mod:`.engine`
talks to the swarm manager, :mod:`.run` is one run's lifecycle. Nothing in the core imports
this package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.swarm.engine import SwarmEngine, collect
from orchestrator.swarm.run import execute_swarm

if TYPE_CHECKING:
    from orchestrator.batch import BatchResult
    from orchestrator.batch.engine import RunOne
    from orchestrator.config import Worker
    from orchestrator.prepare import Prepared
    from orchestrator.runner import Orchestrator
    from orchestrator.runtime.run import OutputSink, RunResult

__all__ = ["SwarmEngine", "batch_on_swarm", "collect", "execute_swarm", "run_on_swarm"]


def run_on_swarm(
    orch: Orchestrator,
    prepared: Prepared,
    *,
    on_output: OutputSink | None = None,
    engine: SwarmEngine | None = None,
) -> RunResult:
    """``orch.run(prepared)`` as a swarm service: same audit log, staging and secrets."""
    from orchestrator.swarm.run import check, check_nodes

    swarm = engine or SwarmEngine()
    check(swarm, prepared)
    check_nodes(swarm, prepared)
    return execute_swarm(
        swarm,
        prepared,
        audit=orch.audit,
        staging=orch.staging,
        secrets=orch.secrets_for(prepared),
        on_output=on_output,
    )


def batch_on_swarm(
    orch: Orchestrator,
    worker: str | Worker,
    inputs: list[Any],
    *,
    engine: SwarmEngine | None = None,
    **batch_options: Any,
) -> BatchResult:
    """``orch.batch(...)`` with each input a swarm service (no warm pool: a service is
    made per input). ``batch_options`` are :meth:`Orchestrator.batch`'s."""
    swarm = engine or SwarmEngine()
    options = {
        k: v
        for k, v in batch_options.items()
        if k not in ("concurrency", "resume", "fail_fast", "on_event")
    }
    first = orch.prepare(worker, **options)  # refused here, before the batch folder exists
    from orchestrator.swarm.run import check, check_nodes

    check(swarm, first)
    check_nodes(swarm, first)  # once for the batch: every input binds the same folders

    def one(item: Any, staging: Any, started: Callable[[str], None]) -> RunResult:
        prepared = orch.prepare(worker, inputs=[item.path], **options)
        return execute_swarm(
            swarm,
            prepared,
            audit=orch.audit,
            staging=staging,
            secrets=orch.secrets_for(prepared),
            started=started,
        )

    run_one: RunOne = one
    return orch.batch(worker, inputs, run_one=run_one, cancel=swarm.remove_run, **batch_options)
