"""One run: create → attach → start → wait (timeout) → remove, on every path.

The container is removed whatever happens: success, the worker's failure, a timeout (kill,
then remove), Ctrl-C or SIGTERM to the orchestrator, or an engine error half-way. Leftovers
of an orchestrator that could not even get that far (SIGKILL) are found by their owner
labels and removed by :func:`orchestrator.runtime.gc.collect`.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import IO, Any, Literal, Protocol

from orchestrator import labels
from orchestrator.audit import AuditLog
from orchestrator.errors import EngineError, OrchestratorError
from orchestrator.plan import ContainerSpec
from orchestrator.runtime.broker import Broker
from orchestrator.runtime.engine import Engine, Stream
from orchestrator.runtime.gc import collect
from orchestrator.runtime.preparation import Prepared, prepare_filesystem
from orchestrator.runtime.secrets import RedactingSink, Redactor, delivered
from orchestrator.runtime.supervised import (
    OutboxReader,
    oom_killed,
    read_outbox,
    run_worker_exec,
)

log = logging.getLogger(__name__)

Status = Literal["exited", "timeout", "oom", "error", "interrupted"]
OutputSink = Callable[[Stream, bytes], None]

EXIT_TIMEOUT = 124
EXIT_OOM = 137
EXIT_CANNOT_INVOKE = 126
EXIT_NOT_FOUND = 127
TAIL_BYTES = 64 << 10


class Staging(Protocol):
    """Where what a run produced goes: its outbox stream, and its private zone copies."""

    def outbox(self, spec: ContainerSpec, stream: IO[bytes]) -> Any:
        """Read one run's outbox tar stream (hostile data); say what it became."""

    def zones(self, prepared: Prepared) -> list[Any]:
        """Turn the run's private copies of ``ask`` zones into change sets; remove them."""


class Interrupted(BaseException):
    """The orchestrator was told to stop (SIGINT or SIGTERM) while a run was in flight."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outbox"] = getattr(self.outbox, "summary", lambda: self.outbox)()
        data["asked"] = [getattr(item, "summary", lambda i=item: i)() for item in self.asked]
        return data


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


def execute(
    engine: Engine,
    prepared: Prepared,
    *,
    on_output: OutputSink | None = None,
    audit: AuditLog | None = None,
    depth: int = 0,
    staging: Staging | None = None,
    secrets: Mapping[str, str] | None = None,
) -> RunResult:
    """Run a prepared plan in a new container and remove it afterwards, on every path.

    With ``audit``, the start (everything the container gets) is recorded before anything
    is created, so a run that cannot be audited never starts; the end is recorded after the
    container is gone. ``secrets`` holds resolved values by name; the grant decides which of
    them this run gets, and every value is redacted from output, errors and the audit log.
    """
    try:
        return _execute(engine, prepared, on_output, audit, depth, staging, secrets or {})
    finally:
        # The run's own folder (broker socket, ask copies) never outlives the run.
        shutil.rmtree(prepared.paths.run_dir, ignore_errors=True)


def _execute(
    engine: Engine,
    prepared: Prepared,
    on_output: OutputSink | None,
    audit: AuditLog | None,
    depth: int,
    staging: Staging | None,
    secrets: Mapping[str, str],
) -> RunResult:
    spec = prepared.spec
    values = _granted_secrets(prepared, secrets)
    redactor = Redactor(list(values.values()))
    if audit is not None:
        for value in values.values():
            audit.add_secret(value)
    prepare_filesystem(prepared)
    for obj in collect(engine).removed:
        if audit is not None:
            audit.record("gc.removed", metadata={"kind": obj.kind, "name": obj.name})
    if spec.network_mode != "none":
        engine.prepare_network(spec)
    if audit is not None:
        audit.record("run.started", **_context(spec), metadata=_start_metadata(prepared, depth))
    wall_start = datetime.now(UTC) - timedelta(seconds=1)
    broker: Broker | None = None
    started = time.monotonic()
    tails: dict[Stream, Tail] = {"stdout": Tail(), "stderr": Tail()}
    outcome = _Outcome()
    failed = False
    try:
        if prepared.grant.children:
            broker = Broker(
                prepared,
                depth=depth,
                run_child=lambda child, level: execute(
                    engine,
                    child,
                    audit=audit,
                    depth=level,
                    staging=staging,
                    secrets=values,
                ),
                cancel_child=lambda run_id: _remove_run(engine, run_id),
                audit=audit,
            )
            broker.start()
        with delivered(prepared.paths.secrets_dir, values, prepared.uid, prepared.gid):
            sink = RedactingSink(on_output, values) if redactor and on_output else None
            reader = staging.outbox if staging is not None else None
            _run_container(engine, spec, tails, sink or on_output, outcome, reader)
            if sink is not None:
                sink.flush()
    except BaseException:
        failed = True
        raise
    finally:
        if broker is not None:
            broker.close(cancel=failed)
        asked = staging.zones(prepared) if staging is not None else []
        egress = _egress_decisions(engine, spec, wall_start, audit)
        result = RunResult(
            run_id=spec.run_id,
            worker=spec.worker,
            exit_code=outcome.exit_code,
            status=outcome.status,
            duration_s=round(time.monotonic() - started, 3),
            stdout=redactor.tail(tails["stdout"].buffer, truncated=tails["stdout"].truncated),
            stderr=redactor.tail(tails["stderr"].buffer, truncated=tails["stderr"].truncated),
            container_removed=outcome.removed,
            error=redactor.text(outcome.error) if outcome.error else None,
            outbox=outcome.collected,
            asked=asked,
            egress=egress,
        )
        if audit is not None:
            audit.record(
                "run.ended",
                allowed=result.status == "exited",
                reason=result.error,
                **_context(spec),
                metadata={
                    "exit_code": result.exit_code,
                    "status": result.status,
                    "duration_s": result.duration_s,
                    "container_removed": result.container_removed,
                },
            )
    return result


def _egress_decisions(
    engine: Engine, spec: ContainerSpec, since: datetime, audit: AuditLog | None
) -> list[dict[str, Any]]:
    """Collect the proxy's decisions after the run, into the audit log and the result."""
    if spec.egress is None:
        return []
    try:
        found = engine.network_decisions(spec, since)
    except OrchestratorError as exc:
        log.warning("could not read the egress proxy's decisions: %s", exc)
        return []
    rows = []
    for decision in found:
        rows.append({"host": decision.host, "port": decision.port, "allowed": decision.allowed})
        if audit is not None:
            audit.record(
                "egress.decision",
                allowed=decision.allowed,
                reason=None if decision.allowed else "not in the allowlist",
                **_context(spec),
                metadata={"host": decision.host, "port": decision.port, "method": decision.method},
            )
    return rows


def _granted_secrets(prepared: Prepared, secrets: Mapping[str, str]) -> dict[str, str]:
    missing = [name for name in prepared.grant.secrets if name not in secrets]
    if missing:
        raise OrchestratorError(
            f"secret(s) {', '.join(missing)} for '{prepared.spec.worker}' were not resolved; "
            "check the project's credentials"
        )
    return {name: secrets[name] for name in prepared.grant.secrets}


@dataclass
class _Outcome:
    status: Status = "error"
    exit_code: int = 125
    error: str | None = None
    removed: bool = True
    collected: Any = None

    def timed_out(self, spec: ContainerSpec) -> None:
        self.status, self.exit_code = "timeout", EXIT_TIMEOUT
        self.error = f"timed out after {spec.timeout_s:g} s; the worker was killed"

    def oom(self, spec: ContainerSpec) -> None:
        self.status, self.exit_code = "oom", EXIT_OOM
        self.error = f"killed for exceeding its memory limit ({spec.mem_limit} bytes)"


def _run_container(
    engine: Engine,
    spec: ContainerSpec,
    tails: dict[Stream, Tail],
    on_output: OutputSink | None,
    outcome: _Outcome,
    outbox_reader: OutboxReader | None,
) -> None:
    """create → attach → start → wait → remove; ``outcome`` is filled in on every path."""
    container_id: str | None = None
    reader: threading.Thread | None = None
    try:
        container_id = engine.create(spec)
        outcome.removed = False
        if spec.supervisor_user is not None:
            engine.start(container_id)
            _supervised(engine, container_id, spec, tails, on_output, outcome, outbox_reader)
            return
        reader = _start_reader(engine.attach(container_id), tails, on_output)
        try:
            engine.start(container_id)
        except EngineError as exc:
            code = _start_failure_code(str(exc))
            if code is None:
                outcome.error = str(exc)
                raise
            outcome.status, outcome.exit_code, outcome.error = "error", code, str(exc)
            return
        code = engine.wait(container_id, timeout=spec.timeout_s)
        if code is None:
            engine.kill(container_id)
            outcome.timed_out(spec)
            return
        if engine.exit_state(container_id).oom_killed:
            outcome.oom(spec)
        else:
            outcome.status, outcome.exit_code = "exited", code
    except Interrupted as exc:
        outcome.status, outcome.exit_code = "interrupted", 128 + exc.signum
        outcome.error = str(exc)
        raise
    except EngineError as exc:
        outcome.error = outcome.error or str(exc)
        raise
    finally:
        if container_id is not None:
            outcome.removed = _remove(engine, container_id)
        if reader is not None:
            reader.join(timeout=5)


def _supervised(
    engine: Engine,
    container_id: str,
    spec: ContainerSpec,
    tails: dict[Stream, Tail],
    on_output: OutputSink | None,
    outcome: _Outcome,
    outbox_reader: OutboxReader | None,
) -> None:
    """The worker by exec (see :mod:`orchestrator.runtime.supervised`), then its outbox."""
    code, timed_out = run_worker_exec(
        engine, container_id, spec, lambda frames: _pump(frames, tails, on_output)
    )
    exec_failure = tails["stdout"].text().startswith("OCI runtime exec failed")
    if timed_out:
        outcome.timed_out(spec)
    elif code in (EXIT_CANNOT_INVOKE, EXIT_NOT_FOUND) and exec_failure:
        message = tails["stdout"].text().strip()
        outcome.status, outcome.error = "error", message
        outcome.exit_code = _start_failure_code(message) or EXIT_CANNOT_INVOKE
    elif code == EXIT_OOM and oom_killed(engine, container_id, spec.supervisor_user or spec.user):
        outcome.oom(spec)
    else:
        outcome.status, outcome.exit_code = "exited", code if code is not None else 125
    if outbox_reader is not None:
        outcome.collected = read_outbox(engine, container_id, spec, outbox_reader)


def _context(spec: ContainerSpec) -> dict[str, Any]:
    return {
        "worker": spec.worker,
        "run_id": spec.run_id,
        "session_id": spec.session_id,
        "trust_level": spec.trust,
    }


def _start_metadata(prepared: Prepared, depth: int) -> dict[str, Any]:
    spec = prepared.spec
    return {
        "image": spec.image,
        "user": spec.user,
        "mounts": [
            {"target": m.target, "source": m.source, "mode": "ro" if m.read_only else "rw"}
            for m in spec.mounts
        ],
        "masks": sorted(prepared.grant.masks),
        "network": spec.network_mode,
        "egress": spec.egress,
        "limits": {
            "memory": spec.mem_limit,
            "nano_cpus": spec.nano_cpus,
            "pids": spec.pids_limit,
            "timeout_s": spec.timeout_s,
        },
        "children": list(prepared.grant.children),
        "depth": depth,
        "env": sorted(spec.env),  # names only: values may be sensitive
    }


def _pump(
    frames: Iterator[tuple[Stream, bytes]], tails: dict[Stream, Tail], on_output: OutputSink | None
) -> None:
    sink = on_output
    for stream, chunk in frames:
        tails[stream].add(chunk)
        if sink is not None:
            try:
                sink(stream, chunk)
            except OSError:  # the terminal went away: keep capturing, stop echoing
                sink = None


def _start_reader(
    frames: Iterator[tuple[Stream, bytes]], tails: dict[Stream, Tail], on_output: OutputSink | None
) -> threading.Thread:
    thread = threading.Thread(target=_pump, args=(frames, tails, on_output), daemon=True)
    thread.start()
    return thread


def _remove_run(engine: Engine, run_id: str) -> None:
    """Remove every container of ``run_id`` (a child cancelled with its parent)."""
    for obj in engine.list_managed():
        if obj.kind == "container" and obj.labels.get(labels.RUN_ID) == run_id:
            try:
                engine.remove_object(obj)
            except EngineError as exc:
                log.warning("could not remove %s of run %s: %s", obj.name, run_id, exc)


def _start_failure_code(message: str) -> int | None:
    """Docker's own convention for a command that cannot run: 127 missing, 126 not runnable."""
    lowered = message.lower()
    if "executable file not found" in lowered or "no such file or directory" in lowered:
        return EXIT_NOT_FOUND
    if "permission denied" in lowered or "exec format error" in lowered:
        return EXIT_CANNOT_INVOKE
    return None


def _remove(engine: Engine, container_id: str) -> bool:
    """Remove the container; never raises, so it cannot hide the run's own outcome."""
    for attempt in range(3):
        try:
            return engine.remove(container_id)
        except EngineError as exc:
            log.warning(
                "removing container %s failed (attempt %d): %s", container_id[:12], attempt + 1, exc
            )
        except Interrupted:
            continue  # a second Ctrl-C must not leave the container behind
        time.sleep(0.2 * (attempt + 1))
    return False
