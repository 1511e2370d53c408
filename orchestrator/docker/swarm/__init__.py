"""Running workers on Docker Swarm: each run one ``replicated-job`` service.

``orchestrator run WORKER --engine swarm`` and ``orchestrator batch WORKER --engine swarm``
(see ``docs/scale-out.md``) give the :class:`~orchestrator.Orchestrator` a
:class:`SwarmBackend` (:mod:`.backend`), and its runs go through the one run lifecycle.
:mod:`.render` turns a plan into a service (pure), :mod:`.engine` talks to the swarm
manager, :mod:`.nodes` checks that every node has what a run binds, :mod:`.egress` renders
the egress proxy as a service. Nothing in the core imports this package.
"""

from __future__ import annotations

from orchestrator.docker.swarm.backend import SwarmBackend
from orchestrator.docker.swarm.engine import SwarmEngine, collect

__all__ = ["SwarmBackend", "SwarmEngine", "collect"]
