"""The seam under a run's one lifecycle: what a backend (Docker, a swarm) does for it.

:class:`orchestrator.runtime.run.Run` owns everything on the host side of a run, once for
every backend: the run's folders and inputs, the set-id refusal and sweep, the worker's
access, the broker, the mount sources it holds, the audit log's start and end, and the
:class:`~orchestrator.runtime.run.RunResult`. A :class:`Backend` does only what needs an
engine, through one :class:`Launch` per run:

- before the start is recorded: :meth:`Backend.check` refuses what it cannot run (one line,
  nothing made yet) and :meth:`Launch.prepare` readies what the run's network needs;
- then :meth:`Launch.create` makes the worker's container (or service) from the plan with
  its held mount sources; :meth:`Launch.run_worker` runs the worker's own command to its
  end and says how it ended (:class:`Outcome`), streaming its output to the run's tails;
- :meth:`Launch.collect` reads the outbox once the worker's processes are gone (from the
  container's tmpfs, or a host folder once the task is gone); :meth:`Launch.remove`
  removes the run's objects on every path; :meth:`Launch.decisions`
  are the egress proxy's decisions; :meth:`Launch.release` drops the run's network.

A live run (a session's, a warm pool's) is driven through its :class:`Launch` too:
:meth:`Launch.exec` runs a checked command in it (argv, cwd, env, stdin, a timeout that
kills the command's whole process tree, its output streamed and captured) and
:meth:`Launch.archive` reads files out of it as one tar stream. What a backend can do at
all is one value, :class:`Capabilities` (exec, pinned mounts, secret files, the set-id
refusal, credential proxies), checked once where a session, a pool or a child worker is
asked for (:func:`require_exec`), so a new backend needs only :class:`Backend` and
:class:`Launch`. Docker's backend is :class:`orchestrator.runtime.container.ContainerBackend`,
over the Docker-shaped :class:`~orchestrator.runtime.engine.Engine` protocol (Docker, Podman
and the tests' fake); the swarm's is :class:`orchestrator.docker.swarm.backend.SwarmBackend`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from orchestrator.errors import OrchestratorError
from orchestrator.exits import Exit, killed_for_memory, signalled, timed_out

if TYPE_CHECKING:
    from orchestrator.audit import AuditLog
    from orchestrator.plan import ContainerSpec
    from orchestrator.prepare import Prepared
    from orchestrator.runtime.credproxy import ProxyStart
    from orchestrator.runtime.engine import EgressLog, ImageDefaults, Stream
    from orchestrator.runtime.execs import ExecRequest, ExecResult
    from orchestrator.runtime.removal import Interrupted

__all__ = [
    "Backend",
    "Capabilities",
    "Collected",
    "Launch",
    "Named",
    "Outcome",
    "OutputSink",
    "Status",
    "Tail",
    "require_exec",
]

Status = Literal["exited", "timeout", "oom", "error", "interrupted", "closed", "unused"]
OutputSink = Callable[["Stream", bytes], None]

TAIL_BYTES = 64 << 10


class Tail:
    """The last ``limit`` bytes of a stream."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        self.buffer += chunk
        if len(self.buffer) > self.limit:
            del self.buffer[: len(self.buffer) - self.limit]
            self.truncated = True

    def text(self) -> str:
        return self.buffer.decode("utf-8", errors="replace")


def pump(
    frames: Iterator[tuple[Stream, bytes]], tails: dict[Stream, Tail], on_output: OutputSink | None
) -> None:
    """Output frames into the run's tails and, while it takes them, the output sink."""
    sink = on_output
    for stream, chunk in frames:
        tails[stream].add(chunk)
        if sink is not None:
            try:
                sink(stream, chunk)
            except OSError:  # the terminal went away: keep capturing, stop echoing
                sink = None


@dataclass
class Outcome:
    """How a run ended, as the backend saw it; the run turns it into its result."""

    status: Status = "error"
    exit_code: int = Exit.ERROR
    error: str | None = None
    removed: bool = True
    collected: Any = None

    def timed_out(self, spec: ContainerSpec) -> None:
        self.status, self.exit_code = "timeout", Exit.TIMEOUT
        self.error = timed_out(spec.limits.timeout_s)

    def oom(self, spec: ContainerSpec, *, killed: bool = True) -> None:
        self.status, self.exit_code = "oom", Exit.OOM
        self.error = (
            killed_for_memory(spec.limits.memory)
            if killed
            else f"ran out of memory at its limit ({spec.limits.memory} bytes): the sandbox "
            "refused its allocations"
        )

    def exited(self, code: int) -> None:
        self.status, self.exit_code = "exited", code

    def failed(self, code: int, error: str) -> None:
        """The worker's command could not run (126/127) or its task was refused."""
        self.status, self.exit_code, self.error = "error", code, error

    def interrupted(self, exc: Interrupted) -> None:
        self.status, self.exit_code = "interrupted", signalled(exc.signum)
        self.error = str(exc)


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports, stated once (:attr:`Backend.capabilities`); what it lacks
    is refused in one line where it is asked for, before anything is made."""

    exec: bool = False
    """It holds a run's container idling and runs commands in it (:meth:`Launch.exec`,
    :meth:`Launch.archive`): sessions, warm pools and child workers need it."""
    pinned_mounts: bool = False
    """Mount sources can be pinned (:mod:`orchestrator.runtime.mount_sources`): a bind
    mount this process makes is what the engine mounts."""
    secret_files: bool = False
    """The worker's secrets reach it as files in the run's secrets folder, written on the
    host (else :meth:`Launch.create` delivers them)."""
    setid_refusal: str | None = None
    """Why a set-id file on a run's mounts is always refused here (the backend enforces
    neither ``no-new-privileges`` nor ``nosuid`` binds); None: only when the plan has
    neither (:func:`orchestrator.runtime.setid.walk_needed`)."""
    credential_proxies: bool = False
    """It runs a run's credential proxy (:meth:`Launch.credential_proxy`): egress
    credentials need it."""


def require_exec(backend: Backend, wanted: str) -> None:
    """Refuse (one line, naming the backend and what it lacks) unless ``backend`` can exec
    into a run; ``wanted`` says what asked (a session, a warm pool, a child worker)."""
    if not backend.capabilities.exec:
        raise OrchestratorError(
            f"the {backend.name} backend cannot exec into a run, which {wanted} needs: "
            "use the docker backend (--engine docker)"
        )


class Named(Protocol):
    """An object a backend made, as ``gc`` reports it."""

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str: ...


class Collected(Protocol):
    """What a backend's garbage collection did."""

    @property
    def removed(self) -> Sequence[Named]: ...

    @property
    def kept(self) -> Sequence[Named]: ...

    @property
    def failed(self) -> Sequence[tuple[Named, str]]: ...


class Launch(Protocol):
    """One run on a backend, from before its start to its removal; see the module doc."""

    def prepare(self) -> None:
        """Ready what the run needs before its start is recorded (its network)."""

    def create(
        self, spec: ContainerSpec, secrets: Mapping[str, str], *, started: Callable[[], None]
    ) -> None:
        """Make the worker's container (or service) from ``spec`` (the plan with its held
        mount sources). ``secrets`` are the values a backend without secret files delivers
        itself. ``started()`` is called once the worker's processes may run."""

    def run_worker(
        self,
        outcome: Outcome,
        tails: dict[Stream, Tail],
        sink: OutputSink | None,
        *,
        env: Mapping[str, str],
        args: Sequence[str],
        started: Callable[[], None],
    ) -> None:
        """Run the worker's own command to its end (or its timeout); fill in ``outcome``
        and feed its output to ``tails`` and ``sink``."""

    def collect(self, outcome: Outcome, staging: Any) -> None:
        """Read the worker's outbox into ``outcome.collected`` once none of its processes
        runs any more (``staging.outbox`` for a tar stream, ``staging.outbox_dir`` for a
        host folder)."""

    def remove(self) -> bool:
        """Remove the run's container (service, secrets): True when all went. Never raises."""

    def decisions(self, since: datetime) -> EgressLog:
        """The egress proxy's decisions on this run's requests (an allowlisted run)."""

    def release(self) -> None:
        """Remove the run's own network (never raises: gc removes what this could not)."""

    def ended(self) -> dict[str, Any]:
        """What ``run.ended`` records of this backend's run, beyond the outcome."""

    # -- a live run (a backend with the exec capability; others refuse) ------------------

    def exec(self, request: ExecRequest, on_output: OutputSink | None = None) -> ExecResult:
        """Run a checked command (:func:`orchestrator.runtime.execs.exec_request`) in the
        created run, as ``request.user``: ``stdin`` fed then closed, output captured (the
        last ``request.cap`` bytes of each stream) and streamed to ``on_output``; past its
        timeout the command's whole process tree is killed (no other command's) and the
        result says so. Raise :class:`~orchestrator.errors.ContainerStopped` when the run
        no longer runs."""

    def archive(self, entries: Sequence[tuple[str, str]]) -> AbstractContextManager[IO[bytes]]:
        """A tar stream (hostile data) of ``entries``, each ``(folder, name)`` stored under
        its ``name`` alone, read in the run as the worker's user; closed on leaving."""

    # -- egress credentials (a backend with the credential_proxies capability) ----------

    @property
    def starts_at_create(self) -> bool:
        """Whether :meth:`create` may start the worker's processes (a credential proxy is
        then ready before it; else while the worker's container is made)."""

    def credential_proxy(
        self, values: Mapping[str, str], audit: AuditLog
    ) -> AbstractContextManager[ProxyStart]:
        """Start the run's credential proxy with the egress credentials ``values`` (on the
        network :meth:`prepare` made); it is removed, its events audited, on leaving."""


class Backend(Protocol):
    """Where runs run; see the module docstring. Chosen once, by its owner."""

    @property
    def name(self) -> str:
        """Recorded as ``engine`` in ``run.started``: ``docker`` or ``podman`` for the
        container backend (the engine that answers), ``swarm``."""

    @property
    def capabilities(self) -> Capabilities:
        """What this backend supports (see :class:`Capabilities`)."""

    def check(self, prepared: Prepared) -> dict[str, Any]:
        """Refuse (one-line :class:`~orchestrator.errors.OrchestratorError`) what cannot
        run here, before anything is made; return what ``run.started`` records of it."""

    def image(self, image: str) -> ImageDefaults | None:
        """The user and working folder ``image`` gives its processes where this backend
        runs them, or None when the image is not there."""

    def collect_garbage(self, *, everything: bool = False) -> Collected:
        """Remove what dead owners left (``everything``: of any pid namespace too); say
        what went, what was kept and what could not be removed."""

    def launch(self, prepared: Prepared, *, output: bool, keep_alive: bool) -> Launch:
        """A new run's :class:`Launch`; nothing is made yet. ``output``: whether the
        worker's output is read; ``keep_alive``: whether its container idles."""

    def cancel(self, run_id: str) -> None:
        """Remove a running run's objects (a batch that stops)."""

    @staticmethod
    def plan_facts(prepared: Prepared) -> dict[str, Any] | None:
        """What ``plan`` shows of this backend's rendering of ``prepared`` (pure: no
        engine is asked), or None when there is nothing beyond the plan."""
