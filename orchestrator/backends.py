"""Where runs run, by name: the one place a backend's name (``--engine``) becomes a backend.

:data:`~orchestrator.vocabulary.BACKENDS` names them: ``docker`` (a container on a
Docker-shaped engine: :class:`~orchestrator.runtime.container.ContainerBackend`) and
``swarm`` (a service on the swarm that engine manages:
:class:`~orchestrator.docker.swarm.SwarmBackend`). Each is imported when asked for, so
that ``plan`` loads no engine client it does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.vocabulary import BACKENDS

if TYPE_CHECKING:
    from orchestrator.docker.swarm import SwarmBackend
    from orchestrator.runtime.backend import Backend
    from orchestrator.runtime.container import ContainerBackend
    from orchestrator.runtime.engine import Engine

__all__ = ["backend_class", "make_backend"]


def backend_class(name: str) -> type[ContainerBackend] | type[SwarmBackend]:
    """The class of the backend called ``name`` (one of
    :data:`~orchestrator.vocabulary.BACKENDS`), imported now."""
    if name == "swarm":
        from orchestrator.docker.swarm import SwarmBackend

        return SwarmBackend
    if name != "docker":
        raise ValueError(f"backend {name!r}: one of {', '.join(BACKENDS)}")
    from orchestrator.runtime.container import ContainerBackend

    return ContainerBackend


def make_backend(name: str, *, engine: Engine | None = None) -> Backend:
    """The backend called ``name``; ``engine``: the container engine of the docker
    backend (default: Docker's, connected on first use)."""
    backend_class(name)  # an unknown name is refused here
    if name == "swarm":
        from orchestrator.docker.swarm import SwarmBackend

        return SwarmBackend()
    from orchestrator.runtime.container import ContainerBackend

    if engine is None:
        from orchestrator.docker import DockerEngine

        engine = DockerEngine()
    return ContainerBackend(engine)
