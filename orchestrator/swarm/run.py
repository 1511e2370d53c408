"""One run as a swarm ``replicated-job`` service: create, wait, read, remove, collect.

The lifecycle of :mod:`orchestrator.runtime.run`, as far as a swarm allows: the run's
folders, inputs and the worker's access are made on this host as for a Docker run, the
start is audited before anything exists, and on every path (success, the worker's
failure, a timeout, Ctrl-C or SIGTERM, an engine error) the service, its network and its
secrets are removed. What a SIGKILLed orchestrator leaves is removed by ``orchestrator gc``
(:func:`orchestrator.swarm.engine.collect`). The task cannot be exec'd into from here, so
the worker is the task's own process, its output is read when it ends (not streamed), and
its results come back through a host folder mounted at the outbox's place, read once the
task is gone with :func:`orchestrator.staging.collect_dir`'s hostile-safe rules.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.audit import AuditLog
from orchestrator.docker import DockerEngine
from orchestrator.docker.engine import start_failure_code
from orchestrator.egress import PROXY_IMAGE, parse_decisions
from orchestrator.errors import EngineError, OrchestratorError
from orchestrator.exits import Exit, killed_for_memory, signalled, timed_out
from orchestrator.plan import ContainerSpec
from orchestrator.prepare import Prepared
from orchestrator.runtime import run_folders
from orchestrator.runtime.access import WorkerAccess, remove_run_dir
from orchestrator.runtime.engine import EgressDecision
from orchestrator.runtime.inputs import place_inputs
from orchestrator.runtime.preparation import prepare_filesystem
from orchestrator.runtime.removal import Interrupted
from orchestrator.runtime.run import (
    OutputSink,
    RunResult,
    Status,
    after_run_violations,
    audit_decisions,
    run_context,
    start_metadata,
)
from orchestrator.runtime.secrets import Redactor
from orchestrator.runtime.session_folders import remove_if_empty
from orchestrator.runtime.setid import SetidSweep, refuse_setid
from orchestrator.swarm import nodes, render
from orchestrator.swarm.egress import proxy_task_template
from orchestrator.swarm.engine import SwarmEngine, collect

__all__ = ["check", "check_nodes", "execute_swarm", "results_folder"]


def results_folder(prepared: Prepared) -> Path:
    """The host folder mounted at the outbox's place: inside the run's own folder."""
    return prepared.paths.run_dir / "staged"


def check(engine: SwarmEngine, prepared: Prepared) -> None:
    """Refuse, in one line and before anything is made, what cannot run on this swarm."""
    spec = prepared.spec
    problem = render.refusal(spec)
    if problem is not None:
        raise EngineError(problem)
    if prepared.grant.children:
        raise EngineError(
            f"worker '{spec.worker}' may call child workers, and --engine swarm has no broker "
            "for them yet: run it with --engine docker (docs/scale-out.md)"
        )
    engine.check_manager()
    # As under Docker: never the engine's socket, and (when the orchestrator runs in a
    # container itself) only host folders it has checked.
    DockerEngine(engine.api).check_mounts(spec)


def check_nodes(engine: SwarmEngine, prepared: Prepared, *, force: bool = False) -> None:
    """Refuse unless every node a task may land on has the run's host paths and images
    (:mod:`orchestrator.swarm.nodes`); once per run, or per batch."""
    spec = prepared.spec
    images = [spec.image]
    if spec.network.mode == "allowlist":
        images.append(PROXY_IMAGE)
    nodes.check_nodes(
        engine,
        spec,
        prepared.paths.sandbox_root,
        results=spec.outbox is not None,
        images=images,
        force=force,
    )


def execute_swarm(
    engine: SwarmEngine,
    prepared: Prepared,
    *,
    audit: AuditLog,
    staging: Any,
    secrets: Mapping[str, str] | None = None,
    on_output: OutputSink | None = None,
    started: Callable[[str], None] | None = None,
) -> RunResult:
    """Run ``prepared`` as a swarm service; see the module docstring. ``staging`` has an
    ``outbox_dir(spec, folder)`` and a ``zones(prepared)`` (a StagingReader or a batch's)."""
    spec = prepared.spec
    check(engine, prepared)
    # Neither nosuid binds nor no-new-privileges here: a set-id file mounted is refused.
    refuse_setid(prepared, why="swarm cannot set no-new-privileges, and its binds are not nosuid")
    given = secrets or {}
    values = {name: given[name] for name in prepared.grant.secrets if name in given}
    missing = sorted(set(prepared.grant.secrets) - set(values))
    if missing:
        raise OrchestratorError(
            f"secret(s) {', '.join(missing)} for '{spec.worker}' were not resolved; "
            "check the project's credentials"
        )
    if not engine.image_exists(spec.image):
        from orchestrator.errors import ImageMissing

        raise ImageMissing(spec.image)
    argv = None
    if spec.command is not None or spec.args:
        argv = [*engine.image_argv(spec.image, spec.command), *spec.args]
    redactor = Redactor(list(values.values()))
    for value in values.values():
        audit.add_secret(value)
    for obj in collect(engine).removed:
        audit.record("gc.removed", metadata={"kind": obj.kind, "name": obj.name})

    status: Status = "error"
    exit_code, error = int(Exit.ERROR), None
    stdout = stderr = b""
    outbox: Any = None
    asked: list[Any] = []
    made: list[tuple[str, str]] = []  # (kind, id), removed in reverse
    access: WorkerAccess | None = None
    setid: SetidSweep | None = None
    service_id: str | None = None
    proxy_id: str | None = None
    egress: list[dict[str, Any]] = []
    node: str | None = None  # the swarm node that ran the task
    begun = time.monotonic()
    opened = False
    try:
        prepare_filesystem(prepared)
        if prepared.inputs:
            place_inputs(prepared, prepared.inputs)
        results = results_folder(prepared) if spec.outbox is not None else None
        if results is not None:
            run_folders.claim(prepared.paths.run_dir, spec.labels)  # gc: whose folder it is
            results.mkdir(parents=True, mode=0o700)
            if os.geteuid() == 0:
                os.chown(results, prepared.uid, prepared.gid)
        audit.record(
            "run.started",
            **run_context(spec),
            metadata=_start_metadata(prepared, render.not_enforced(spec)),
        )
        opened = True
        begun = time.monotonic()
        access = WorkerAccess(prepared)
        if access.trees:
            access.grant()
            audit.record("access.granted", **run_context(spec), metadata=access.summary())
        setid = SetidSweep(prepared)
        setid.before()
        network = f"orchestrator-run-{spec.run_id}"
        made.append(("network", engine.create_network(network, spec.labels)))
        if spec.network.mode == "allowlist":
            proxy_id = _start_proxy(engine, spec, made[0][1], made)
        refs = []
        for name, value in values.items():
            secret_name = f"orchestrator-{spec.run_id}-{name}"
            secret_id = engine.create_secret(secret_name, value, spec.labels)
            made.append(("secret", secret_id))
            refs.append(render.SecretRef(secret_id, secret_name, name))
        service = render.service_spec(
            spec,
            argv=argv,
            network=made[0][1],
            results=str(results) if results is not None else None,
            secrets=refs,
        )
        service_id = engine.create_service(service)
        made.append(("service", service_id))
        if started is not None:
            started(spec.run_id)
        end = engine.task_end(service_id, spec.limits.timeout_s)
        node = end.node_id
        if end.state is None:
            status, exit_code = "timeout", Exit.TIMEOUT
            error = timed_out(spec.limits.timeout_s)
        elif end.exit_code is None or end.state == "rejected":
            status, exit_code = "error", start_failure_code(end.error or "") or Exit.ERROR
            error = f"the swarm could not run the task: {end.error or end.state}"
        elif end.exit_code == Exit.OOM and engine.oom_killed(end.container_id):
            status, exit_code = "oom", Exit.OOM
            error = killed_for_memory(spec.limits.memory)
        else:
            status, exit_code = "exited", int(end.exit_code)
        stdout, stderr = engine.output(service_id, end.container_id)
        if proxy_id is not None:
            engine.remove("service", service_id)  # tunnels are logged when they close
            engine.remove_containers(service_id)
            found = parse_decisions(engine.service_stdout(proxy_id))
            egress = audit_decisions(
                [EgressDecision(d.host, d.port, d.allowed, d.method) for d in found], spec, audit
            )
    except Interrupted as exc:
        status, exit_code, error = "interrupted", signalled(exc.signum), str(exc)
        raise
    except OrchestratorError as exc:
        error = error or str(exc)
        raise
    finally:
        removed = _remove(engine, made)
        if setid is not None:  # what the task left: set-id bits stripped, each audited
            setid.after(audit, **run_context(spec))
        if access is not None and access.trees:  # recorded as a Docker run records it
            problems = access.release()
            audit.record(
                "access.released",
                allowed=not problems,
                reason="; ".join(problems) or None,
                **run_context(spec),
                metadata={"entries": access.summary()["entries"], "kept_for_gc": bool(problems)},
            )
        if stdout or stderr:
            _echo(on_output, redactor, stdout, stderr)
        try:
            if staging is not None and spec.outbox is not None and removed and opened:
                folder = results_folder(prepared)
                if folder.is_dir():
                    outbox = staging.outbox_dir(spec, folder)
            if staging is not None and opened:
                asked = staging.zones(prepared)
        finally:
            violations = after_run_violations(prepared, audit) if opened else []
            result = RunResult(
                run_id=spec.run_id,
                worker=spec.worker,
                exit_code=exit_code,
                status=status,
                duration_s=round(time.monotonic() - begun, 3),
                stdout=redactor.tail(stdout[-(64 << 10) :], truncated=len(stdout) > 64 << 10),
                stderr=redactor.tail(stderr[-(64 << 10) :], truncated=len(stderr) > 64 << 10),
                container_removed=removed,
                error=redactor.text(error) if error else None,
                outbox=outbox,
                asked=asked,
                egress=egress,
                violations=violations,
            )
            if opened:
                audit.record(
                    "run.ended",
                    allowed=status == "exited",
                    reason=result.error,
                    **run_context(spec),
                    metadata={
                        "exit_code": exit_code,
                        "status": status,
                        "duration_s": result.duration_s,
                        "container_removed": removed,
                        "engine": "swarm",
                        "node": node,
                    },
                )
            remove_run_dir(prepared.paths.run_dir)
            if prepared.fresh_session:
                remove_if_empty(prepared.paths.session)
    return result


def _remove(engine: SwarmEngine, made: list[tuple[str, str]]) -> bool:
    """Remove the run's services (and their containers), secrets and networks; never
    raises (gc removes what this could not). True when all went."""
    ok = True
    for kind, ident in reversed(made):
        try:
            engine.remove(kind, ident)
            if kind == "service":
                engine.remove_containers(ident)
        except OrchestratorError:
            ok = False
    return ok


def _start_proxy(
    engine: SwarmEngine, spec: ContainerSpec, internal: str, made: list[tuple[str, str]]
) -> str:
    """The run's outside network and egress proxy, running and healthy."""
    assert spec.network.mode == "allowlist"
    private = [s for name in spec.network.services for s in engine.swarm_subnets(name)]
    outside = engine.create_network(f"orchestrator-out-{spec.run_id}", spec.labels, internal=False)
    made.append(("network", outside))
    private = [*engine.swarm_subnets(outside), *private]
    template = proxy_task_template(
        spec.network.allow,
        internal=internal,
        outside=outside,
        services=list(spec.network.services),
        private=private,
    )
    proxy_id = engine.create_proxy(f"orchestrator-proxy-{spec.run_id}", template, spec.labels)
    made.append(("service", proxy_id))
    engine.wait_running(proxy_id, timeout=90)
    return proxy_id


def _echo(on_output: OutputSink | None, redactor: Redactor, out: bytes, err: bytes) -> None:
    if on_output is None:
        return
    try:
        if out:
            on_output("stdout", redactor.scrub(out))
        if err:
            on_output("stderr", redactor.scrub(err))
    except OSError:
        pass


def _start_metadata(prepared: Prepared, not_enforced: list[str]) -> dict[str, Any]:
    return {"engine": "swarm", **start_metadata(prepared, 0), "not_enforced": not_enforced}
