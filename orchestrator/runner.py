"""The one object that runs workers of a project: :class:`Orchestrator`.

It owns the wiring every run needs, so that nothing public runs a worker without it: the
container engine, the project's audit log, the change store that outboxes are staged into,
and the secrets a grant allows (resolved on the host, just before the run)::

    from orchestrator import Orchestrator

    orch = Orchestrator("examples/triage")
    result = orch.run("triage")                    # one disposable container
    print(result.exit_code, result.outbox)         # the outbox became a pending change set

    with orch.open_session("triage") as session:   # a live sandbox, driven step by step
        session.list("/")
        session.exec(["python3", "/tools/triage.py", "--help"])

The command line is a thin layer over this object.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from orchestrator.audit import AuditLog
from orchestrator.backends import make_backend
from orchestrator.config import Project, Worker, load_project
from orchestrator.errors import ConfigError, OrchestratorError, PolicyError
from orchestrator.plan import supervisor_for
from orchestrator.prepare import Prepared, load_and_prepare, prepare
from orchestrator.runtime.backend import require_exec
from orchestrator.runtime.host_folders import open_audit
from orchestrator.runtime.outbox import StagingReader
from orchestrator.runtime.run import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_LIFETIME,
    OutputSink,
    Run,
    RunResult,
    execute,
    run_context,
)
from orchestrator.vocabulary import BACKENDS

if TYPE_CHECKING:
    from collections.abc import Callable

    from orchestrator.batch import BatchResult
    from orchestrator.cleanup import GcSummary
    from orchestrator.clearance import ClearResult, Credential, Summary
    from orchestrator.runtime.backend import Backend
    from orchestrator.runtime.engine import Engine, ImageDefaults
    from orchestrator.runtime.pool import WarmPool
    from orchestrator.runtime.session import Session
    from orchestrator.runtime.snapshots import Snapshot

__all__ = ["Orchestrator"]


#: Sessions not closed yet: a program that forgets to close one still removes its container
#: when it exits normally (a SIGKILLed one leaves it to ``orchestrator gc``).
_OPEN_SESSIONS: weakref.WeakSet[Session] = weakref.WeakSet()


@atexit.register
def _close_open_sessions() -> None:
    for session in list(_OPEN_SESSIONS):
        with contextlib.suppress(Exception):
            session.close()


class _Probe:
    """An engine seen as a launch, for :func:`~orchestrator.runtime.snapshots.engine_of`."""

    def __init__(self, engine: object) -> None:
        self.engine = engine
        self.container_id = "-"


class Orchestrator:
    """Runs the workers of one project: :meth:`run` (one-shot) and :meth:`open_session`.

    ``project`` is a folder holding ``orchestrator.yaml`` or an already loaded project.
    ``backend`` is where runs run, chosen once: ``"docker"`` (default: a container on the
    Docker engine, connected on first use), ``"swarm"`` (a service on the swarm that engine
    manages; one-shot runs and batches only), or a
    :class:`~orchestrator.runtime.backend.Backend`. ``engine`` is a Docker-shaped engine
    to run containers on instead of Docker's (Podman's, a test's).
    """

    def __init__(
        self,
        project: Project | str | os.PathLike[str] = ".",
        *,
        engine: Engine | None = None,
        backend: str | Backend = "docker",
    ) -> None:
        if engine is not None and backend != "docker":
            raise TypeError("give an engine or a backend, not both")
        if isinstance(backend, str) and backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
        self.project = project if isinstance(project, Project) else load_project(Path(project))
        self.audit: AuditLog = open_audit(self.project)
        self.staging = StagingReader(self.project, self.audit)
        self._engine = engine
        self._backend: Backend | None = None if isinstance(backend, str) else backend
        # A given backend's name is not asked for now: the container backend's asks its engine.
        self._backend_name = backend if isinstance(backend, str) else ""

    def close(self) -> None:
        """Release the audit log's descriptors (it reopens them if used again)."""
        self.audit.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def backend(self) -> Backend:
        """Where this orchestrator's runs run (connected on first use)."""
        if self._backend is None:
            engine = self.engine if self._backend_name == "docker" else None
            self._backend = make_backend(self._backend_name, engine=engine)
        return self._backend

    @property
    def engine(self) -> Engine:
        """The Docker-shaped engine the docker backend runs containers on (Docker's unless
        given). Runs, sessions and pools need none of it: they go through :attr:`backend`."""
        if self._engine is None:
            from orchestrator.runtime.container import ContainerBackend

            if isinstance(self._backend, ContainerBackend):
                self._engine = self._backend.engine
            elif self._backend is None and self._backend_name == "docker":
                from orchestrator.docker import DockerEngine

                self._engine = DockerEngine()
            else:
                raise OrchestratorError(
                    f"the {self.backend.name} backend runs no container engine of its own "
                    "here: use the docker backend (--engine docker)"
                )
        return self._engine

    def image(self, image: str) -> ImageDefaults | None:
        """The user and working folder ``image`` gives its processes where this
        orchestrator's runs run, or None when the image is not there (build or pull it)."""
        return self.backend.image(image)

    def gc(
        self, *, everything: bool = False, idle: float = 600, sessions_age: float | None = None
    ) -> GcSummary:
        """Remove what dead orchestrators left, on every backend and in this project
        (``orchestrator gc``; :func:`orchestrator.cleanup.collect_all`). ``everything``:
        of other pid namespaces too; ``idle``: shared egress proxies unused this long
        (seconds); ``sessions_age``: also session folders unused longer than this."""
        from orchestrator.cleanup import collect_all

        return collect_all(
            self.project.root,
            everything=everything,
            idle=idle,
            sessions_age=sessions_age,
            engine=self._engine,
        )

    # -- declarations ---------------------------------------------------------------------

    def check(self, prepared: Prepared) -> None:
        """Refuse, before anything exists, a run this backend cannot make (no such image,
        no such runtime), the refusal audited as :class:`Run` audits it: the CLI says so
        before its run header. A run checks again as it opens."""
        try:
            self.backend.check(prepared)
        except OrchestratorError as exc:
            metadata = {"exit_code": 125, "status": "error", "container_removed": True}
            self.audit.record(
                "run.ended",
                allowed=False,
                reason=str(exc),
                **run_context(prepared.spec),
                metadata=metadata,
            )
            raise

    def prepare(
        self,
        worker: str | Worker,
        *,
        inputs: Sequence[str | os.PathLike[str]] = (),
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        **options: Any,
    ) -> Prepared:
        """Load (by name or path) and check a worker, compile its plan; touches no engine.

        ``inputs`` are host files or folders for this run, checked now and placed
        read-only at ``/inputs/<name>`` when it opens; ``env`` is added to the worker's
        environment, ``args`` to its command. ``options`` are
        :func:`orchestrator.prepare.prepare`'s: ``trust``, ``promote``, ``timeout``,
        ``session_id``, ``workspace``, ``input_slot``. A refusal is audited, then raised as
        a :class:`~orchestrator.errors.ConfigError` listing every problem.
        """
        options.update(inputs=inputs, env=env, args=args)
        try:
            if isinstance(worker, Worker):
                return prepare(self.project, worker, **options)
            return load_and_prepare(self.project, worker, **options)
        except ConfigError as exc:
            self.audit.record(
                "policy.denied" if isinstance(exc, PolicyError) else "config.rejected",
                allowed=False,
                reason=str(exc),
                worker=worker.name if isinstance(worker, Worker) else worker,
                trust_level=options.get("trust"),
            )
            raise

    def plan(self, worker: str | Worker, **options: Any) -> Prepared:
        """:meth:`prepare`, recorded in the audit log as a compiled plan."""
        prepared = self.prepare(worker, **options)
        spec = prepared.spec
        self.audit.record(
            "plan.compiled",
            worker=spec.worker,
            run_id=spec.run_id,
            session_id=spec.session_id,
            trust_level=spec.trust,
            metadata={
                "image": spec.image,
                "network": spec.network.mode,
                "isolation": spec.isolation,
                "mounts": len(spec.mounts),
                "inputs": [str(item.source) for item in prepared.inputs],
            },
        )
        return prepared

    # -- running --------------------------------------------------------------------------

    def run(
        self,
        worker: str | Worker | Prepared,
        *,
        inputs: Sequence[str | os.PathLike[str]] = (),
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        on_output: OutputSink | None = None,
        **options: Any,
    ) -> RunResult:
        """Run a worker's command in a new container, removed afterwards on every path.

        ``inputs``, ``env`` and ``args`` are :meth:`prepare`'s (an already prepared run has
        its own). The worker's outbox becomes a pending change set (``result.outbox``), its
        ``ask`` zones change sets waiting for approval (``result.asked``). ``on_output(stream,
        chunk)`` receives the worker's output live (secrets redacted).
        """
        if isinstance(worker, Prepared):
            if inputs or env or args:
                raise TypeError("a Prepared run has its inputs, env and args: give them to prepare")
            prepared = worker
        else:
            prepared = self.prepare(worker, inputs=inputs, env=env, args=args, **options)
        return execute(
            self.backend,
            prepared,
            audit=self.audit,
            staging=self.staging,
            on_output=on_output,
            secrets=self.secrets_for(prepared),
        )

    def open_session(
        self,
        worker: str | Worker | Prepared | Run,
        *,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_lifetime: float | None = DEFAULT_MAX_LIFETIME,
        **options: Any,
    ) -> Session:
        """Start a live sandbox for a worker: the container its plan describes, idling.

        The worker's own command is not run; the session's :meth:`~Session.exec` runs
        commands in it, and its file operations act on the same zones from the host. It is
        closed (the container removed, its outbox staged) by :meth:`~Session.close`, on
        leaving a ``with`` block, after ``idle_timeout`` seconds without an operation, and
        after ``max_lifetime`` seconds in any case (None: no limit). ``worker`` may also be
        a keep-alive :class:`Run` opened earlier (a warm pool's, see :meth:`pool`).
        ``snapshots=True`` (among ``options``): a writable root (``image_user``, gVisor) runs where
        :meth:`Session.snapshot` can read it (docs/sessions.md has the cost).
        """
        from orchestrator.runtime.session import Session
        from orchestrator.timeouts import MAX_SESSION_S, seconds_problem

        for name, value in (("idle_timeout", idle_timeout), ("max_lifetime", max_lifetime)):
            problem = None if value is None else seconds_problem(value, MAX_SESSION_S)
            if problem:
                raise ConfigError([f"{name}: {problem} (a year); pass None for no limit"])
        snapshots = bool(options.pop("snapshots", False))
        if isinstance(worker, Run):
            run = worker
        else:
            prepared = worker if isinstance(worker, Prepared) else self.prepare(worker, **options)
            if prepared.worker.config.idle == "pause":  # saved as a snapshot when paused
                snapshots = True
            if snapshots:  # a writable root's writes where a snapshot's commit sees them
                prepared = replace(prepared, spec=replace(prepared.spec, root_capture=True))
            run = self.open_keep_alive(prepared)
        # The run (a pool's too) is this session's: none is left open, as the with block
        # closes it (failed) unless the session holds it.
        with contextlib.ExitStack() as undo:
            undo.enter_context(run)
            session = Session(run, idle_timeout=idle_timeout, max_lifetime=max_lifetime)
            session.orchestrator = self
            undo.pop_all()  # the session holds it now
        _OPEN_SESSIONS.add(session)
        return session

    # -- snapshots ------------------------------------------------------------------------

    def snapshots(self) -> list[Snapshot]:
        """This project's snapshots, oldest first (:mod:`orchestrator.runtime.snapshots`)."""
        from orchestrator.runtime.snapshots import list_snapshots

        return list_snapshots(self.project, self)

    def snapshot(self, snapshot_id: str) -> Snapshot:
        """This project's snapshot ``snapshot_id`` (another project's is refused)."""
        from orchestrator.runtime.snapshots import get

        return get(self.project, snapshot_id, self)

    def remove_snapshot(self, snapshot_id: str) -> Snapshot:
        """Remove a snapshot of this project: its image and its folder."""
        from orchestrator.runtime.snapshots import engine_of, remove

        engine, _ = engine_of(_Probe(self.engine), "remove snapshots of")
        return remove(self.project, snapshot_id, engine, self.audit)

    def prune_snapshots(self, older_than_s: float) -> list[Snapshot]:
        """Remove this project's snapshots older than ``older_than_s`` seconds."""
        from orchestrator.runtime.snapshots import engine_of, prune

        engine, _ = engine_of(_Probe(self.engine), "remove snapshots of")
        return prune(self.project, older_than_s, engine, self.audit)

    def fork(self, source: str | Snapshot, count: int = 1, **options: Any) -> list[Session]:
        """``count`` sessions started from snapshot ``source`` (an id or a
        :class:`Snapshot`); ``options``: ``idle_timeout``, ``max_lifetime``."""
        from orchestrator.runtime.snapshots import fork

        snap = self.snapshot(source if isinstance(source, str) else source.id)
        forks = fork(self, snap, count, **options)
        for session in forks:
            session.orchestrator = self
        return forks

    def open_keep_alive(
        self, prepared: Prepared, *, keep_alive: bool = True, gc: bool = True, output: bool = True
    ) -> Run:
        """Open a run whose container only idles (started, work arrives by exec): what a
        session and a warm pool hold. A worker without an outbox still gets an idling
        supervisor process, unless ``keep_alive`` is False: its container is then created,
        not started, and its worker runs as the container's own process (``run_worker``).
        ``gc`` and ``output`` are :class:`Run`'s. On failure everything it made is removed
        before raising (:meth:`Run.open` undoes what it made). The run is a context
        manager: ``with run:`` closes it at the block's end."""
        require_exec(self.backend, "a session or a warm pool")
        if keep_alive and prepared.spec.supervisor_user is None:  # no outbox: still idling
            image_user = prepared.spec.image_user
            spec = replace(
                prepared.spec,
                supervisor_user=supervisor_for(prepared.uid, image_user=image_user),
            )
            prepared = replace(prepared, spec=spec)
        run = Run(
            self.backend,
            prepared,
            audit=self.audit,
            staging=self.staging,
            secrets=self.secrets_for(prepared),
            gc=gc,
            output=output,
        )
        run.open()
        return run

    def pool(
        self,
        worker: str | Worker,
        *,
        size: int = 2,
        tailor: Callable[[Prepared], Prepared] | None = None,
        **options: Any,
    ) -> WarmPool:
        """A single-use warm pool: ``size`` runs of ``worker`` opened ahead of need, each
        handed out once by :meth:`WarmPool.take` (or as a session by
        :meth:`WarmPool.open_session`) and never reused. ``options`` are :meth:`prepare`'s;
        every pooled run gets a fresh run id, session and folders. ``tailor`` changes each
        pooled run's prepared plan before it opens (a harness's extra tmpfs folder, say:
        :func:`orchestrator.integrations.tmpfs.with_tmpfs`). Close it (or use it as a
        context manager) to remove what was never handed out.
        """
        from orchestrator.runtime.pool import WarmPool

        require_exec(self.backend, "a session or a warm pool")  # before any run is prepared
        return WarmPool(self, worker, size=size, tailor=tailor, **options)

    def batch(
        self,
        worker: str | Worker,
        inputs: Sequence[str | os.PathLike[str]] = (),
        *,
        concurrency: int = 4,
        resume: str | None = None,
        fail_fast: bool = False,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        **options: Any,
    ) -> BatchResult:
        """Run ``worker`` once per input (files, folders or glob patterns), each in its own
        new container, ``concurrency`` at a time; see ``docs/batch.md``. Results go to
        ``<sandbox>/batches/<id>/results.jsonl`` as each input ends, and every outbox into
        one change set keyed by input. ``resume`` (a batch id) runs only what that batch has
        not finished. ``on_event`` sees progress events (dicts). ``options`` are
        :meth:`prepare`'s.
        """
        from orchestrator.batch import run_batch

        return run_batch(
            self,
            worker,
            inputs,
            concurrency=concurrency,
            resume=resume,
            fail_fast=fail_fast,
            on_event=on_event,
            **options,
        )

    def secrets_for(self, prepared: Prepared) -> Mapping[str, str]:
        """The values of the secrets ``prepared``'s grant allows, read on the host now."""
        if not prepared.grant.secrets and not prepared.grant.egress:
            return {}
        from orchestrator.credentials import resolve

        credentials = self.project.config.credentials
        values = {}
        for name in (*prepared.grant.secrets, *prepared.grant.egress):
            credential = resolve(name, credentials[name], audit=self.audit, base=self.project.root)
            values[name] = credential.reveal()  # an 'inherit' credential holds no value: refused
            self.audit.record(
                "credential.used",
                worker=prepared.spec.worker,
                run_id=prepared.spec.run_id,
                session_id=prepared.session_id,
                trust_level=prepared.spec.trust,
                metadata={
                    "credential": name,
                    "use": "egress credential"
                    if name in prepared.grant.egress
                    else "worker secret",
                },
            )
        return values

    # -- clearance ------------------------------------------------------------------------

    def clear(
        self,
        change_id: str,
        *,
        branch: str | None = None,
        push: bool = False,
        override_scanners: bool = False,
        acknowledged: Sequence[str] = (),
        confirm: Callable[[Summary], bool] | None = None,
    ) -> ClearResult:
        """Commit a reviewed change set (an id or a unique prefix) into the project's repo,
        and push it with the credential ``clearance.credential`` names (read now, only when
        pushing, never written anywhere). ``confirm`` sees the summary first and may say no.
        ``acknowledged`` names the files that run code by themselves (each one must be).
        """
        from orchestrator.clearance import clear
        from orchestrator.clearance.errors import ClearanceError
        from orchestrator.clearance.scan import StagingScanners
        from orchestrator.errors import OrchestratorError
        from orchestrator.staging import scanners_for

        store = self.staging.store
        try:
            full_id = str(store.resolve(change_id))
        except OrchestratorError as exc:
            raise ClearanceError(str(exc), change_id=change_id) from None
        settings = self.project.config.clearance
        return clear(
            store,
            full_id,
            self.project.repo,
            branch=branch or settings.branch,
            push=push,
            remote=settings.remote,
            credential=self._push_credential() if push else None,
            override_scanners=override_scanners,
            acknowledged=acknowledged,
            confirm=confirm,
            audit=self.audit,
            scanners=StagingScanners(
                scanners_for(
                    limits=self.project.config.sandbox.outbox,
                    sensitive=settings.sensitive_paths,
                )
            ),
            protected=[self.project.sandbox_root],
        )

    def _push_credential(self) -> Credential | None:
        """The credential ``clearance.credential`` names, read now."""
        from orchestrator.clearance import resolve
        from orchestrator.clearance.errors import CredentialError

        name = self.project.config.clearance.credential
        if name is None:
            return None
        config = self.project.config.credentials.get(name)
        if config is None:
            known = ", ".join(sorted(self.project.config.credentials)) or "none"
            raise CredentialError(
                f"{self.project.file}: clearance.credential names '{name}', which is not in "
                f"credentials (known: {known}); add it or fix the name"
            )
        return resolve(name, config, audit=self.audit, base=self.project.root)
