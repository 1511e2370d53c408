"""The run lifecycle over a fake engine: the container is removed on every path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator import labels
from orchestrator.config import load_project, load_worker
from orchestrator.errors import EngineError, ImageMissing
from orchestrator.runtime import ExitState, Interrupted, ManagedObject, collect, execute, prepare


class FakeEngine:
    """An in-memory engine; each behaviour is set per test."""

    def __init__(self, *, exit_code=0, wait_result="exit", start_error=None, oom=False):
        self.exit_code = exit_code
        self.wait_result = wait_result
        self.start_error = start_error
        self.oom = oom
        self.calls: list[str] = []
        self.containers: set[str] = set()
        self.managed: list[ManagedObject] = []

    def ping(self):
        pass

    def image_exists(self, image):
        return True

    def create(self, spec):
        self.calls.append("create")
        self.containers.add("c1")
        return "c1"

    def attach(self, container_id) -> Iterator:
        self.calls.append("attach")
        return iter([("stdout", b"out\n"), ("stderr", b"err\n")])

    def start(self, container_id):
        self.calls.append("start")
        if self.start_error:
            raise EngineError(self.start_error)

    def wait(self, container_id, timeout):
        self.calls.append("wait")
        if self.wait_result == "timeout":
            return None
        if self.wait_result == "interrupt":
            raise Interrupted(15)
        if self.wait_result == "engine-error":
            raise EngineError("connection to the Docker engine lost while waiting")
        return self.exit_code

    def exit_state(self, container_id):
        return ExitState(exit_code=self.exit_code, oom_killed=self.oom)

    def kill(self, container_id):
        self.calls.append("kill")

    def remove(self, container_id):
        self.calls.append("remove")
        self.containers.discard(container_id)
        return True

    def list_managed(self):
        self.calls.append("list")
        return list(self.managed)

    def remove_object(self, obj):
        self.calls.append(f"remove-{obj.kind}-{obj.name}")
        return True


@pytest.fixture
def prepared(project):
    project.worker("w", 'command: ["true"]')
    loaded = load_project(project.root)
    return prepare(loaded, load_worker(loaded, "w"))


def test_success_streams_output_and_removes(prepared):
    engine = FakeEngine(exit_code=0)
    seen = []
    result = execute(engine, prepared, on_output=lambda s, c: seen.append((s, c)))
    assert (result.status, result.exit_code, result.container_removed) == ("exited", 0, True)
    assert result.stdout == "out\n" and result.stderr == "err\n"
    assert seen == [("stdout", b"out\n"), ("stderr", b"err\n")]
    assert engine.containers == set()
    assert engine.calls.index("attach") < engine.calls.index("start")


def test_worker_failure_keeps_its_exit_code_and_is_not_retried(prepared):
    engine = FakeEngine(exit_code=3)
    result = execute(engine, prepared)
    assert (result.status, result.exit_code) == ("exited", 3)
    assert engine.calls.count("create") == 1 and engine.calls.count("start") == 1
    assert engine.containers == set()


def test_timeout_kills_then_removes(prepared):
    engine = FakeEngine(wait_result="timeout")
    result = execute(engine, prepared)
    assert (result.status, result.exit_code) == ("timeout", 124)
    assert engine.calls.index("kill") < engine.calls.index("remove")
    assert engine.containers == set()


def test_oom_is_137(prepared):
    result = execute(FakeEngine(exit_code=137, oom=True), prepared)
    assert (result.status, result.exit_code) == ("oom", 137)


@pytest.mark.parametrize(
    ("message", "code"),
    [("exec: \"nope\": executable file not found in $PATH", 127),
     ("exec /x: permission denied", 126)],
)  # fmt: skip
def test_command_that_cannot_start_follows_docker_codes(prepared, message, code):
    engine = FakeEngine(start_error=message)
    result = execute(engine, prepared)
    assert (result.status, result.exit_code) == ("error", code)
    assert engine.containers == set()


def test_other_start_failure_raises_after_removing(prepared):
    engine = FakeEngine(start_error="Docker refused starting the container: boom")
    with pytest.raises(EngineError, match="boom"):
        execute(engine, prepared)
    assert engine.containers == set()


@pytest.mark.parametrize("how", ["interrupt", "engine-error"])
def test_interrupt_or_engine_error_mid_run_still_removes(prepared, how):
    engine = FakeEngine(wait_result=how)
    with pytest.raises((Interrupted, EngineError)):
        execute(engine, prepared)
    assert engine.calls[-1] == "remove"
    assert engine.containers == set()


def test_missing_image_creates_nothing(prepared):
    class NoImage(FakeEngine):
        def create(self, spec):
            raise ImageMissing(spec.image)

    engine = NoImage()
    with pytest.raises(ImageMissing, match="orchestrator images build"):
        execute(engine, prepared)
    assert "remove" not in engine.calls


def test_gc_removes_only_objects_of_dead_owners():
    me = labels.current_owner()
    alive = ManagedObject("container", "a", "alive", me.labels())
    dead_labels = {**me.labels(), labels.OWNER_PID: "999999999"}
    reused_pid = {**me.labels(), labels.OWNER_START: "1"}
    foreign = {**me.labels(), labels.OWNER_NS: "pid:[1]", labels.OWNER_PID: "999999999"}
    engine = FakeEngine()
    engine.managed = [
        ManagedObject("network", "n", "net", dead_labels),
        ManagedObject("container", "d", "dead", dead_labels),
        ManagedObject("container", "r", "reused", reused_pid),
        ManagedObject("container", "f", "foreign", foreign),
        alive,
    ]
    report = collect(engine)
    assert [o.name for o in report.removed] == ["dead", "reused", "net"]  # containers first
    assert {o.name for o in report.kept} == {"alive", "foreign"}
    assert [o.name for o in collect(engine, everything=True).removed] == [
        "dead", "reused", "foreign", "net"
    ]  # fmt: skip
