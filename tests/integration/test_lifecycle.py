"""The command line against a real engine: exit codes, timeouts, signals, gc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.config import load_project
from orchestrator.runtime.mount_sources import PIN_ROOT
from tests.integration.conftest import cli, containers_of

pytestmark = pytest.mark.docker


def python_worker(project, name: str, script: str, front: str = "") -> None:
    project.worker(name, f"command: {json.dumps(['python3', '-c', script])}\n{front}")


def test_exit_code_and_output_propagate(engine, project):
    python_worker(
        project,
        "w",
        "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(7)",
    )
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 7
    assert result.stdout == "to stdout\n"
    assert "to stderr" in result.stderr
    assert "w exited with code 7" in result.stderr and "container removed" in result.stderr


def test_json_result(engine, project):
    python_worker(project, "w", "print('hello')")
    result = cli("run", "w", "--project", str(project.root), "--json")
    assert result.returncode == 0
    data = result.json()
    assert {"run_id", "worker", "exit_code", "status", "duration_s", "stdout", "stderr",
            "container_removed"} <= set(data)  # fmt: skip
    assert (data["status"], data["exit_code"], data["stdout"]) == ("exited", 0, "hello\n")
    assert data["container_removed"] is True


def test_timeout_exits_124_and_leaves_nothing(engine, project, isolation):
    python_worker(project, "w", "import time; time.sleep(60)")
    started = time.monotonic()
    result = cli("run", "w", "--project", str(project.root), "--timeout", "1", "--json")
    assert result.returncode == 124
    assert time.monotonic() - started < 30
    data = result.json()
    assert (data["status"], data["container_removed"]) == ("timeout", True)
    assert not [
        o for o in engine.list_managed() if o.labels.get("io.orchestrator.run-id") == data["run_id"]
    ]


def test_command_not_found_is_127(engine, project):
    project.worker("w", 'command: ["/no/such/program"]')
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 127, result.stderr


def test_missing_image_says_how_to_build_it(engine, project):
    project.worker("w", 'image: "orchestrator/does-not-exist:1"\ncommand: ["true"]')
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 125
    # Not one of the project's own images: built with `orchestrator build` or docker's.
    assert "orchestrator build" in result.stderr
    assert "docker build -t orchestrator/does-not-exist:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_engine_is_125(project):
    project.worker("w", 'command: ["true"]')
    result = cli(
        "run", "w", "--project", str(project.root), env={"DOCKER_HOST": "unix:///nonexistent.sock"}
    )
    assert result.returncode == 125
    assert "Docker engine unreachable" in result.stderr
    assert "Traceback" not in result.stderr


def start_long_run(project, front: str = "") -> subprocess.Popen:
    script = "import time; print('started', flush=True); time.sleep(120)"
    python_worker(project, "w", script, front)
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "w", "--project", str(project.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_started(process: subprocess.Popen) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line == "started\n", process.stderr.read() if process.stderr else ""


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_the_orchestrator_removes_the_container(engine, project, signum, code):
    process = start_long_run(project)
    try:
        wait_until_started(process)
        assert len(containers_of(engine, process.pid)) == 1
        process.send_signal(signum)
        assert process.wait(timeout=30) == code
    finally:
        process.kill()
        process.communicate()
    assert containers_of(engine, process.pid) == []


@pytest.mark.serial
def test_sigkilled_orchestrator_leaves_only_what_gc_removes(engine, project):
    process = start_long_run(project, "sandbox: {}")  # with a session folder
    try:
        wait_until_started(process)
        process.kill()
        process.wait(timeout=30)
    finally:
        process.kill()
        process.communicate()
    orphans = containers_of(engine, process.pid)
    assert len(orphans) == 1  # SIGKILL gives no chance to clean up...
    session = orphans[0].labels[labels.SESSION]
    sessions = load_project(project.root).sandbox_root / "sessions"
    (sessions / "kept").mkdir()  # an empty session folder of no dead run
    assert (sessions / session).is_dir()
    result = cli("gc", "--json", "--project", str(project.root))
    assert result.returncode == 0, result.stderr
    removed = {o["name"] for o in result.json()["removed"]}
    assert orphans[0].name in removed
    assert containers_of(engine, process.pid) == []  # ...gc does
    assert result.json()["empty_sessions_removed"] == [session]  # as the run would have
    assert sorted(p.name for p in sessions.iterdir()) == ["kept"]
    if os.geteuid() == 0:  # its pinned mount sources stayed mounted until gc unmounted them
        run_id = orphans[0].labels[labels.RUN_ID]
        assert run_id in result.json()["mount_pins_removed"]
        assert f"{PIN_ROOT}/{run_id}" not in Path("/proc/self/mountinfo").read_text()
        assert not (PIN_ROOT / run_id).exists()


def test_help_does_not_import_docker_or_pydantic():
    code = (
        "import sys; from orchestrator.cli.main import cli; "
        "print(sorted(m for m in ('docker', 'pydantic', 'yaml', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_plain_run_imports_only_what_it_uses(engine, project):
    """A `network: none` run without outbox or secrets loads neither the egress proxy's
    modules, nor the staging of change sets, nor the credentials (start-up cost)."""
    project.worker("plain", 'command: ["true"]\n')
    command = ["run", "plain", "--project", str(project.root)]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator", *command],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "container removed" in done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "orchestrator.docker" in imported  # the run did reach the engine
    unused = ("orchestrator.docker.egress", "orchestrator.staging", "orchestrator.credentials")
    assert [m for m in unused if m in imported] == []


def test_python_dash_m_works():
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and "Usage: orchestrator" in out.stdout


def test_a_run_that_cannot_be_audited_never_starts(engine, project):
    from orchestrator.config import load_project

    python_worker(project, "w", "print('should not run')")
    sandbox = load_project(project.root).sandbox_root
    (sandbox / "audit.jsonl").mkdir(parents=True)  # a folder where the log should be
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 125
    assert "audit" in result.stderr.lower()
    assert "Traceback" not in result.stderr
    assert "should not run" not in result.stdout


def test_runs_are_audited_start_and_end(engine, project):
    from orchestrator.audit import AuditFilter, AuditLog
    from orchestrator.config import load_project

    python_worker(project, "w", "import sys; sys.exit(3)")
    data = cli("run", "w", "--project", str(project.root), "--json").json()
    log = AuditLog(load_project(project.root).sandbox_root / "audit.jsonl")
    entries = log.query(AuditFilter(run=data["run_id"]))
    operations = [e.operation for e in entries]
    assert operations[0] == "run.started" and operations[-1] == "run.ended"
    started, ended = entries[0], entries[-1]
    assert started.metadata["network"] == "none"
    # untrusted: gVisor by default, under the runtime that takes no network
    assert (started.metadata["isolation"], started.metadata["runtime"]) == (
        "gvisor",
        "orchestrator-runsc",
    )
    assert started.metadata["limits"]["pids"] == 256
    assert ended.metadata["exit_code"] == 3
    assert ended.metadata["container_removed"] is True
    assert log.verify().ok


#: The steps of Run.open, in order (a failure is injected after each in turn).
OPEN_STEPS = [
    "_check",
    "_new_launch",
    "_prepare_host",
    "_prepare_launch",
    "_record_start",
    "_grant_access",
    "_deliver_secrets",
    "_start_broker",
    "_hold_sources",
    "_create",
]


def _xattrs(path: Path) -> dict[str, bytes]:
    return {name: os.getxattr(path, name) for name in os.listxattr(path)}


@pytest.mark.parametrize("step", OPEN_STEPS)
def test_a_failure_after_any_open_step_leaves_nothing_behind(engine, project, monkeypatch, step):
    """What a run opens is undone when a later step fails: the failure is injected right
    after each step of ``Run.open`` (everything that step made exists then). Afterwards no
    object of the run is on the engine, its folder, secrets and pins are gone, the zone's
    access is as before, and the audit log has the run's end (its start once recorded)."""
    from orchestrator import Orchestrator
    from orchestrator.audit import AuditFilter, AuditLog
    from orchestrator.errors import OrchestratorError
    from orchestrator.runtime.run import Run

    monkeypatch.setenv("API_TOKEN", "tok-open-steps-5521")
    project.extra = "credentials:\n  api: {source: env, env: API_TOKEN}\n"
    work = project.zone("work", "rw")
    project.worker("child", 'command: ["true"]')
    project.worker(
        "w",
        'command: ["true"]\ntrust: session\nsecrets: [api]\nchildren: [child]\n'
        "network: {allow: [example.org]}\nsandbox: {zones: [{name: work, mode: rw}]}",
    )
    access_before = _xattrs(work)
    original = getattr(Run, step)

    def failing(self: Run) -> None:
        original(self)
        raise OrchestratorError(f"injected after {step}")

    monkeypatch.setattr(Run, step, failing)
    with Orchestrator(project.root, engine=engine) as orch:
        prepared = orch.prepare("w")
        with pytest.raises(OrchestratorError, match=f"injected after {step}"):
            orch.open_keep_alive(prepared)
        sandbox = orch.project.sandbox_root
    run_id = prepared.spec.run_id
    assert [o for o in engine.list_managed() if o.labels.get(labels.RUN_ID) == run_id] == []
    assert not prepared.paths.run_dir.exists()
    assert not prepared.paths.secrets_dir.exists()
    assert not (PIN_ROOT / run_id).exists()
    assert f"{PIN_ROOT}/{run_id}" not in Path("/proc/self/mountinfo").read_text()
    assert _xattrs(work) == access_before
    entries = AuditLog(sandbox / "audit.jsonl").query(AuditFilter(run=run_id))
    operations = [e.operation for e in entries]
    recorded = OPEN_STEPS.index(step) >= OPEN_STEPS.index("_record_start")
    assert operations.count("run.started") == (1 if recorded else 0), operations
    assert operations[-1] == "run.ended" and operations.count("run.ended") == 1, operations
    assert entries[-1].allowed is False
    if recorded and step != "_record_start":  # from the worker's access on, it says why
        assert f"injected after {step}" in (entries[-1].reason or ""), entries[-1]


@pytest.mark.serial
def test_the_library_gc_removes_a_sigkilled_runs_container(engine, project):
    """``Orchestrator.gc()`` is ``orchestrator gc`` for its project (the CLI calls the same
    function): the container of a SIGKILLed orchestrator, and its empty session folder."""
    from orchestrator.runner import Orchestrator

    process = start_long_run(project, "sandbox: {}")
    try:
        wait_until_started(process)
        process.kill()
        process.wait(timeout=30)
    finally:
        process.kill()
        process.communicate()
    (orphan,) = containers_of(engine, process.pid)
    with Orchestrator(project.root, engine=engine) as orch:
        done = orch.gc()
    assert done.ok
    assert containers_of(engine, process.pid) == []
    assert orphan.name in {o.name for o in done.removed}
    assert done.emptied == [orphan.labels[labels.SESSION]]
