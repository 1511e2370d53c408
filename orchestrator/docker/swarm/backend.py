"""The swarm backend: one run as one ``replicated-job`` service.

:class:`SwarmBackend` implements :class:`~orchestrator.runtime.backend.Backend`, so a swarm
run goes through the same lifecycle as a Docker one (:class:`orchestrator.runtime.run.Run`:
folders, inputs, access, set-id sweep, audit start and end, result). What is the swarm's:
the refusals (:func:`orchestrator.docker.swarm.render.refusal`, child workers, a node
without the run's paths or images), and per run the results folder (mounted at the
outbox's place, read with the hostile-safe rules once the task is gone), an internal
overlay network, the egress proxy as a service of the run, one swarm secret per granted
secret, and the worker's service. The task cannot be exec'd into from here, so the worker
is the task's own process, its output is read when it ends (not streamed), and sessions,
warm pools and child workers need the Docker backend. What a SIGKILLed orchestrator
leaves is removed by ``orchestrator gc`` (:func:`orchestrator.docker.swarm.engine.collect`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import IO, Any, NoReturn

from orchestrator.audit import AuditLog
from orchestrator.docker.engine import DockerEngine, start_failure_code
from orchestrator.docker.swarm import nodes, render
from orchestrator.docker.swarm.egress import proxy_task_template
from orchestrator.docker.swarm.engine import SwarmEngine, SwarmGc, collect
from orchestrator.egress import PROXY_IMAGE, parse_decisions, parse_floods
from orchestrator.errors import EngineError, ImageMissing, OrchestratorError
from orchestrator.exits import Exit
from orchestrator.plan import ContainerSpec
from orchestrator.prepare import Prepared
from orchestrator.runtime import run_folders
from orchestrator.runtime.backend import Capabilities, Outcome, OutputSink, Tail, pump
from orchestrator.runtime.credproxy import ProxyStart
from orchestrator.runtime.engine import EgressDecision, EgressLog, ImageDefaults, Stream
from orchestrator.runtime.execs import ExecRequest, ExecResult

__all__ = ["SwarmBackend", "SwarmLaunch", "results_folder"]

#: Why a set-id file on a swarm run's mounts is refused (no field for either on 1.41).
SETID_REASON = "swarm cannot set no-new-privileges, and its binds are not nosuid"


def results_folder(prepared: Prepared) -> Path:
    """The host folder mounted at the outbox's place: inside the run's own folder."""
    return prepared.paths.run_dir / "staged"


class SwarmBackend:
    """Runs as swarm services through ``engine`` (a manager); see the module docstring."""

    name = "swarm"
    #: No exec into a task, no pinned binds (each node's engine makes them), secrets as
    #: swarm secrets, no credential proxy, and set-id files always refused.
    capabilities = Capabilities(setid_refusal=SETID_REASON)

    def __init__(self, engine: SwarmEngine | None = None) -> None:
        self._engine = engine
        self._nodes_checked: set[tuple[str, str, Path]] = set()

    @property
    def engine(self) -> SwarmEngine:
        """The swarm manager's engine, connected on first use (``plan`` needs none)."""
        if self._engine is None:
            self._engine = SwarmEngine()
        return self._engine

    def check(self, prepared: Prepared) -> dict[str, Any]:
        spec = prepared.spec
        problem = self.refusal(prepared)
        if problem is not None:
            raise EngineError(problem)
        self.engine.check_manager()
        # As under Docker: never the engine's socket, and (when the orchestrator runs in a
        # container itself) only host folders it has checked.
        DockerEngine(self.engine.api).check_mounts(spec)
        if not self.engine.image_exists(spec.image):
            raise ImageMissing(spec.image)
        # Once per worker and backend (a batch's inputs bind the same folders).
        key = (spec.worker, spec.image, prepared.paths.sandbox_root)
        if key not in self._nodes_checked:
            self.check_nodes(prepared)
            self._nodes_checked.add(key)
        # The same keys as a Docker run's start: the runtime is the engine's default.
        return {"runtime": self.engine.default_runtime(), "not_enforced": render.not_enforced(spec)}

    @staticmethod
    def refusal(prepared: Prepared) -> str | None:
        """Why ``prepared`` cannot run on a swarm at all (pure), or None."""
        spec = prepared.spec
        problem = render.refusal(spec)
        if problem is None and prepared.grant.children:
            problem = (
                f"worker '{spec.worker}' may call child workers, and --engine swarm has no "
                "broker for them yet: run it with --engine docker (docs/scale-out.md)"
            )
        return problem

    def check_nodes(self, prepared: Prepared, *, force: bool = False) -> None:
        """Refuse unless every node a task may land on has the run's host paths and images
        (:mod:`orchestrator.docker.swarm.nodes`)."""
        spec = prepared.spec
        images = [spec.image]
        if spec.network.mode == "allowlist":
            images.append(PROXY_IMAGE)
        nodes.check_nodes(
            self.engine,
            spec,
            prepared.paths.sandbox_root,
            results=spec.outbox is not None,
            images=images,
            force=force,
        )

    def image(self, image: str) -> ImageDefaults | None:
        if not self.engine.image_exists(image):
            return None
        return DockerEngine(self.engine.api).image_defaults(image)

    def collect_garbage(self, *, everything: bool = False) -> SwarmGc:
        return collect(self.engine, everything=everything)

    def launch(self, prepared: Prepared, *, output: bool, keep_alive: bool) -> SwarmLaunch:
        # The task is its worker's own process (never idling: sessions and pools are refused
        # by their owner); its outbox is a host folder, read once the task is gone.
        return SwarmLaunch(self.engine, prepared)

    def cancel(self, run_id: str) -> None:
        self.engine.remove_run(run_id)

    @staticmethod
    def plan_facts(prepared: Prepared) -> dict[str, Any]:
        spec = prepared.spec
        refused = render.refusal(spec)
        if refused is None and prepared.grant.children:
            refused = "child workers: no broker on a swarm yet"
        return {
            "service": render.service_name(spec),
            "refused": refused,
            "not_enforced": render.not_enforced(spec),
        }


class SwarmLaunch:
    """One run's service, network, proxy and secrets; see
    :class:`~orchestrator.runtime.backend.Launch`."""

    def __init__(self, engine: SwarmEngine, prepared: Prepared) -> None:
        self.engine = engine
        self.prepared = prepared
        self.spec = prepared.spec
        self.made: list[tuple[str, str]] = []  # (kind, id), removed in reverse
        self.service_id: str | None = None
        self.proxy_id: str | None = None
        self.node: str | None = None
        self.worker_removed = False
        self.found = EgressLog()

    def prepare(self) -> None:
        if self.spec.outbox is None:
            return
        results = results_folder(self.prepared)
        run_folders.claim(self.prepared.paths.run_dir, self.spec.labels)  # gc: whose it is
        results.mkdir(parents=True, mode=0o700)
        if os.geteuid() == 0:
            os.chown(results, self.prepared.uid, self.prepared.gid)

    def create(
        self, spec: ContainerSpec, secrets: Mapping[str, str], *, started: Callable[[], None]
    ) -> None:
        engine = self.engine
        argv = None
        if spec.command is not None or spec.args:
            argv = [*engine.image_argv(spec.image, spec.command), *spec.args]
        network = engine.create_network(f"orchestrator-run-{spec.run_id}", spec.labels)
        self.made.append(("network", network))
        if spec.network.mode == "allowlist":
            self.proxy_id = self._start_proxy(network)
        refs = []
        for name, value in secrets.items():
            secret_name = f"orchestrator-{spec.run_id}-{name}"
            secret_id = engine.create_secret(secret_name, value, spec.labels)
            self.made.append(("secret", secret_id))
            refs.append(render.SecretRef(secret_id, secret_name, name))
        results = results_folder(self.prepared) if spec.outbox is not None else None
        service = render.service_spec(
            spec,
            argv=argv,
            network=network,
            results=str(results) if results is not None else None,
            secrets=refs,
        )
        self.service_id = engine.create_service(service)
        self.made.append(("service", self.service_id))
        started()

    def _start_proxy(self, internal: str) -> str:
        """The run's outside network and egress proxy, running and healthy."""
        engine, spec = self.engine, self.spec
        private = [s for name in spec.network.services for s in engine.swarm_subnets(name)]
        outside = engine.create_network(
            f"orchestrator-out-{spec.run_id}", spec.labels, internal=False
        )
        self.made.append(("network", outside))
        private = [*engine.swarm_subnets(outside), *private]
        template = proxy_task_template(
            spec.network.allow,
            internal=internal,
            outside=outside,
            services=list(spec.network.services),
            private=private,
        )
        proxy_id = engine.create_proxy(f"orchestrator-proxy-{spec.run_id}", template, spec.labels)
        self.made.append(("service", proxy_id))
        engine.wait_running(proxy_id, timeout=90)
        return proxy_id

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
        engine, spec = self.engine, self.spec
        assert self.service_id is not None
        end = engine.task_end(self.service_id, spec.limits.timeout_s)
        self.node = end.node_id
        if end.state is None:
            outcome.timed_out(spec)
        elif end.exit_code is None or end.state == "rejected":
            code = start_failure_code(end.error or "") or Exit.ERROR
            outcome.failed(code, f"the swarm could not run the task: {end.error or end.state}")
        elif end.exit_code == Exit.OOM and engine.oom_killed(end.container_id):
            outcome.oom(spec)
        else:
            outcome.exited(int(end.exit_code))
        stdout, stderr = engine.output(self.service_id, end.container_id)
        frames: list[tuple[Stream, bytes]] = [("stdout", stdout), ("stderr", stderr)]
        pump(iter([(stream, data) for stream, data in frames if data]), tails, sink)
        if self.proxy_id is not None:
            self._remove_worker()  # its tunnels are logged when they close
            text = engine.service_stdout(self.proxy_id)  # its only client is the worker
            floods = parse_floods(text)
            self.found = EgressLog(
                [
                    EgressDecision(d.host, d.port, d.allowed, d.method)
                    for d in parse_decisions(text)
                ],
                unlisted_denied=sum(f.denied for f in floods),
                unlisted_allowed=sum(f.allowed for f in floods),
                unlisted_bytes=sum(f.size for f in floods),
            )

    def collect(self, outcome: Outcome, staging: Any) -> None:
        """Read the results folder (hostile data) once the task is gone: its service is
        removed first (a timed-out task still runs), so nothing writes there any more."""
        try:
            self._remove_worker()
        except OrchestratorError as exc:
            lost = f"its results were not read: the task could not be removed ({exc})"
            outcome.error = f"{outcome.error}; {lost}" if outcome.error else lost
            return
        folder = results_folder(self.prepared)
        if folder.is_dir():
            outcome.collected = staging.outbox_dir(self.spec, folder)

    def _remove_worker(self) -> None:
        """Remove the worker's service and its task's container (idempotent)."""
        if self.service_id is not None and not self.worker_removed:
            self.engine.remove("service", self.service_id)
            self.engine.remove_containers(self.service_id)
            self.worker_removed = True

    def remove(self) -> bool:
        """Remove the run's services (and their containers), secrets and networks; never
        raises (gc removes what this could not). True when all went."""
        ok = True
        for kind, ident in reversed(self.made):
            try:
                self.engine.remove(kind, ident)
                if kind == "service":
                    self.engine.remove_containers(ident)
            except OrchestratorError:
                ok = False
        self.made.clear()
        return ok

    def decisions(self, since: datetime) -> EgressLog:
        return self.found

    def release(self) -> None:
        return None  # the run's networks went with remove()

    def ended(self) -> dict[str, Any]:
        return {"engine": "swarm", "node": self.node}

    # -- what a swarm run cannot do (its capabilities say so; refused before this) --------

    starts_at_create = True

    def exec(self, request: ExecRequest, on_output: OutputSink | None = None) -> ExecResult:
        self._cannot("exec into its task")

    def archive(self, entries: Sequence[tuple[str, str]]) -> AbstractContextManager[IO[bytes]]:
        self._cannot("read files out of its task")

    def credential_proxy(
        self, values: Mapping[str, str], audit: AuditLog
    ) -> AbstractContextManager[ProxyStart]:
        self._cannot("run a credential proxy")

    @staticmethod
    def _cannot(what: str) -> NoReturn:
        raise OrchestratorError(f"the swarm backend cannot {what}: use --engine docker")
