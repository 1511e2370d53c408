"""What the builder asks of a container engine, in no engine's terms.

A build step is a container made from the step's parent image: a ``RUN`` starts it (a
hardened run under gVisor's build runtime), a ``COPY`` only puts an archive into it; then
its layer is committed with the image's configuration. :class:`StepEngine` is that seam;
:class:`orchestrator.docker.build.DockerStepEngine` implements it with the Docker SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from orchestrator.policy.grant import Limits
from orchestrator.runtime.engine import EgressLog

#: Docker's default capabilities less NET_RAW (raw sockets), MKNOD (device files in a
#: layer) and AUDIT_WRITE: what a root step needs to install packages and add users.
STEP_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
                     "SETPCAP", "SETFCAP", "NET_BIND_SERVICE", "SYS_CHROOT")  # fmt: skip
#: What one entry of a layer (a file, a folder, a link, a deletion: whatever its kind and
#: size) counts towards the disk limits on top of its bytes: a block of its own, so a
#: step making many empty files or folders is counted as the host's disk pays for them.
ENTRY_BYTES = 4096


@dataclass(frozen=True)
class StepLimits:
    """What one build may use: per step (memory, CPUs, processes, disk added, output
    kept) and in all (seconds, disk added)."""

    memory: int
    cpus: float
    pids: int
    timeout_s: float
    disk: int
    """Bytes a step may add to its layer, all its entries together (each counted as
    :data:`ENTRY_BYTES` on top of its size)."""
    output: int = 2 << 20
    """Bytes of a step's output shown; the rest is read and dropped (as BuildKit clips)."""
    disk_total: int = 16 << 30
    """Bytes all the steps the build runs may add together (cached steps add nothing)."""

    @classmethod
    def of(
        cls, limits: Limits, *, disk: int, disk_total: int = 16 << 30, output: int = 2 << 20
    ) -> StepLimits:
        return cls(limits.memory, limits.cpus, limits.pids, limits.timeout, disk, output,
                   disk_total)  # fmt: skip


@dataclass(frozen=True)
class StepSpec:
    """One step's container, as intent."""

    image: str
    command: list[str]
    """Run as the container's own process (empty: the container is never started)."""
    user: str = ""
    env: list[str] = field(default_factory=list)
    workdir: str = ""
    scratch: tuple[str, ...] = ()
    """Folders given a fresh tmpfs (``RUN --mount=type=cache|tmpfs``), never committed."""
    build_id: str = ""
    network: str | None = None
    """The build's own network (from :meth:`StepEngine.open_network`); None: none."""
    secrets: tuple[tuple[str, str], ...] = ()
    """``(host file, target)``: secret files bind-mounted read-only for this step only
    (``RUN --mount=type=secret``); a mount is never committed."""
    ca_bundle: str = ""
    """A host file mounted read-only over the image's own CA bundle for this step only
    (``build.ca``: the image's certificates and the project's); the image's file stays
    as it was under the mount, and in the commit."""


@dataclass(frozen=True)
class StepOutcome:
    """How a started step ended."""

    exit_code: int
    timed_out: bool = False
    disk_exceeded: bool = False
    """It added more than ``limits.disk`` to its layer (stopped, or found at its end)."""
    added: int = 0
    """What it added to its layer, as last measured: its files' apparent sizes (a sparse
    file's holes count), its links' targets, and :data:`ENTRY_BYTES` for every entry."""
    oom: bool = False
    tail: str = ""
    """The end of its output, for a message."""
    clipped: bool = False


Output = Callable[[bytes], None]


@dataclass(frozen=True)
class Folder:
    """A folder of a step's container (not a link to one)."""

    mode: int
    """Its permission bits (``0o777`` at most)."""
    empty: bool


class StepEngine(Protocol):
    """The engine calls a build makes."""

    def image(self, ref: str) -> tuple[str, dict[str, Any]] | None:
        """``(id, config)`` of a local image, or None when it is not on this machine."""
        ...

    def cached(self, key: str, parent: str) -> str | None:
        """The id of an image committed on ``parent`` for the cache key ``key``, or None."""
        ...

    def empty_image(self) -> str:
        """An image with no files (``FROM scratch``)."""
        ...

    def create(self, spec: StepSpec, limits: StepLimits) -> str:
        """A step's container (not started); its id."""
        ...

    def ca_bundle(self, image: str) -> bytes:
        """The system CA bundle in ``image`` (empty when it has none)."""
        ...

    def put_archive(self, container: str, data: Iterable[bytes]) -> None:
        """Unpack the tar ``data`` (a stream of chunks, never staged whole) at ``/`` in the
        container; an error raised by ``data`` stops the upload and is raised here."""
        ...

    def is_folder(self, container: str, path: str) -> bool:
        """Whether ``path`` in the container is a folder (False: absent or not one)."""
        ...

    def get_archive(self, container: str, path: str) -> Iterator[bytes]:
        """``path`` of the container as a tar stream."""
        ...

    def exists(self, container: str, path: str) -> bool:
        """Whether ``path`` is in the container (its last part not followed if a link)."""
        ...

    def folder(self, container: str, path: str) -> Folder | None:
        """``path`` of the container when it is a folder (a link is not), else None."""
        ...

    def run(
        self, container: str, limits: StepLimits, deadline: float, output: Output
    ) -> StepOutcome:
        """Start the container and wait for its end (or the deadline, or the disk limit)."""
        ...

    def commit(self, container: str, config: Mapping[str, Any]) -> str:
        """Commit the container's layer with ``config`` (the whole image configuration);
        the new image's id."""
        ...

    def remove(self, container: str) -> None: ...

    def open_network(self, build_id: str, allow: list[str], services: list[str]) -> str:
        """The build's own network, its egress proxy (letting ``allow`` through)
        attached; its name."""
        ...

    def close_network(self, network: str) -> None: ...

    def egress_decisions(
        self, build_id: str, allow: list[str], services: list[str], since: datetime
    ) -> EgressLog:
        """The egress proxy's decisions on the build's requests since ``since`` (those of
        the step that just ended), within a run's budget, the rest counted; the decisions
        of the next step are followed from now on."""
        ...

    def remove_image(self, image: str) -> None: ...

    def tag(self, image: str, name: str) -> None: ...

    def runtime(self) -> str:
        """The runtime ``RUN`` steps run under (for the provenance label)."""
        ...
