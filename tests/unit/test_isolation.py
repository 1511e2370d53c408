"""The isolation runtime in the pure core: the project file's levels, a worker's request, a
child's floor, the plan's field, and a run refused before anything exists when the engine
lacks the runtime (over the fake engine)."""

from __future__ import annotations

import pytest

from orchestrator.audit import AuditFilter
from orchestrator.config import load_project, load_worker
from orchestrator.errors import ConfigError, EngineError, PolicyError
from orchestrator.policy import RunPaths, grant_for, restrict
from orchestrator.prepare import prepare
from orchestrator.runtime import execute, open_audit
from orchestrator.runtime.container import ContainerBackend
from tests.unit.fake_engine import FakeEngine


def grant(project, name, **kwargs):
    loaded = load_project(project.root)
    paths = RunPaths.of(loaded, session_id="s1", workspace="default", run_id="r1")
    return grant_for(loaded, load_worker(loaded, name), paths, **kwargs)


@pytest.mark.parametrize(
    ("trust", "expected"),
    [("untrusted", "gvisor"), ("session", "runc"), ("workspace", "runc"), ("full", "runc")],
)
def test_untrusted_defaults_to_gvisor_the_other_levels_to_runc(project, trust, expected):
    (project.root / ".git").mkdir()
    project.worker("w", f"trust: {trust}")
    assert grant(project, "w").isolation == expected


def test_the_project_file_sets_each_level(project):
    project.extra = "isolation: {untrusted: runc, session: gvisor}\n"
    project.write_project()
    for trust, expected in (("untrusted", "runc"), ("session", "gvisor"), ("full", "runc")):
        project.worker("w", f"trust: {trust}")
        (project.root / ".git").mkdir(exist_ok=True)
        assert grant(project, "w").isolation == expected, trust


def test_a_worker_may_ask_for_gvisor_but_not_for_less_than_its_level(project):
    project.worker("strong", "trust: session\nisolation: gvisor")
    assert grant(project, "strong").isolation == "gvisor"
    project.worker("weak", "isolation: runc")
    with pytest.raises(PolicyError) as refused:
        grant(project, "weak")
    [problem] = refused.value.problems
    assert "weak.worker:2: isolation: 'runc' is weaker than" in problem  # file, line, field
    assert "(isolation.untrusted: gvisor); remove it, or set isolation.untrusted: runc" in problem
    # ... which the project file may allow.
    project.extra = "isolation: {untrusted: runc}\n"
    project.write_project()
    assert grant(project, "weak").isolation == "runc"


def test_lowering_the_trust_level_raises_the_isolation(project):
    project.worker("w", "trust: session")
    assert grant(project, "w").isolation == "runc"
    assert grant(project, "w", trust="untrusted").isolation == "gvisor"


def test_unknown_values_and_keys_are_refused(project):
    project.extra = "isolation: {untrusted: kata}\n"
    project.write_project()
    with pytest.raises(ConfigError, match=r"isolation\.untrusted"):
        load_project(project.root)
    project.extra = "isolation: {trusted: runc}\n"
    project.write_project()
    with pytest.raises(ConfigError, match=r"isolation\.trusted"):
        load_project(project.root)
    project.extra = ""
    project.write_project()
    project.worker("w", "isolation: vm")
    with pytest.raises(ConfigError, match="isolation"):
        load_worker(load_project(project.root), "w")


def child_grant(project):
    loaded = load_project(project.root)
    paths = RunPaths.of(loaded, session_id="s1", workspace="default", run_id="r1")
    parent = grant_for(loaded, load_worker(loaded, "parent"), paths)
    return restrict(parent, "parent", loaded, load_worker(loaded, "child"), paths)


def test_a_child_never_runs_under_less_than_its_parent(project):
    project.worker("parent", "trust: session\nisolation: gvisor\nchildren: [child]")
    project.worker("child", "trust: session")
    assert child_grant(project).isolation == "gvisor"  # its level's runc, raised silently
    project.worker("child", "trust: session\nisolation: runc")
    with pytest.raises(PolicyError, match="child 'child' asks isolation 'runc' but parent"):
        child_grant(project)
    project.worker("parent", "trust: session\nchildren: [child]")
    project.worker("child", "trust: untrusted")
    assert child_grant(project).isolation == "gvisor"  # its own level's, stronger


def test_the_plan_carries_it(project):
    project.worker("w", 'command: ["true"]')
    loaded = load_project(project.root)
    spec = prepare(loaded, load_worker(loaded, "w")).spec
    assert spec.isolation == "gvisor"
    assert spec.to_dict()["isolation"] == "gvisor"


def test_an_engine_without_the_runtime_runs_nothing_and_the_refusal_is_audited(project):
    project.worker("w", 'command: ["true"]\nsandbox: {}')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    engine = FakeEngine(runtimes={"runc"})
    audit = open_audit(loaded)
    with pytest.raises(EngineError, match="engine setup --gvisor"):
        execute(ContainerBackend(engine), prepared, audit=audit, staging=None)
    assert engine.calls == []  # not even gc's listing
    assert not prepared.paths.session.exists()
    [ended] = audit.query(AuditFilter(run=prepared.spec.run_id))
    assert (ended.operation, ended.allowed) == ("run.ended", False)
    assert "engine setup --gvisor" in (ended.reason or "")


def test_the_start_entry_records_isolation_and_runtime(project):
    project.worker("w", 'command: ["true"]')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    audit = open_audit(loaded)
    execute(ContainerBackend(FakeEngine()), prepared, audit=audit, staging=None)
    [entry] = audit.query(AuditFilter(operation="run.started"))
    assert (entry.metadata["isolation"], entry.metadata["runtime"]) == ("gvisor", "fake-runsc")
