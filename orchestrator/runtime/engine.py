"""What the runtime needs from a container engine, as a typed protocol.

The runtime depends on this protocol only; ``orchestrator.docker`` implements it with the
Docker SDK, and tests may pass a fake. Implementations retry transient engine failures
themselves and raise :class:`~orchestrator.errors.EngineError` for everything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from orchestrator.plan import ContainerSpec

Stream = Literal["stdout", "stderr"]
ObjectKind = Literal["container", "network", "volume"]


@dataclass(frozen=True)
class ExitState:
    """How a container ended."""

    exit_code: int
    oom_killed: bool


@dataclass(frozen=True)
class ManagedObject:
    """A labelled engine object the orchestrator created."""

    kind: ObjectKind
    id: str
    name: str
    labels: dict[str, str]


@dataclass(frozen=True)
class EgressDecision:
    """One request the egress proxy allowed or denied."""

    host: str
    port: int
    allowed: bool
    method: str


class ExecHandle(Protocol):
    """A command running inside a container, started by :meth:`Engine.exec`."""

    frames: Iterator[tuple[Stream, bytes]]

    def exit_code(self) -> int | None:
        """The command's exit code once its output has ended (None while running)."""


class Engine(Protocol):
    """The container operations one run and ``gc`` use."""

    def ping(self) -> None:
        """Raise EngineUnreachable unless the engine answers."""

    def image_exists(self, image: str) -> bool: ...

    def create(self, spec: ContainerSpec) -> str:
        """Create (not start) a container for ``spec``; return its id."""

    def attach(self, container_id: str) -> Iterator[tuple[Stream, bytes]]:
        """Attach to a created container's output; iterate until it exits."""

    def start(self, container_id: str) -> None: ...

    def wait(self, container_id: str, timeout: float | None) -> int | None:
        """Block until exit; return the exit code, or None when ``timeout`` passed first."""

    def exit_state(self, container_id: str) -> ExitState: ...

    def kill(self, container_id: str) -> None:
        """SIGKILL the container; no error when it has already stopped."""

    def remove(self, container_id: str) -> bool:
        """Force-remove the container; True when it is gone (also when it never existed)."""

    def image_argv(self, image: str, command: list[str] | None) -> list[str]:
        """What ``docker run`` would execute: the image's entrypoint, then ``command`` or
        the image's own command. Needed to run a worker by ``exec``."""

    def exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecHandle:
        """Start ``argv`` inside a running container and attach to its output."""

    def prepare_network(self, spec: ContainerSpec) -> None:
        """Create or reuse the network (and egress proxy) ``spec`` names."""

    def network_decisions(self, spec: ContainerSpec, since: datetime) -> list[EgressDecision]:
        """The egress proxy's decisions on this run's requests (empty without one)."""

    def collect_shared(self, idle_seconds: float) -> list[str]:
        """Remove shared objects (proxies, networks) that no container uses any more."""

    def list_managed(self) -> list[ManagedObject]:
        """Every container, network and volume carrying the orchestrator's labels."""

    def remove_object(self, obj: ManagedObject) -> bool:
        """Remove one managed object; True when it is gone."""
