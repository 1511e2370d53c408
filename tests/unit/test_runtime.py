"""The run lifecycle over a fake engine: the container is removed on every path."""

from __future__ import annotations

import inspect
import logging

import pytest
from mypy import api as mypy_api

from orchestrator import labels
from orchestrator.audit import AuditFilter
from orchestrator.config import load_project, load_worker
from orchestrator.errors import EngineError, ImageMissing, StartFailure
from orchestrator.prepare import prepare
from orchestrator.runtime import Interrupted, ManagedObject, collect, execute, open_audit
from orchestrator.runtime import removal as run_module
from orchestrator.runtime.container import ContainerBackend
from orchestrator.runtime.engine import EgressDecision, Engine, ExecHandle
from tests.unit import fake_engine
from tests.unit.fake_engine import FakeEngine, FakeExec


def run_audited(engine, prepared, **kwargs):
    """execute() with the project's own audit log, and no outbox reader."""
    return execute(
        ContainerBackend(engine),
        prepared,
        audit=open_audit(prepared.project),
        staging=None,
        **kwargs,
    )


@pytest.fixture
def prepared(project):
    project.worker("w", 'command: ["true"]')
    loaded = load_project(project.root)
    return prepare(loaded, load_worker(loaded, "w"))


def test_success_streams_output_and_removes(prepared):
    engine = FakeEngine(exit_code=0)
    seen = []
    result = run_audited(engine, prepared, on_output=lambda s, c: seen.append((s, c)))
    assert (result.status, result.exit_code, result.container_removed) == ("exited", 0, True)
    assert result.stdout == "out\n" and result.stderr == "err\n"
    assert seen == [("stdout", b"out\n"), ("stderr", b"err\n")]
    assert engine.containers == set()
    assert engine.calls.index("attach") < engine.calls.index("start")


def test_worker_failure_keeps_its_exit_code_and_is_not_retried(prepared):
    engine = FakeEngine(exit_code=3)
    result = run_audited(engine, prepared)
    assert (result.status, result.exit_code) == ("exited", 3)
    assert engine.calls.count("create") == 1 and engine.calls.count("start") == 1
    assert engine.containers == set()


def test_timeout_kills_then_removes(prepared):
    engine = FakeEngine(wait_result="timeout")
    result = run_audited(engine, prepared)
    assert (result.status, result.exit_code) == ("timeout", 124)
    assert engine.calls.index("kill") < engine.calls.index("remove")
    assert engine.containers == set()


def test_oom_is_137(prepared):
    result = run_audited(FakeEngine(exit_code=137, oom=True), prepared)
    assert (result.status, result.exit_code) == ("oom", 137)


@pytest.mark.parametrize("code", [126, 127])
def test_a_command_that_cannot_start_is_the_worker_s_failure_with_its_code(prepared, code):
    engine = FakeEngine(start_error=StartFailure("the command cannot run", code=code))
    result = run_audited(engine, prepared)
    assert (result.status, result.exit_code) == ("error", code)
    assert result.error == "the command cannot run"
    assert engine.containers == set()


@pytest.mark.parametrize("code", [126, 127])
def test_a_worker_by_exec_that_cannot_start_is_its_failure_with_its_code(project, code):
    project.worker("w", 'command: ["nope"]\nsandbox: {}')  # an outbox: the worker runs by exec
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    assert prepared.spec.supervisor_user is not None
    failure = StartFailure('exec: "nope": executable file not found in $PATH', code=code)
    engine = FakeEngine(exit_code=code, exec_failure=failure)
    result = run_audited(engine, prepared)
    assert (result.status, result.exit_code, result.error) == ("error", code, str(failure))
    assert engine.containers == set()


def test_the_network_the_engine_made_for_the_run_is_removed_after_its_container(project):
    project.worker("w", 'command: ["true"]\nnetwork: {allow: [example.org]}')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    engine = FakeEngine()
    run_audited(engine, prepared)
    removed = f"remove-network-net-{prepared.spec.run_id}"
    assert engine.calls.index("network") < engine.calls.index("create")
    assert engine.calls.index("remove") < engine.calls.index(removed)


def test_a_flood_of_egress_decisions_is_one_audit_entry_with_its_counts(project):
    """Past what a run keeps one by one, decisions are counted into one egress.flood
    entry (with what the proxy counted itself); the allowed decision stays listed, and
    what the CLI says of them is a few lines."""
    from orchestrator.cli.main import EGRESS_LINES, egress_summary
    from orchestrator.egress import RUN_DENIED

    project.worker("w", 'command: ["true"]\nnetwork: {allow: [example.org]}')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    allowed = EgressDecision("example.org", 443, True, "CONNECT")
    denied = [EgressDecision(f"d{n}.evil.test", 80, False, "GET") for n in range(RUN_DENIED + 30)]
    engine = FakeEngine(decisions=[allowed, *denied], unlisted_denied=99_000)
    result = run_audited(engine, prepared)
    audit = open_audit(loaded)
    run = prepared.spec.run_id
    logged = audit.query(AuditFilter(operation="egress.decision", run=run))
    assert len(logged) == RUN_DENIED + 1
    assert [e.metadata["host"] for e in logged if e.allowed] == ["example.org"]
    [flood] = audit.query(AuditFilter(operation="egress.flood", run=run))
    assert flood.allowed is False
    assert flood.metadata["denied"] == 99_030 and flood.metadata["allowed"] == 0
    assert flood.metadata["logged_denied"] == RUN_DENIED
    assert result.egress_flood == {"denied": 99_030, "allowed": 0, "bytes": 0}
    assert len(result.egress) == RUN_DENIED + 1
    lines = egress_summary(result)
    assert len(lines) == EGRESS_LINES + 1
    assert lines[0] == "egress allowed: example.org:443"
    assert "more destinations" in lines[-2] and "99030 denied" in lines[-1]


def test_no_network_is_made_or_removed_for_a_run_without_one(prepared):
    engine = FakeEngine()
    run_audited(engine, prepared)
    assert not [call for call in engine.calls if "network" in call]


def test_other_start_failure_raises_after_removing(prepared):
    engine = FakeEngine(start_error=EngineError("Docker refused starting the container: boom"))
    with pytest.raises(EngineError, match="boom"):
        run_audited(engine, prepared)
    assert engine.containers == set()


@pytest.mark.parametrize("how", ["interrupt", "engine-error"])
def test_interrupt_or_engine_error_mid_run_still_removes(prepared, how):
    engine = FakeEngine(wait_result=how)
    with pytest.raises((Interrupted, EngineError)):
        run_audited(engine, prepared)
    assert engine.calls[-1] == "remove"
    assert engine.containers == set()


def test_missing_image_creates_nothing(prepared):
    class NoImage(FakeEngine):
        def create(self, spec):
            raise ImageMissing(spec.image)

    engine = NoImage()
    with pytest.raises(ImageMissing, match="orchestrator images build"):
        run_audited(engine, prepared)
    assert "remove" not in engine.calls


@pytest.mark.parametrize("flavour", ["docker", "podman"])
def test_a_run_records_the_engine_that_ran_it(prepared, flavour):
    """``run.started`` says ``engine: podman`` on Podman (the container backend is named
    after the engine that answers), ``engine: docker`` on Docker."""
    from orchestrator.runtime.container import ContainerBackend

    class Answering(FakeEngine):
        def flavour(self) -> str:
            return flavour

    engine = Answering()
    assert ContainerBackend(engine).name == flavour
    run_audited(engine, prepared)
    run = prepared.spec.run_id
    [started] = open_audit(prepared.project).query(AuditFilter(operation="run.started", run=run))
    assert started.metadata["engine"] == flavour


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


# -- the fake itself ---------------------------------------------------------------------


def _members(protocol: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(value)
        for name, value in vars(protocol).items()
        if callable(value) and not name.startswith("_")
    }


@pytest.mark.parametrize(("protocol", "fake"), [(Engine, FakeEngine), (ExecHandle, FakeExec)])
def test_fake_engine_satisfies_the_protocol(protocol, fake):
    wanted = _members(protocol)
    assert len(wanted) >= 1
    for name, signature in wanted.items():
        assert hasattr(fake, name), f"{fake.__name__} lacks {name}"
        mine = inspect.signature(getattr(fake, name))
        assert list(mine.parameters) == list(signature.parameters), name
        assert str(mine) == str(signature), name


def test_fake_engine_type_checks_against_the_protocol(tmp_path):
    out, err, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path), "--follow-imports=silent",
         "-m", fake_engine.__name__]
    )  # fmt: skip
    assert status == 0, out + err


# -- an engine that restarts while the run ends ------------------------------------------


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(run_module, "ENGINE_POLL_S", 0.01)
    monkeypatch.setattr(run_module, "ENGINE_RETURN_S", 2.0)


def test_removal_waits_for_a_restarting_engine(prepared, quick):
    engine = FakeEngine(down_for=20)  # the removal and 19 pings go unanswered
    result = run_audited(engine, prepared)
    assert result.container_removed is True
    assert engine.containers == set()
    assert engine.calls.count("remove") == 2
    assert engine.calls.count("ping") == 20  # 19 unanswered, then the engine is back


def test_removal_waits_after_an_engine_error_mid_run(prepared, quick):
    engine = FakeEngine(wait_result="engine-error", down_for=5)
    with pytest.raises(EngineError):
        run_audited(engine, prepared)
    assert engine.containers == set()


def test_removal_gives_up_in_one_line_when_the_engine_stays_away(prepared, quick, caplog):
    engine = FakeEngine(down_for=10**9)
    with caplog.at_level(logging.ERROR, logger=run_module.__name__):
        result = run_audited(engine, prepared)
    assert result.container_removed is False
    assert engine.containers == {"c1"}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "did not answer for 2 s" in errors[0] and "orchestrator gc" in errors[0]


def test_removal_refused_by_an_answering_engine_is_tried_three_times(prepared, quick):
    class Refusing(FakeEngine):
        def remove(self, container_id: str) -> bool:
            self.calls.append("remove")
            raise EngineError("Docker refused removing the container: busy")

    engine = Refusing()
    result = run_audited(engine, prepared)
    assert result.container_removed is False
    assert engine.calls.count("remove") == 3


@pytest.mark.parametrize("timeout", [0, -1, 1e308, float("nan"), float("inf"), 604801])
def test_an_out_of_range_timeout_is_a_config_error_before_anything(project, timeout):
    from orchestrator.errors import ConfigError

    project.worker("w", 'command: ["true"]')
    loaded = load_project(project.root)
    with pytest.raises(ConfigError, match=r"timeout: .* is not in the range 0<x<=604800"):
        prepare(loaded, load_worker(loaded, "w"), timeout=timeout)
    assert prepare(loaded, load_worker(loaded, "w"), timeout=604800).spec.limits.timeout_s == 604800


def test_a_run_with_secrets_holds_its_secrets_folder_once_it_exists(project, monkeypatch):
    """The secrets folder is made just before the container: holding the mount sources
    comes after it, so a run with secrets is never taken for a planted link."""
    monkeypatch.setenv("API_TOKEN", "tok-unit-secret-value-1234")
    project.extra = "credentials:\n  api: {source: env, env: API_TOKEN}\n"
    project.write_project()
    project.worker("w", 'command: ["true"]\ntrust: session\nsecrets: [api]')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    result = execute(
        ContainerBackend(FakeEngine(exit_code=0)), prepared, audit=open_audit(loaded), staging=None,
        secrets={"api": "tok-unit-secret-value-1234"},
    )  # fmt: skip
    assert (result.status, result.error, result.violations) == ("exited", None, [])
    assert not open_audit(loaded).query(AuditFilter(operation="zone.violation"))
