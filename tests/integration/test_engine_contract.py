"""The engine contract: the same cases against the unit tests' fake and the real engine.

The runtime's unit tests trust :class:`tests.unit.fake_engine.FakeEngine` to behave like an
engine; these cases hold it to that. Each runs once on the fake and once on the real engine
(Docker, or Podman with ``--engine=podman``) and asserts the same things: a container's
states, its output by stream, wait with a timeout, kill, exec (stdin, exit codes, a stopped
container), what the inventory lists and removes, and a run without a network.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from orchestrator import labels
from orchestrator.config import load_project, load_worker
from orchestrator.errors import ContainerStopped
from orchestrator.plan import ContainerSpec
from orchestrator.prepare import prepare
from orchestrator.runtime.engine import EgressLog, Engine
from tests.unit.fake_engine import FakeEngine, Program

EXITS_3 = ["sh", "-c", "printf out; printf err >&2; exit 3"]
RUNS_ON = ["sleep", "60"]
ECHOES_5 = ["sh", "-c", "cat; printf e >&2; exit 5"]

#: What these commands do, for the fake (the real engine runs them).
PROGRAMS = {
    tuple(EXITS_3): Program((("stdout", b"out"), ("stderr", b"err")), code=3),
    tuple(RUNS_ON): Program(runs=True),
    tuple(ECHOES_5): Program((("stdout", b"hi"), ("stderr", b"e")), code=5),
}


class Contract:
    """An engine under test, and the containers a case made (removed afterwards)."""

    def __init__(self, engine: Engine, spec: ContainerSpec) -> None:
        self.engine = engine
        self.base = spec
        self.made: list[str] = []

    def spec(self, command: list[str]) -> ContainerSpec:
        run_id = uuid.uuid4().hex[:12]
        return replace(
            self.base,
            command=command,
            run_id=run_id,
            labels={**self.base.labels, labels.RUN_ID: run_id},
        )

    def create(self, command: list[str]) -> str:
        container_id = self.engine.create(self.spec(command))
        self.made.append(container_id)
        return container_id


@pytest.fixture(params=["fake", "real"])
def contract(request, project):
    project.isolation = "runc"
    project.write_project()
    project.worker("w", 'command: ["true"]')
    loaded = load_project(project.root)
    spec = prepare(loaded, load_worker(loaded, "w")).spec
    engine = (
        FakeEngine(programs=PROGRAMS)
        if request.param == "fake"
        else request.getfixturevalue("engine")
    )
    case = Contract(engine, spec)
    yield case
    for container_id in case.made:
        engine.remove(container_id)


def by_stream(frames) -> dict[str, bytes]:
    joined = {"stdout": b"", "stderr": b""}
    for stream, data in frames:
        joined[stream] += data
    return joined


def test_a_container_runs_to_its_exit_code_and_removal_is_idempotent(contract):
    engine = contract.engine
    container_id = contract.create(EXITS_3)
    output = engine.attach(container_id)
    engine.start(container_id)
    assert engine.wait(container_id, timeout=60) == 3
    assert by_stream(output) == {"stdout": b"out", "stderr": b"err"}
    state = engine.exit_state(container_id)
    assert (state.exit_code, state.oom_killed) == (3, False)
    assert engine.remove(container_id) is True
    assert engine.remove(container_id) is True  # already gone is still success
    assert container_id not in {o.id for o in engine.list_managed()}


def test_wait_times_out_on_a_running_container_and_kill_ends_it(contract):
    engine = contract.engine
    container_id = contract.create(RUNS_ON)
    engine.start(container_id)
    assert engine.wait(container_id, timeout=0.5) is None
    engine.kill(container_id)
    assert engine.wait(container_id, timeout=30) == 137
    assert engine.exit_state(container_id).exit_code == 137
    engine.kill(container_id)  # a stopped container: no error


def test_exec_feeds_stdin_and_reports_its_code_and_refuses_a_stopped_container(contract):
    engine = contract.engine
    container_id = contract.create(RUNS_ON)
    engine.start(container_id)
    handle = engine.exec(container_id, ECHOES_5, user=contract.base.user, stdin=b"hi")
    assert by_stream(handle.frames) == {"stdout": b"hi", "stderr": b"e"}
    assert handle.exit_code() == 5
    engine.kill(container_id)
    engine.wait(container_id, timeout=30)
    with pytest.raises(ContainerStopped):
        engine.exec(container_id, ECHOES_5, user=contract.base.user)


def test_the_inventory_lists_what_was_made_with_its_owner_and_removes_it(contract):
    engine = contract.engine
    container_id = contract.create(RUNS_ON)
    spec_run = next(o for o in engine.list_managed() if o.id == container_id)
    assert spec_run.kind == "container"
    assert spec_run.labels[labels.OWNER_PID] == str(os.getpid())
    assert labels.owner_state(spec_run.labels) == "alive"
    assert spec_run.labels[labels.WORKER] == "w"
    assert engine.remove_object(spec_run) is True
    assert container_id not in {o.id for o in engine.list_managed()}
    assert engine.remove_object(spec_run) is True


def test_a_run_without_a_network_needs_no_proxy(contract):
    engine = contract.engine
    spec = contract.spec(RUNS_ON)
    since = datetime.now(UTC)
    assert engine.set_up_network(spec) is None  # nothing of the run's own to remove
    assert engine.network_decisions(spec, since) == EgressLog()
    assert engine.image_argv(spec.image, ["a", "b"])[-2:] == ["a", "b"]


def test_an_engine_names_itself(contract, pytestconfig):
    """Docker says ``docker`` (as does the fake that stands in for it), Podman ``podman``:
    a run records it as its ``engine``."""
    real = not isinstance(contract.engine, FakeEngine)
    assert contract.engine.flavour() == (pytestconfig.getoption("engine") if real else "docker")
