"""One run, in steps: open → run the worker (or a session's execs) → collect → close.

:class:`Run` is the one lifecycle of every run, one-shot or session, on every backend
(:mod:`orchestrator.runtime.backend`: a container on Docker or Podman, a swarm service).
``open`` checks and makes everything on the host the plan names (folders, inputs, the
backend's launch, the worker's access, secrets, broker, held mount sources), records the
start in the audit log and has the backend create the container; ``run_worker`` runs the
worker's own command (a one-shot run), while a session execs commands of its own
choosing; ``collect`` reads the outbox once the worker's processes are gone; ``close``
removes what the backend made, turns ``ask`` zone copies into change sets, reads the
proxy's decisions and records the end.

Each part ``open`` makes is registered on one :class:`~contextlib.ExitStack` as it is
made, with what undoes it; ``close`` is that stack unwinding, in reverse, on every path
(a failed ``open`` unwinds it itself, and :class:`Run` is a context manager). So the
container is removed whatever happens: success, the worker's failure, a timeout, Ctrl-C
or SIGTERM to the orchestrator, or an engine error half-way. Leftovers of an
orchestrator that could not even get that far (SIGKILL) are found by their owner labels
and removed by ``orchestrator gc``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import IO, Any, Protocol, Self

from orchestrator.audit import AuditLog
from orchestrator.egress import RUN_ALLOWED, RUN_DENIED
from orchestrator.errors import ConfigError, EngineError, ImageMissing, OrchestratorError
from orchestrator.hostfs.paths import PathRefused
from orchestrator.plan import RESERVED_ENV, SECRETS_DIR, ContainerSpec, Mount
from orchestrator.prepare import Prepared
from orchestrator.prepare.inputs import InputSpec
from orchestrator.runtime.access import WorkerAccess, remove_run_dir
from orchestrator.runtime.backend import (
    Backend,
    Capabilities,
    Launch,
    Outcome,
    OutputSink,
    Status,
    Tail,
    require_exec,
)
from orchestrator.runtime.broker import Broker
from orchestrator.runtime.engine import EgressLog, Stream
from orchestrator.runtime.host_folders import make_host_folders, path_violations
from orchestrator.runtime.inputs import InputInfo, place_inputs
from orchestrator.runtime.mount_sources import MountSources
from orchestrator.runtime.removal import Interrupted
from orchestrator.runtime.secrets import RedactingSink, StreamRedactor, delivered
from orchestrator.runtime.session_folders import remove_if_empty
from orchestrator.runtime.setid import SetidSweep, refuse_setid, setid_reason
from orchestrator.runtime.state_root import open_state_root

log = logging.getLogger(__name__)

#: A session is closed after this long without an operation (seconds), unless told otherwise.
DEFAULT_IDLE_TIMEOUT = 15 * 60.0
#: ... and after this long in any case.
DEFAULT_MAX_LIFETIME = 8 * 3600.0

__all__ = [
    "Interrupted",
    "OutputSink",
    "Run",
    "RunResult",
    "Staging",
    "Status",
    "collect_garbage",
    "execute",
]


class Staging(Protocol):
    """Where what a run produced goes: its outbox stream, and its private zone copies."""

    def outbox(self, spec: ContainerSpec, stream: IO[bytes], *, message: str | None = None) -> Any:
        """Read one tar stream of a run's results (hostile data); say what it became.
        ``message`` describes the change set (default: the run's results)."""

    def zones(self, prepared: Prepared) -> list[Any]:
        """Turn the run's private copies of ``ask`` zones into change sets; remove them."""


@dataclass
class RunResult:
    """What one run did. ``exit_code`` is the worker's own, or 124/137/125-style codes."""

    run_id: str
    worker: str
    exit_code: int
    status: Status
    duration_s: float
    stdout: str
    stderr: str
    container_removed: bool
    error: str | None = None
    outbox: Any = None
    """What the outbox reader made of the run's outbox (e.g. a change set summary)."""
    asked: list[Any] = field(default_factory=list)
    """Change sets for zones with ``approval.write: ask`` (the worker wrote a private copy)."""
    egress: list[dict[str, Any]] = field(default_factory=list)
    """The egress proxy's decisions on this run's requests: host, port, allowed."""
    egress_flood: dict[str, int] | None = None
    """Requests only counted, not listed in ``egress`` (a flood): denied, allowed, bytes."""
    violations: list[str] = field(default_factory=list)
    """Links found on the project's zone paths or own folders after the run (a worker may
    have planted them); each is also a ``zone.violation`` audit entry."""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    """The inputs placed at /inputs (name, sha256, size, kind, source): the hash is of the
    bytes placed, as the ``run.inputs`` audit entry records it."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outbox"] = getattr(self.outbox, "summary", lambda: self.outbox)()
        data["asked"] = [getattr(item, "summary", lambda i=item: i)() for item in self.asked]
        return data


def execute(
    backend: Backend,
    prepared: Prepared,
    *,
    audit: AuditLog,
    staging: Staging | None,
    on_output: OutputSink | None = None,
    depth: int = 0,
    secrets: Mapping[str, str] | None = None,
) -> RunResult:
    """Run a prepared plan's own command in a new container, then remove it: one-shot.

    The start (everything the container gets) is recorded in ``audit`` before anything is
    created, so a run that cannot be audited never starts; the end is recorded after the
    container is gone. ``secrets`` holds resolved values by name; the grant decides which of
    them this run gets, and every value is redacted from output, errors and the audit log.
    ``backend`` is where it runs. Library users go through
    :class:`orchestrator.Orchestrator`, which wires all of this.
    """
    run = Run(
        backend,
        prepared,
        audit=audit,
        staging=staging,
        secrets=secrets,
        depth=depth,
        on_output=on_output,
    )
    with run:
        run.open()
        run.run_worker()
        run.collect()
    return run.close()  # closed by the block: its result


class Run:
    """One run's life in steps: :meth:`open`, then :meth:`run_worker` or a session's own
    execs, :meth:`collect`, :meth:`close`. ``close`` is safe on every path and twice; a
    ``with`` block closes the run at its end (``failed`` when the block raised)."""

    def __init__(
        self,
        backend: Backend,
        prepared: Prepared,
        *,
        audit: AuditLog,
        staging: Staging | None,
        secrets: Mapping[str, str] | None = None,
        depth: int = 0,
        on_output: OutputSink | None = None,
        gc: bool = True,
        output: bool = True,
    ) -> None:
        self.backend = backend
        self.prepared = prepared
        self.spec = prepared.spec
        self.audit = audit
        self.staging = staging
        self.depth = depth
        self.values = _granted_secrets(prepared, secrets or {})
        self.egress_values = {n: (secrets or {}).get(n, "") for n in prepared.grant.egress}
        """Egress credentials: only the run's credential proxy gets them."""
        self.redactor = StreamRedactor([*self.values.values(), *self.egress_values.values()])
        self.on_output = on_output
        self.gc = gc
        """Whether :meth:`open` first removes what dead owners left (a batch does it once)."""
        self.output = output
        """Whether the worker's output is read (False: no attach, empty stdout and stderr,
        unless ``on_output`` wants it; a batch keeps none of it)."""
        self.outcome = Outcome()
        self.tails: dict[Stream, Tail] = {"stdout": Tail(), "stderr": Tail()}
        self.result: RunResult | None = None
        self.launch: Launch | None = None
        """What the backend made for this run (from :meth:`open` on)."""
        self._created = False
        self._launched = False
        self._failed = False
        self._facts: dict[str, Any] = {}
        self._capabilities = Capabilities()
        """What the backend supports, read once by :meth:`open`."""
        self._asked: list[Any] = []
        self._egress: list[dict[str, Any]] = []
        self._flood: dict[str, int] | None = None
        self._started = time.monotonic()
        self._wall_start = datetime.now(UTC) - timedelta(seconds=1)
        self._opened = False
        self._collected = False
        self.inputs: list[InputInfo] = []
        """The inputs placed at /inputs (name, sha256, size, kind, source)."""
        self.sources = MountSources(self.spec.run_id, pin=False)
        """The bind mounts' host folders, held open (and pinned, as root) while it runs."""
        self._pin = False
        self._stack = ExitStack()
        """What :meth:`close` undoes: each part is registered as :meth:`open` makes it."""
        self._stack.callback(self._remove_folders)
        self._stack.push(self._end)

    @property
    def live(self) -> Launch:
        """The launch of an opened run, through which a session execs into it and reads
        files out of it (a backend with the ``exec`` capability)."""
        if not self._created or self.launch is None:
            raise RuntimeError("open() the run first")
        return self.launch

    def handed_out(self) -> None:
        """A run opened ahead of need (a warm pool's) is handed out now: its ``duration_s``
        counts from here, not from when its container was made. (Its worker's timeout
        always counts from the worker's start.)"""
        self._started = time.monotonic()

    def discard(self) -> RunResult:
        """Close a run that was opened but never handed out: its end is recorded with
        status ``unused``, so every ``run.started`` in the audit log has its ``run.ended``."""
        if self.result is None and self.outcome.error is None:
            self.outcome.status, self.outcome.exit_code = "unused", 0
        return self.close()

    @property
    def keeps_alive(self) -> bool:
        """Whether the container's own process only keeps it alive (work arrives by exec)."""
        return self.spec.supervisor_user is not None

    # -- steps ----------------------------------------------------------------------------

    def open(self) -> None:
        """Check and make what the plan names, record the start, create the container.

        A keep-alive container is also started; any other waits for :meth:`run_worker`,
        which attaches to its output first. Each part is registered to be undone as it is
        made; when a step fails, what was made is undone (the run is closed, its end
        recorded) before the error is raised.
        """
        if self._opened:
            raise RuntimeError("a Run is opened once")
        self._opened = True
        try:
            self._check()
            self._new_launch()
            self._prepare_host()
            self._prepare_launch()
            self._record_start()
            try:
                self._grant_access()
                self._deliver_secrets()
                self._start_broker()
                self._hold_sources()  # last: every source exists now (the secrets folder too)
                self._create()
            except Interrupted as exc:
                self.outcome.interrupted(exc)
                raise
            except OrchestratorError as exc:
                self.outcome.error = self.outcome.error or str(exc)
                raise
        except BaseException:
            self.close(failed=True)
            raise

    def _check(self) -> None:
        """Before anything exists: what this backend cannot run, runs nothing."""
        backend, spec = self.backend, self.spec
        try:
            self._facts = backend.check(self.prepared)
            self._capabilities = capabilities = backend.capabilities
            if self.prepared.grant.egress and not capabilities.credential_proxies:
                raise OrchestratorError(
                    f"the {backend.name} backend cannot run a credential proxy, which the egress "
                    f"credentials of worker '{spec.worker}' need: use --engine docker"
                )
            refuse_image_user(spec)
        except OrchestratorError as exc:
            self.outcome.error = str(exc)
            raise
        for value in (*self.values.values(), *self.egress_values.values()):
            self.audit.add_secret(value)
        if self.spec.image_user and not self.spec.run_as:  # the image's user, for its execs
            if (defaults := self.backend.image(self.spec.image)) is None:
                raise ImageMissing(self.spec.image)
            self.spec = replace(self.spec, run_as=defaults.user)
            self.prepared = replace(self.prepared, spec=self.spec)

    def _new_launch(self) -> None:
        """The backend's launch of this run (nothing made yet). Its release (the network)
        is registered first, so it comes after everything else is undone; just before it,
        the ``ask`` zone copies become change sets and the proxy's decisions are read."""
        self.launch = self.backend.launch(
            self.prepared,
            output=self.output,
            keep_alive=self.keeps_alive,
            credentials=self.egress_values,
        )
        self._stack.callback(self._release_launch)
        self._stack.callback(self._gather)

    def _prepare_host(self) -> None:
        """The run's folders (its ``ask`` copies), the set-id refusal, its inputs; what dead
        owners left is removed (unless the owner does it once for many runs)."""
        prepared, spec, capabilities = self.prepared, self.spec, self._capabilities
        make_host_folders(prepared)
        self._pin = os.geteuid() == 0 and bool(spec.mounts) and capabilities.pinned_mounts
        if why := setid_reason(capabilities.setid_refusal, spec, pinned=self._pin):
            refuse_setid(prepared, why=why)
        if prepared.inputs:
            self.inputs = place_inputs(prepared, prepared.inputs)
        if self.gc:
            collect_garbage(self.backend, self.audit)

    def _prepare_launch(self) -> None:
        """What the backend readies before the start is recorded (the run's network, its
        credential proxy starting)."""
        assert self.launch is not None
        self._launched = True
        self.launch.prepare()

    def _record_start(self) -> None:
        """``run.started`` (and ``run.inputs``): a run that cannot be audited never starts."""
        metadata = start_metadata(self.prepared, self.depth)
        metadata["inputs"] = [info.to_dict() for info in self.inputs]
        metadata["engine"] = self.backend.name
        metadata.update(self._facts)
        metadata["pinned_mounts"] = self._pin
        self.audit.record("run.started", **run_context(self.spec), metadata=metadata)
        if self.inputs:
            self._record_inputs(self.inputs)
        self._wall_start = datetime.now(UTC) - timedelta(seconds=1)
        self._started = time.monotonic()

    def _grant_access(self) -> None:
        """Root: the worker's uid gets what its grant says; then the set-id sweep's first
        look (after the grant: what it changed is put back after ours)."""
        spec, access = self.spec, WorkerAccess(self.prepared, self.audit)
        self._stack.callback(self._release_access, access)
        if access.trees:
            access.grant()
            for dead in access.swept:
                self.audit.record(
                    "gc.access_restored",
                    run_id=dead.file.parent.name,
                    metadata={"uid": dead.uid, "entries": len(dead.saved)},
                )
            self.audit.record("access.granted", **run_context(spec), metadata=access.summary())
        sweep = SetidSweep(self.prepared)
        self._stack.callback(sweep.after, self.audit, **run_context(spec))
        sweep.before()

    def _deliver_secrets(self) -> None:
        """The worker's secrets as files in memory, when the backend mounts them."""
        if self._capabilities.secret_files:
            prepared = self.prepared
            self._stack.enter_context(
                delivered(prepared.paths.secrets_dir, self.values, prepared.uid, prepared.gid)
            )

    def _start_broker(self) -> None:
        """The broker, serving the worker's requests for child runs (if its grant has any)."""
        if not self.prepared.grant.children:
            return
        require_exec(self.backend, "a child worker")  # a backend without execs: no broker
        broker = Broker(
            self.prepared,
            depth=self.depth,
            run_child=self._run_child,
            cancel_child=self.backend.cancel,
            audit=self.audit,
        )
        self._stack.callback(lambda: broker.close(cancel=self._failed))
        broker.start()

    def _create(self) -> None:
        """The worker's container, from the held sources (removed on every path)."""
        assert self.launch is not None
        self._created = True
        self.outcome.removed = False
        self._stack.callback(self._remove)
        self.launch.create(
            self._engine_spec(),
            {} if self._capabilities.secret_files else self.values,
            started=lambda: self._check_sources("once its container started"),
        )

    def _hold_sources(self) -> None:
        """Open every mount source without following links (pinning them when the engine
        sees this process's mounts): what was checked is what the container gets. (The
        secrets folder only when the backend delivers secrets as its files.)"""
        sources = [(m.source, m.read_only) for m in self._bound()]
        self.sources = MountSources(self.spec.run_id, pin=self._pin)
        self._stack.callback(lambda: self.sources.release())
        # The sandbox root checked again, then used by its descriptor (not by its name).
        root = open_state_root(self.prepared.project)
        beneath = (self.prepared.project.sandbox_root, root)
        try:
            try:
                self.sources.hold(sources, beneath=beneath)
            except PermissionError as exc:  # root without CAP_SYS_ADMIN: checked paths only
                log.warning("run %s: cannot pin mount sources (%s)", self.spec.run_id, exc)
                self.sources.release()
                self.sources = MountSources(self.spec.run_id, pin=False)
                self.sources.hold(sources, beneath=beneath)
        except PathRefused as refused:
            self._violation([f"{refused.path}: {refused.reason}"], "before its container existed")
        except OSError as exc:
            raise OrchestratorError(f"could not hold the run's mount sources: {exc}") from None
        finally:
            os.close(root)

    def _bound(self) -> list[Mount]:
        """The plan's bind mounts whose host folders the backend mounts."""
        if self._capabilities.secret_files:
            return list(self.spec.mounts)
        return [m for m in self.spec.mounts if m.target != SECRETS_DIR]

    def _engine_spec(self) -> ContainerSpec:
        """The plan as the backend gets it: each bind mount from its held (pinned) source."""
        held = {m.source for m in self._bound()}
        mounts = [
            replace(m, source=self.sources.source(m.source)) if m.source in held else m
            for m in self.spec.mounts
        ]
        return replace(self.spec, mounts=mounts)

    def _check_sources(self, when: str) -> None:
        if not self.sources.pinned and (changed := self.sources.changed()):
            self._violation(changed, when)

    def _violation(self, problems: list[str], when: str) -> None:
        """A mount source that became a link (or another folder): audited, and the run
        stops. The link stays, so every later run refuses until a person removes it."""
        self.outcome.error = self.outcome.error or f"a mount source changed {when}"
        for problem in problems:
            self.audit.record(
                "zone.violation",
                allowed=False,
                reason=problem,
                **run_context(self.spec),
                metadata={"when": when},
            )
        raise OrchestratorError(
            f"run {self.spec.run_id}: a mount source changed {when}: {problems[0]}; a worker "
            "may have planted a link on a zone's path: remove it and check what it pointed at"
        )

    def _after_run_violations(self) -> list[str]:
        return after_run_violations(self.prepared, self.audit) if self._opened else []

    def place_inputs(self, inputs: Sequence[InputSpec | str | os.PathLike[str]]) -> None:
        """Place inputs in an opened run's /inputs before its worker starts (a run opened
        ahead of need, whose plan has an inputs folder); recorded as ``run.inputs``."""
        if not self._created:
            raise RuntimeError("open() the run first")
        placed = place_inputs(self.prepared, inputs)
        self.inputs += placed
        self._record_inputs(placed)

    def _record_inputs(self, placed: Sequence[InputInfo]) -> None:
        """``run.inputs``: what was placed at /inputs, hashed from the bytes placed (every
        run with inputs has one, whether they came at open or later)."""
        self.audit.record(
            "run.inputs",
            **run_context(self.spec),
            metadata={"inputs": [info.to_dict() for info in placed]},
        )

    def run_worker(self, *, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> None:
        """Run the worker's own command to its end (or timeout); fills in the outcome.

        ``env`` and ``args`` are for a run opened ahead of need (a keep-alive container,
        e.g. from a pool): they are given to the exec that runs the worker, over the plan's
        env and after its arguments. A run prepared for one use gets its env and arguments
        from its plan (``prepare(env=..., args=...)``) instead; a container whose worker is
        its own process cannot take them here.
        """
        if not self._created or self.launch is None:
            raise RuntimeError("open() the run first")
        if (env or args) and not self.keeps_alive:
            raise OrchestratorError(
                f"run {self.spec.run_id}: env and args at run time need a keep-alive run; "
                "give them to prepare() instead"
            )
        reserved = sorted(name for name in env or {} if name in RESERVED_ENV)
        if reserved:
            raise OrchestratorError(
                f"env {', '.join(reserved)}: set by the orchestrator itself; use other names"
            )
        sink = self._sink()
        try:
            self.launch.run_worker(
                self.outcome,
                self.tails,
                sink,
                env=env or {},
                args=args,
                started=lambda: self._check_sources("once its container started"),
            )
        except Interrupted as exc:
            self.outcome.interrupted(exc)
            raise
        except EngineError as exc:
            self.outcome.error = self.outcome.error or str(exc)
            raise
        finally:
            if isinstance(sink, RedactingSink):
                sink.flush()

    def collect(self) -> None:
        """Read the outbox (hostile data) once every process of the worker's user is gone."""
        if self._collected or not self._created or self.launch is None:
            return
        self._collected = True
        if self.staging is None or self.spec.outbox is None:
            return
        self.launch.collect(self.outcome, self.staging)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(failed=kind is not None)

    def close(self, *, failed: bool = False) -> RunResult:
        """Undo what :meth:`open` made, in reverse (the container first, the run's folder
        last), turning ``ask`` zone copies into change sets and reading the proxy's
        decisions on the way; record the end. Never skipped: a ``with`` block, or a failed
        :meth:`open`, calls it on every path (it is idempotent and returns the same result
        again). ``failed``: the run failed (the broker's children are cancelled)."""
        if self.result is None:
            self._failed = failed
            self._stack.close()
        assert self.result is not None  # the end step builds it on every path
        return self.result

    def _remove(self) -> None:
        """The backend's objects of the run (its container, its credential proxy), then
        what the proxy did with the egress credentials."""
        assert self.launch is not None
        self.outcome.removed = self.launch.remove()
        for event in self.launch.credential_events():
            self.audit.record(
                "egress.credential",
                allowed=event.event == "substituted",
                reason=event.reason or None,
                **run_context(self.spec),
                metadata=event.to_dict(),
            )

    def _gather(self) -> None:
        """What the run left outside its outbox: its ``ask`` zone copies as change sets,
        the egress proxy's decisions."""
        self._asked = self.staging.zones(self.prepared) if self.staging is not None else []
        self._egress, self._flood = self._egress_decisions()

    def _release_launch(self) -> None:
        assert self.launch is not None
        self.launch.release()

    def _end(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """The result; ``run.ended`` (with the links found after the run) unless undoing
        failed (the error is raised; ``gc`` removes what is left)."""
        violations = self._after_run_violations() if kind is None else []
        spec, tails, launch = self.spec, self.tails, self.launch
        self.result = RunResult(
            run_id=spec.run_id,
            worker=spec.worker,
            exit_code=self.outcome.exit_code,
            status=self.outcome.status,
            duration_s=round(time.monotonic() - self._started, 3),
            stdout=self.redactor.tail(tails["stdout"].buffer, truncated=tails["stdout"].truncated),
            stderr=self.redactor.tail(tails["stderr"].buffer, truncated=tails["stderr"].truncated),
            container_removed=self.outcome.removed,
            error=self.redactor.text(self.outcome.error) if self.outcome.error else None,
            outbox=self.outcome.collected,
            asked=self._asked,
            egress=self._egress,
            egress_flood=self._flood,
            violations=violations,
            inputs=[info.to_dict() for info in self.inputs],
        )
        if self._opened and kind is None:
            self.audit.record(
                "run.ended",
                allowed=self.result.status in ("exited", "closed", "unused"),
                reason=self.result.error,
                **run_context(spec),
                metadata={
                    "exit_code": self.result.exit_code,
                    "status": self.result.status,
                    "duration_s": self.result.duration_s,
                    "container_removed": self.result.container_removed,
                    **(launch.ended() if launch is not None else {}),
                },
            )

    def _remove_folders(self) -> None:
        """The run's own folder (broker socket, ask copies) never outlives the run; rmtree
        walks by directory descriptors and never follows a link the worker planted."""
        remove_run_dir(self.prepared.paths.run_dir)
        if self.prepared.fresh_session and self.depth == 0:
            remove_if_empty(self.prepared.paths.session)  # a one-off session, left empty

    def _egress_decisions(self) -> tuple[list[dict[str, Any]], dict[str, int] | None]:
        """The proxy's decisions on this run, into the audit log and the result."""
        if self.spec.network.mode != "allowlist" or self.launch is None or not self._launched:
            return [], None
        try:
            found = self.launch.decisions(self._wall_start)
        except OrchestratorError as exc:
            log.warning("could not read the egress proxy's decisions: %s", exc)
            self.audit.record(
                "egress.unread",
                allowed=False,
                reason=str(exc),
                **run_context(self.spec),
            )
            return [], None
        return audit_decisions(found, self.spec, self.audit)

    def _release_access(self, access: WorkerAccess) -> None:
        """Put back what the worker's uid was given and hand its files to the project
        folder's owner (once the container is gone). A failure keeps the record for gc."""
        if not access.trees:
            return
        problems = access.release()
        for problem in problems:
            log.warning("run %s: could not put access back: %s", self.spec.run_id, problem)
        try:
            self.audit.record(
                "access.released",
                allowed=not problems,
                reason="; ".join(problems) or None,
                **run_context(self.spec),
                metadata={"entries": access.summary()["entries"], "kept_for_gc": bool(problems)},
            )
        except OrchestratorError as exc:
            log.warning("run %s: could not audit the access release: %s", self.spec.run_id, exc)

    # -- the worker's own command ---------------------------------------------------------

    def _sink(self) -> OutputSink | None:
        if self.on_output is not None and self.redactor:
            return RedactingSink(self.on_output, {**self.values, **self.egress_values})
        return self.on_output

    def _run_child(self, child: Prepared, depth: int) -> RunResult:
        return execute(
            self.backend,
            child,
            audit=self.audit,
            depth=depth,
            staging=self.staging,
            secrets={**self.values, **self.egress_values},
        )


def collect_garbage(backend: Backend, audit: AuditLog) -> None:
    """Remove what dead owners left on ``backend``, each audited as ``gc.removed``."""
    for obj in backend.collect_garbage().removed:
        audit.record("gc.removed", metadata={"kind": obj.kind, "name": obj.name})


def after_run_violations(prepared: Prepared, audit: AuditLog) -> list[str]:
    """Links now on the project's zone paths or own folders (a worker may have planted
    them), each audited as a ``zone.violation``. The next run refuses to load the project
    until a person removes them."""
    found = path_violations(prepared.project)
    for problem in found:
        log.warning("run %s: %s", prepared.spec.run_id, problem)
        audit.record(
            "zone.violation",
            allowed=False,
            reason=problem,
            **run_context(prepared.spec),
            metadata={"when": "after the run"},
        )
    return found


def audit_decisions(
    found: EgressLog, spec: ContainerSpec, audit: AuditLog | None
) -> tuple[list[dict[str, Any]], dict[str, int] | None]:
    """The egress proxy's decisions on one run: each into the audit log and the result
    rows, up to :data:`~orchestrator.egress.RUN_DENIED` denied and ``RUN_ALLOWED`` allowed
    ones; what goes beyond (and what the proxy only counted) is one ``egress.flood`` entry
    with the counts, also returned. A flood does not stop the run (docs/network.md)."""
    rows = []
    kept = {True: 0, False: 0}
    unlisted = {True: found.unlisted_allowed, False: found.unlisted_denied}
    for decision in found.decisions:
        if kept[decision.allowed] >= (RUN_ALLOWED if decision.allowed else RUN_DENIED):
            unlisted[decision.allowed] += 1
            continue
        kept[decision.allowed] += 1
        rows.append({"host": decision.host, "port": decision.port, "allowed": decision.allowed})
        if audit is not None:
            audit.record(
                "egress.decision",
                allowed=decision.allowed,
                reason=None if decision.allowed else "not in the allowlist",
                **run_context(spec),
                metadata={"host": decision.host, "port": decision.port, "method": decision.method},
            )
    if not (unlisted[True] or unlisted[False]):
        return rows, None
    flood = {"denied": unlisted[False], "allowed": unlisted[True], "bytes": found.unlisted_bytes}
    if audit is not None:
        audit.record(
            "egress.flood",
            allowed=False,
            reason=(
                f"{unlisted[False]} denied and {unlisted[True]} allowed requests beyond the "
                "log budget were counted, not logged one by one"
            ),
            **run_context(spec),
            metadata={**flood, "logged_denied": kept[False], "logged_allowed": kept[True]},
        )
    return rows, flood


def _granted_secrets(prepared: Prepared, secrets: Mapping[str, str]) -> dict[str, str]:
    missing = [name for name in prepared.grant.secrets if name not in secrets]
    if missing:
        raise OrchestratorError(
            f"secret(s) {', '.join(missing)} for '{prepared.spec.worker}' were not resolved; "
            "check the project's credentials"
        )
    return {name: secrets[name] for name in prepared.grant.secrets}


def refuse_image_user(spec: ContainerSpec) -> None:
    """A run as the image's user (root) with a writable host folder needs a root
    orchestrator: only root can give root's files there (a setuid one among them) to the
    project's owner after the run (:class:`~orchestrator.runtime.setid.SetidSweep`)."""
    writable = [m.target for m in spec.mounts if not m.read_only]
    if spec.image_user and writable and os.geteuid() != 0:
        raise ConfigError(
            [
                f"worker {spec.worker}: image_user with writable {', '.join(writable)} needs "
                "the orchestrator to run as root (only root can give what root leaves there "
                "to the project's owner); run it as root, or remove image_user"
            ]
        )


def run_context(spec: ContainerSpec) -> dict[str, Any]:
    """Who an audit entry about this run is about: worker, run, session and trust."""
    return {
        "worker": spec.worker,
        "run_id": spec.run_id,
        "session_id": spec.session_id,
        "trust_level": spec.trust,
    }


def start_metadata(prepared: Prepared, depth: int) -> dict[str, Any]:
    """What ``run.started`` records of a run's plan (env by names only)."""
    spec = prepared.spec
    return {
        "image": spec.image,
        "user": spec.user,
        "mounts": [
            {"target": m.target, "source": m.source, "mode": "ro" if m.read_only else "rw"}
            for m in spec.mounts
        ],
        "masks": sorted(prepared.grant.masks),
        "network": spec.network.mode,
        "egress": spec.network.allow if spec.network.mode == "allowlist" else None,
        "isolation": spec.isolation,
        "limits": asdict(spec.limits),
        "children": list(prepared.grant.children),
        "depth": depth,
        "env": sorted(spec.env),  # names only: values may be sensitive
    }
