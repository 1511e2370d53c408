"""Removing a run's container: never raises, and waits out an engine that is restarting."""

from __future__ import annotations

import logging
import time
from typing import Literal

from orchestrator import labels
from orchestrator.errors import EngineError, EngineUnreachable, OrchestratorError
from orchestrator.runtime.engine import Engine, Inventory

log = logging.getLogger(__name__)

#: Removal refusals by an engine that answers before the container is given up.
REMOVE_ATTEMPTS = 3
#: How long removal waits for an engine that stopped answering (e.g. while it restarts).
ENGINE_RETURN_S = 30.0
ENGINE_POLL_S = 0.25


class Interrupted(BaseException):
    """The orchestrator was told to stop (SIGINT or SIGTERM) while a run was in flight."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


def remove_container(engine: Engine, container_id: str) -> bool:
    """Remove the container; never raises, so it cannot hide the run's own outcome.

    A removal refused by an engine that answers is tried :data:`REMOVE_ATTEMPTS` times. An
    engine that stops answering (restarting, say) is waited for, up to
    :data:`ENGINE_RETURN_S` seconds, before the removal is tried again: giving up while it
    is down would leave the container behind until the next ``gc``.
    """
    deadline = time.monotonic() + ENGINE_RETURN_S
    refused = 0
    while True:
        try:
            return engine.remove(container_id)
        except EngineUnreachable:
            log.warning(
                "the container engine stopped answering while removing container %s; waiting "
                "up to %g s for it to come back",
                container_id[:12],
                ENGINE_RETURN_S,
            )
        except EngineError as exc:
            log.warning("removing container %s failed: %s", container_id[:12], exc)
        except Interrupted:
            continue  # a second Ctrl-C must not leave the container behind
        answer = _await_engine(engine, deadline)
        if answer == "gone":
            log.error(
                "the container engine did not answer for %g s, so container %s was left "
                "behind; once the engine is back, `orchestrator gc` removes it",
                ENGINE_RETURN_S,
                container_id[:12],
            )
            return False
        if answer == "up":  # answering, yet refusing: only a few more tries
            refused += 1
            if refused >= REMOVE_ATTEMPTS:
                return False
            _sleep(0.2 * refused)


def _await_engine(engine: Engine, deadline: float) -> Literal["up", "back", "gone"]:
    """Ping until the engine answers: "up" at once, "back" after a wait, "gone" at ``deadline``."""
    waited = False
    while True:
        try:
            engine.ping()
        except OrchestratorError:
            pass
        except Interrupted:
            continue  # the wait is bounded; the container must still go
        else:
            return "back" if waited else "up"
        if time.monotonic() >= deadline:
            return "gone"
        waited = True
        _sleep(min(ENGINE_POLL_S, max(0.0, deadline - time.monotonic())))


def _sleep(seconds: float) -> None:
    """Sleep through a Ctrl-C or SIGTERM: cleanup waits are bounded, and must finish."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            time.sleep(left)
        except Interrupted:
            continue


def remove_run(engine: Inventory, run_id: str) -> None:
    """Remove every container of ``run_id`` (a child cancelled with its parent)."""
    for obj in engine.list_managed():
        if obj.kind == "container" and obj.labels.get(labels.RUN_ID) == run_id:
            try:
                engine.remove_object(obj)
            except EngineError as exc:
                log.warning("could not remove %s of run %s: %s", obj.name, run_id, exc)
