"""The container backend: a run as one container on a Docker-shaped engine.

:class:`ContainerBackend` implements :class:`~orchestrator.runtime.backend.Backend` over the
:class:`~orchestrator.runtime.engine.Engine` protocol (Docker, Podman through the same API,
and the tests' fake): the run's network (an allowlist's, with its proxy) before the start is
recorded; then create, attach, start and wait (the worker as the container's own process),
or, for a keep-alive container, start it idling and run the worker by exec with its outbox
read before the container goes (:mod:`orchestrator.runtime.supervised`). A live run's
execs (:mod:`orchestrator.runtime.execs`) and archives are engine execs into its container.
Exits are read by type (:class:`~orchestrator.errors.StartFailure`, ``ExitState``), never
from an engine's message.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import IO, Any

from orchestrator.audit import AuditLog
from orchestrator.errors import (
    ContainerStopped,
    EngineError,
    ImageMissing,
    OrchestratorError,
    StartFailure,
)
from orchestrator.exits import Exit
from orchestrator.plan import ContainerSpec
from orchestrator.prepare import Prepared
from orchestrator.runtime.backend import Capabilities, Outcome, OutputSink, Tail, pump
from orchestrator.runtime.credproxy import ProxyStart, credential_proxy
from orchestrator.runtime.engine import EgressLog, Engine, ImageDefaults, ManagedObject, Stream
from orchestrator.runtime.execs import ExecRequest, ExecResult, exec_in
from orchestrator.runtime.gc import GcReport, collect
from orchestrator.runtime.removal import remove_container, remove_run
from orchestrator.runtime.supervised import (
    TOOL_ENV,
    FrameReader,
    drain,
    kill_all,
    oom_killed,
    read_outbox,
    run_worker_exec,
)

log = logging.getLogger(__name__)

__all__ = ["ContainerBackend", "ContainerLaunch"]


class ContainerBackend:
    """Runs as containers on ``engine``; see the module docstring."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def name(self) -> str:
        """The engine's own name (``docker`` or ``podman``), asked when a run records it."""
        return self.engine.flavour()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            exec=True,
            pinned_mounts=self.engine.pins_mounts(),
            secret_files=True,
            credential_proxies=True,
        )

    def check(self, prepared: Prepared) -> dict[str, Any]:
        # Before anything exists: an engine without the plan's runtime or image runs nothing.
        runtime = self.engine.runtime_for(prepared.spec)
        if not self.engine.image_exists(prepared.spec.image):
            raise ImageMissing(prepared.spec.image)
        return {"runtime": runtime}

    def image(self, image: str) -> ImageDefaults | None:
        if not self.engine.image_exists(image):
            return None
        return self.engine.image_defaults(image)

    def collect_garbage(self, *, everything: bool = False) -> GcReport:
        return collect(self.engine, everything=everything)

    def launch(self, prepared: Prepared, *, output: bool, keep_alive: bool) -> ContainerLaunch:
        return ContainerLaunch(self.engine, prepared, output=output, keep_alive=keep_alive)

    def cancel(self, run_id: str) -> None:
        remove_run(self.engine, run_id)

    @staticmethod
    def plan_facts(prepared: Prepared) -> dict[str, Any] | None:
        return None


class ContainerLaunch:
    """One run's container; see :class:`~orchestrator.runtime.backend.Launch`."""

    def __init__(self, engine: Engine, prepared: Prepared, *, output: bool, keep_alive: bool):
        self.engine = engine
        self.prepared = prepared
        self.spec = prepared.spec
        self.output = output
        self.keep_alive = keep_alive
        self.container_id: str | None = None
        self.network: ManagedObject | None = None
        self.worker_gone = False
        self._reader: threading.Thread | None = None

    def prepare(self) -> None:
        if self.spec.network.mode != "none":
            self.network = self.engine.set_up_network(self.spec)

    def create(
        self, spec: ContainerSpec, secrets: Mapping[str, str], *, started: Callable[[], None]
    ) -> None:
        self.container_id = self.engine.create(spec)
        if self.keep_alive:
            self.engine.start(self.container_id)
            started()

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
        if self.keep_alive:
            self._by_exec(outcome, tails, sink, env, args)
        else:
            self._as_main_process(outcome, tails, sink, started)

    def _as_main_process(
        self,
        outcome: Outcome,
        tails: dict[Stream, Tail],
        sink: OutputSink | None,
        started: Callable[[], None],
    ) -> None:
        """attach → start → wait: the worker is the container's own process."""
        engine, spec = self.engine, self.spec
        assert self.container_id is not None
        # Joined in remove(), once the container is gone and its output has surely ended.
        if self.output or sink is not None:
            frames = engine.attach(self.container_id)
            self._reader = threading.Thread(target=pump, args=(frames, tails, sink), daemon=True)
            self._reader.start()
        try:
            engine.start(self.container_id)
        except StartFailure as exc:  # the worker's command cannot run: its failure
            outcome.failed(exc.code, str(exc))
            return
        except EngineError as exc:
            outcome.error = str(exc)
            raise
        started()
        code = engine.wait(self.container_id, timeout=spec.limits.timeout_s)
        if code is None:
            engine.kill(self.container_id)
            outcome.timed_out(spec)
        elif engine.exit_state(self.container_id).oom_killed:
            outcome.oom(spec)
        else:
            outcome.exited(code)

    def _by_exec(
        self,
        outcome: Outcome,
        tails: dict[Stream, Tail],
        sink: OutputSink | None,
        env: Mapping[str, str],
        args: Sequence[str],
    ) -> None:
        """The worker by exec (see :mod:`orchestrator.runtime.supervised`)."""
        engine, spec = self.engine, self.spec
        assert self.container_id is not None
        try:
            code, timed_out = run_worker_exec(
                engine,
                self.container_id,
                spec,
                lambda frames: pump(frames, tails, sink),
                env=env,
                args=args,
            )
        except StartFailure as exc:  # the worker's command cannot run: its failure
            outcome.failed(exc.code, str(exc))
            self.worker_gone = True  # run_worker_exec killed every process of the worker
            return
        stopped = code is None and not timed_out
        if code is not None and code >= 128 and not timed_out and spec.isolation == "gvisor":
            # runsc may report the sandbox's death as the exec's own end (128 and up)
            # before the engine has seen the container stop.
            stopped = engine.wait(self.container_id, timeout=3) is not None
        if stopped:
            # The container itself stopped under the worker (a gVisor sandbox at its memory
            # limit dies as a whole; runc kills only the biggest process). The engine may
            # not have recorded how yet: wait for it before reading its state.
            engine.wait(self.container_id, timeout=10)
        if stopped and engine.exit_state(self.container_id).oom_killed:
            outcome.oom(spec)
        elif timed_out:
            outcome.timed_out(spec)
        elif code == Exit.OOM and oom_killed(
            engine, self.container_id, spec.supervisor_user or spec.user
        ):
            outcome.oom(spec)
        elif code and spec.isolation == "gvisor" and engine.memory_peaked(self.container_id):
            # gVisor keeps a sandbox within its limit by failing allocations (ENOMEM: a
            # MemoryError, a failed malloc) rather than by a kill: a worker that failed
            # once its sandbox had reached the limit ran out of memory.
            outcome.oom(spec, killed=False)
        else:
            outcome.exited(code if code is not None else Exit.ERROR)
        self.worker_gone = True  # run_worker_exec killed every process of the worker

    def collect(self, outcome: Outcome, staging: Any) -> None:
        """Read the outbox (hostile data) once every process of the worker's user is gone."""
        if self.container_id is None or not self.keep_alive:
            return
        try:
            if not self.worker_gone:
                user = self.spec.user
                killing = kill_all(self.spec)
                drain(self.engine.exec(self.container_id, killing, user=user, env=TOOL_ENV))
                self.worker_gone = True
            outcome.collected = read_outbox(
                self.engine, self.container_id, self.spec, staging.outbox
            )
        except ContainerStopped:  # its tmpfs went with it
            lost = "its outbox was lost with its container, which had stopped"
            outcome.error = f"{outcome.error}; {lost}" if outcome.error else lost

    def remove(self) -> bool:
        removed = True
        if self.container_id is not None:
            removed = remove_container(self.engine, self.container_id)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return removed

    def decisions(self, since: datetime) -> EgressLog:
        return self.engine.network_decisions(self.spec, since)

    def release(self) -> None:
        network, self.network = self.network, None
        if network is None:
            return
        try:
            self.engine.remove_object(network)
        except OrchestratorError as exc:
            log.warning("could not remove the run's network %s: %s", network.name, exc)

    def ended(self) -> dict[str, Any]:
        return {}

    # -- a live run -----------------------------------------------------------------------

    def _live(self) -> str:
        if self.container_id is None:
            raise RuntimeError("the run's container is not created yet")
        return self.container_id

    def exec(self, request: ExecRequest, on_output: OutputSink | None = None) -> ExecResult:
        return exec_in(self.engine, self._live(), request, on_output)

    def archive(self, entries: Sequence[tuple[str, str]]) -> AbstractContextManager[IO[bytes]]:
        return self._archive(entries)

    @contextmanager
    def _archive(self, entries: Sequence[tuple[str, str]]) -> Iterator[IO[bytes]]:
        pairs: list[str] = []
        for folder, name in entries:
            # "./name": a worker's file named "--remove-files" is a name, never an option
            pairs += ["-C", folder, f"./{name}"]
        tar = ["/bin/sh", "-c", 'exec tar --sparse -cf - "$@"', "tar", *pairs]
        handle = self.engine.exec(self._live(), tar, user=self.spec.user, env=TOOL_ENV)
        try:
            yield io.BufferedReader(FrameReader(handle.frames), buffer_size=1 << 20)
        finally:
            close = getattr(handle.frames, "close", None)
            if close is not None:
                close()

    # -- egress credentials ---------------------------------------------------------------

    @property
    def starts_at_create(self) -> bool:
        # Only a one-shot container waits for run_worker to start; a keep-alive one
        # starts (idling) at create.
        return self.keep_alive

    def credential_proxy(
        self, values: Mapping[str, str], audit: AuditLog
    ) -> AbstractContextManager[ProxyStart]:
        return credential_proxy(self.engine, self.prepared, values, audit)
