"""What the runtime needs from a container engine, as typed protocols split by concern.

:class:`Containers` (one container's life), :class:`Networks` (a run's network and egress
proxy), :class:`CredentialProxies` (a run's credential proxy) and :class:`Inventory` (what
exists, for ``gc``) make up :class:`Engine`. The runtime
depends on these only and each function asks for the narrowest it uses;
``orchestrator.docker`` implements them with the Docker SDK, and the unit tests' fake is held
to the same behaviour by a contract test run against both. Implementations retry transient
engine failures themselves and raise :class:`~orchestrator.errors.EngineError` for everything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

from orchestrator.plan import ContainerSpec

Stream = Literal["stdout", "stderr"]
ObjectKind = Literal["container", "network", "volume"]


@dataclass(frozen=True)
class ImageDefaults:
    """What an image's configuration gives a process it starts."""

    user: str
    """Its ``USER`` (``0`` when it names none)."""
    workdir: str
    """Its ``WORKDIR`` (``/`` when it names none)."""


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


@dataclass(frozen=True)
class EgressLog:
    """The egress proxy's decisions on one run: those logged one by one, and how many
    requests were only counted (over the proxy's log budget for the run's worker, or over
    what a run keeps: :data:`orchestrator.egress.RUN_DENIED`) with the bytes their lines
    took. Counted requests are a flood; they are at least these many."""

    decisions: list[EgressDecision] = field(default_factory=list)
    unlisted_denied: int = 0
    unlisted_allowed: int = 0
    unlisted_bytes: int = 0

    @property
    def flooded(self) -> bool:
        return bool(self.unlisted_denied or self.unlisted_allowed)


class ExecHandle(Protocol):
    """A command running inside a container, started by :meth:`Engine.exec`."""

    frames: Iterator[tuple[Stream, bytes]]

    def exit_code(self) -> int | None:
        """The command's exit code once its output has ended (None while running).

        Raises :class:`~orchestrator.errors.StartFailure` (with the code, 126 or 127) when
        the engine could not start the command at all."""


class Containers(Protocol):
    """One container's life: create, run, exec into, stop and remove it."""

    def image_exists(self, image: str) -> bool: ...

    def runtime_for(self, spec: ContainerSpec) -> str:
        """The engine's runtime for ``spec``'s isolation, checked to be there: raise
        EngineError naming the set-up step when it is not."""

    def pins_mounts(self) -> bool:
        """Whether a bind mount this process makes is what the engine sees at that path
        (it runs in this mount namespace), so mount sources can be pinned
        (:mod:`orchestrator.runtime.mount_sources`)."""

    def create(self, spec: ContainerSpec) -> str:
        """Create (not start) a container for ``spec``; return its id."""

    def attach(self, container_id: str) -> Iterator[tuple[Stream, bytes]]:
        """Attach to a created container's output; iterate until it exits."""

    def start(self, container_id: str) -> None:
        """Start a created container. Raise :class:`~orchestrator.errors.StartFailure`
        when its command cannot run (not found: 127, not runnable: 126)."""

    def wait(self, container_id: str, timeout: float | None) -> int | None:
        """Block until exit; return the exit code, or None when ``timeout`` passed first."""

    def exit_state(self, container_id: str) -> ExitState:
        """How a stopped container ended (its exit code; whether it was OOM-killed)."""

    def memory_peaked(self, container_id: str) -> bool:
        """Whether a running container's memory use has reached its limit at some point
        (the cgroup's high-water mark); False when the engine cannot tell."""

    def kill(self, container_id: str) -> None:
        """SIGKILL the container; no error when it has already stopped."""

    def remove(self, container_id: str) -> bool:
        """Force-remove the container; True when it is gone (also when it never existed)."""

    def image_argv(self, image: str, command: list[str] | None) -> list[str]:
        """What ``docker run`` would execute: the image's entrypoint, then ``command`` or
        the image's own command. Needed to run a worker by ``exec``."""

    def image_defaults(self, image: str) -> ImageDefaults:
        """The user and working folder the image's processes start with."""

    def exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecHandle:
        """Start ``argv`` inside a running container and attach to its output.

        With ``stdin``, those bytes are fed to the command, then end of file; without it the
        command's standard input is empty (``/dev/null``). Raise
        :class:`~orchestrator.errors.ContainerStopped` when the container is not running."""


class Networks(Protocol):
    """The network a run's plan names, and the egress proxy behind an allowlist."""

    def set_up_network(self, spec: ContainerSpec) -> ManagedObject | None:
        """Create or reuse the network (and egress proxy) ``spec``'s network mode needs.
        Return the run's own network, which the run removes when it ends (None: nothing
        of the run's own, e.g. a network shared by a project's runs)."""

    def network_decisions(self, spec: ContainerSpec, since: datetime) -> EgressLog:
        """The egress proxy's decisions on this run's requests since ``since`` (empty
        without one)."""

    def collect_shared(self, idle_seconds: float) -> list[str]:
        """Remove shared objects (proxies, networks) that no container uses any more."""


class CredentialProxies(Protocol):
    """A run's credential proxy (:mod:`orchestrator.credproxy`): egress credentials are
    written into requests there, and the worker holds only placeholders."""

    def image_ca_bundle(self, image: str) -> bytes:
        """The system CA bundle inside ``image`` (empty when it has none)."""

    def start_credential_proxy(self, spec: ContainerSpec, state: Path, user: str) -> str:
        """Start ``spec``'s credential proxy on the run's network (made already), with the
        host folder ``state`` read-only at its state folder, as ``user``; return its
        container id once it accepts connections (removed again on failure). Raise
        EngineError when this engine cannot run one."""

    def credential_proxy_log(self, container_id: str) -> str:
        """The proxy's output, its event lines among others (empty when it is gone)."""


class Inventory(Protocol):
    """Everything the orchestrator created on the engine, for ``gc`` and clean-up."""

    def list_managed(self) -> list[ManagedObject]:
        """Every container, network and volume carrying the orchestrator's labels."""

    def remove_object(self, obj: ManagedObject) -> bool:
        """Remove one managed object; True when it is gone."""


class Engine(Containers, Networks, CredentialProxies, Inventory, Protocol):
    """An engine as one run and ``gc`` use it: every concern, and a liveness check."""

    def ping(self) -> None:
        """Raise EngineUnreachable unless the engine answers."""

    def flavour(self) -> str:
        """Which engine answers: ``docker`` or ``podman`` (a run records it as its
        ``engine``)."""
