"""An in-memory :class:`~orchestrator.runtime.engine.Engine` for the runtime's unit tests.

It implements the whole protocol with the protocol's own signatures: the assignment at the
bottom is checked by mypy (``test_fake_engine_satisfies_the_protocol`` runs it), and the
same test compares the members at runtime, so a method added to the protocol fails here
first instead of being missed by a fake that quietly lacks it. Its behaviour (a container's
states, wait with a timeout, kill, exec into a stopped container, the labels it lists) is
held to the real engine's by tests/integration/test_engine_contract.py, which runs the same
cases on both; what a command prints and returns is declared per test in ``programs``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

from orchestrator import labels
from orchestrator.errors import ContainerStopped, EngineError, EngineUnreachable, StartFailure
from orchestrator.plan import ContainerSpec
from orchestrator.runtime import Interrupted
from orchestrator.runtime.engine import (
    EgressDecision,
    EgressLog,
    Engine,
    ExecHandle,
    ExitState,
    ImageDefaults,
    ManagedObject,
    Stream,
)

WaitResult = Literal["exit", "timeout", "interrupt", "engine-error"]


@dataclass
class FakeExec:
    """An exec'd command that printed ``frames`` and ended with ``code`` (or could not
    start: ``failure``)."""

    frames: Iterator[tuple[Stream, bytes]]
    code: int | None = 0
    failure: StartFailure | None = None

    def exit_code(self) -> int | None:
        if self.failure is not None:
            raise self.failure
        return self.code


@dataclass(frozen=True)
class ExecCall:
    """One exec the fake was asked for."""

    argv: list[str]
    user: str
    env: dict[str, str] | None
    workdir: str | None
    stdin: bytes | None


@dataclass(frozen=True)
class Program:
    """What a command does in the fake: its output, then its exit code (or it runs on)."""

    frames: tuple[tuple[Stream, bytes], ...] = ()
    code: int = 0
    runs: bool = False
    """It never ends by itself (``sleep``): only a kill stops it."""


@dataclass
class _Container:
    program: Program | None
    labels: dict[str, str]
    name: str
    state: Literal["created", "running", "exited"] = "created"
    code: int | None = None


@dataclass
class FakeEngine:
    """An in-memory engine; each behaviour is set per test.

    ``down_for`` makes the engine stop answering (every call raises
    :class:`EngineUnreachable`) for that many calls, starting with the first ``remove``:
    a restart that begins as the run ends.
    """

    exit_code: int = 0
    wait_result: WaitResult = "exit"
    start_error: EngineError | None = None
    """What ``start`` raises (e.g. a :class:`StartFailure`)."""
    exec_failure: StartFailure | None = None
    """What the next exec's ``exit_code`` raises: its command could not start."""
    oom: bool = False
    down_for: int = 0
    calls: list[str] = field(default_factory=list)
    containers: set[str] = field(default_factory=set)
    managed: list[ManagedObject] = field(default_factory=list)
    decisions: list[EgressDecision] = field(default_factory=list)
    unlisted_denied: int = 0
    """Denied requests the proxy only counted (a flood), besides ``decisions``."""
    execs: list[ExecCall] = field(default_factory=list)
    """Every exec asked for, in order."""
    exec_frames: list[list[tuple[Stream, bytes]]] = field(default_factory=list)
    """What the next execs print, one list of frames each (then the default output)."""
    runtimes: set[str] = field(default_factory=lambda: {"runc", "fake-runsc"})
    """The runtimes the engine has (drop ``fake-runsc`` for one without gVisor)."""
    programs: dict[tuple[str, ...], Program] = field(default_factory=dict)
    """What a container's command or an exec's argv does; others print the default
    output and end with ``exit_code``."""
    _down: int = 0
    _made: dict[str, _Container] = field(default_factory=dict)

    def _answer(self, call: str) -> None:
        self.calls.append(call)
        if call == "remove" and self.down_for and not self._down:
            self._down, self.down_for = self.down_for, 0
        if self._down:
            self._down -= 1
            raise EngineUnreachable(f"engine unreachable while {call}")

    def ping(self) -> None:
        self._answer("ping")

    def flavour(self) -> str:
        return "docker"  # it stands in for a Docker-shaped engine

    def image_exists(self, image: str) -> bool:
        return True

    def pins_mounts(self) -> bool:
        return False

    def runtime_for(self, spec: ContainerSpec) -> str:
        name = {"runc": "runc", "gvisor": "fake-runsc"}[spec.isolation]
        if name not in self.runtimes:
            raise EngineError(f"no '{name}' runtime: `orchestrator engine setup --gvisor`")
        return name

    def create(self, spec: ContainerSpec) -> str:
        self.runtime_for(spec)
        self._answer("create")
        container_id = f"c{len(self._made) + 1}"
        program = self.programs.get(tuple(spec.command or ()))
        owned = {**spec.labels, **labels.current_owner().labels()}
        name = f"orchestrator-{spec.run_id}"
        self._made[container_id] = _Container(program, owned, name)
        self.containers.add(container_id)
        return container_id

    def attach(self, container_id: str) -> Iterator[tuple[Stream, bytes]]:
        self._answer("attach")
        program = self._container(container_id).program
        if program is not None:
            return iter(program.frames)
        return iter([("stdout", b"out\n"), ("stderr", b"err\n")])

    def start(self, container_id: str) -> None:
        self._answer("start")
        if self.start_error is not None:
            raise self.start_error
        self._container(container_id).state = "running"

    def wait(self, container_id: str, timeout: float | None) -> int | None:
        self._answer("wait")
        if self.wait_result == "timeout":
            return None
        if self.wait_result == "interrupt":
            raise Interrupted(15)
        if self.wait_result == "engine-error":
            raise EngineError("connection to the Docker engine lost while waiting")
        made = self._container(container_id)
        if made.state == "running":
            if made.program is not None and made.program.runs:
                if timeout is None:
                    raise AssertionError("the fake would wait forever: nothing kills it")
                return None
            made.state = "exited"
            made.code = made.program.code if made.program is not None else self.exit_code
        return made.code if made.code is not None else self.exit_code

    def memory_peaked(self, container_id: str) -> bool:
        return self.oom

    def exit_state(self, container_id: str) -> ExitState:
        made = self._made.get(container_id)
        code = made.code if made is not None and made.code is not None else self.exit_code
        return ExitState(exit_code=code, oom_killed=self.oom)

    def kill(self, container_id: str) -> None:
        self._answer("kill")
        made = self._made.get(container_id)
        if made is not None and made.state == "running":
            made.state, made.code = "exited", 137

    def remove(self, container_id: str) -> bool:
        self._answer("remove")
        self.containers.discard(container_id)
        self._made.pop(container_id, None)
        return True

    def _container(self, container_id: str) -> _Container:
        """A container the fake made (those it did not make: a default one, for tests
        that exec into a container they never created)."""
        return self._made.get(container_id) or _Container(None, {}, container_id, "running")

    def image_argv(self, image: str, command: list[str] | None) -> list[str]:
        return list(command or ["true"])

    def image_defaults(self, image: str) -> ImageDefaults:
        return ImageDefaults("0", "/")

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
        self._answer("exec")
        self.execs.append(ExecCall(argv, user, env, workdir, stdin))
        if self._container(container_id).state != "running":
            raise ContainerStopped(f"container {container_id} is not running")
        program = self.programs.get(tuple(argv))
        if program is not None:
            return FakeExec(iter(program.frames), program.code)
        failure, self.exec_failure = self.exec_failure, None
        if self.exec_frames:
            return FakeExec(iter(self.exec_frames.pop(0)), self.exit_code, failure)
        if failure is not None:
            return FakeExec(iter([("stdout", str(failure).encode())]), self.exit_code, failure)
        return FakeExec(iter([("stdout", b"out\n")]), self.exit_code)

    def set_up_network(self, spec: ContainerSpec) -> ManagedObject | None:
        self._answer("network")
        if spec.network.mode != "allowlist":
            return None
        return ManagedObject("network", f"net-{spec.run_id}", f"net-{spec.run_id}", {})

    def network_decisions(self, spec: ContainerSpec, since: datetime) -> EgressLog:
        return EgressLog(list(self.decisions), unlisted_denied=self.unlisted_denied)

    def collect_shared(self, idle_seconds: float) -> list[str]:
        return []

    def image_ca_bundle(self, image: str) -> bytes:
        return b""

    def start_credential_proxy(self, spec: ContainerSpec, state: Path, user: str) -> str:
        self._answer("credproxy")
        return f"credproxy-{spec.run_id}"

    def credential_proxy_log(self, container_id: str) -> str:
        return ""

    def list_managed(self) -> list[ManagedObject]:
        self._answer("list")
        made = [
            ManagedObject("container", cid, c.name, dict(c.labels)) for cid, c in self._made.items()
        ]
        return list(self.managed) + made

    def remove_object(self, obj: ManagedObject) -> bool:
        self._answer(f"remove-{obj.kind}-{obj.name}")
        if obj.kind == "container":
            self._made.pop(obj.id, None)
            self.containers.discard(obj.id)
        return True


#: Checked by mypy: the fake must satisfy the protocol the runtime is typed against.
_AS_ENGINE: Engine = FakeEngine()
_AS_EXEC: ExecHandle = FakeExec(iter([]))
