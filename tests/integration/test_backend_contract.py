"""The backend contract: one run lifecycle, the same on every backend.

A run's host side (folders, access, set-id sweep, staging, the audit log's start and end)
is :class:`orchestrator.runtime.run.Run`, once; a backend only launches, waits, reads and
removes (:mod:`orchestrator.runtime.backend`). These cases run the same workers through an
:class:`~orchestrator.Orchestrator` on each backend and assert the same outcome, result and
audit operations: on the tests' fake engine and the real one (Docker, or Podman with
``--engine=podman``), and on Docker against a swarm.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.runner import Orchestrator
from orchestrator.runtime.container import ContainerBackend
from tests.integration.conftest import script_worker
from tests.unit.fake_engine import FakeEngine, Program

pytestmark = pytest.mark.docker

#: A worker with an outbox: output on both streams, one result file, exit 3.
REPORTS = """
import sys
print("to stdout")
print("to stderr", file=sys.stderr)
open("/staged/report.md", "w").write("findings\\n")
sys.exit(3)
"""


def operations(project, run_id: str) -> list[str]:
    """The audit log's operations about one run, in order."""
    lines = (project.root / ".sandbox" / "audit.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    return [e["operation"] for e in entries if e.get("run_id") == run_id]


@pytest.fixture
def runc_project(project):
    project.extra = "isolation: {untrusted: runc, session: runc}\n"
    project.write_project()
    return project


def test_docker_and_swarm_run_the_same_lifecycle(engine, swarm, runc_project):
    from orchestrator.docker.swarm import SwarmBackend

    script_worker(runc_project, REPORTS)
    seen = {}
    for backend in (ContainerBackend(engine), SwarmBackend(swarm)):
        with Orchestrator(runc_project.root, backend=backend) as orch:
            result = orch.run("w")
        assert result.exit_code == 3 and result.status == "exited", (backend.name, result)
        assert result.container_removed
        assert "to stdout" in result.stdout and "to stderr" in result.stderr
        assert result.outbox.files == 1, (backend.name, result.outbox)
        seen[backend.name] = operations(runc_project, result.run_id)
    assert seen["docker"] == seen["swarm"]
    ops = seen["docker"]
    assert ops[0] == "run.started" and ops[-1] == "run.ended", ops
    assert "outbox.staged" in ops or any(op.startswith("change") for op in ops), ops


def test_a_timeout_ends_the_same_on_docker_and_swarm(engine, swarm, runc_project):
    from orchestrator.docker.swarm import SwarmBackend

    script_worker(runc_project, "import time; time.sleep(60)", "sandbox: {}\nresources: {}")
    seen = {}
    for backend in (ContainerBackend(engine), SwarmBackend(swarm)):
        with Orchestrator(runc_project.root, backend=backend) as orch:
            result = orch.run("w", timeout=3)
        assert result.exit_code == 124 and result.status == "timeout", (backend.name, result)
        assert result.container_removed and "3" in (result.error or "")
        seen[backend.name] = operations(runc_project, result.run_id)
    assert seen["docker"] == seen["swarm"]
    assert seen["docker"][-1] == "run.ended"


PRINTS = ["sh", "-c", "printf out; exit 4"]


def test_the_fake_engine_runs_the_lifecycle_as_the_real_one_does(engine, runc_project):
    """The container backend over the tests' fake engine is what the unit tests trust:
    held to the real engine's (Docker's or Podman's) result and audit operations."""
    runc_project.worker("w", f"command: {json.dumps(PRINTS)}")  # no outbox: its own process
    fake = FakeEngine(programs={tuple(PRINTS): Program((("stdout", b"out"),), code=4)})
    seen = {}
    for name, on in (("fake", fake), ("real", engine)):
        with Orchestrator(runc_project.root, engine=on) as orch:
            result = orch.run("w")
        assert (result.exit_code, result.status, result.stdout) == (4, "exited", "out"), name
        assert result.container_removed, name
        seen[name] = operations(runc_project, result.run_id)
    assert seen["fake"] == seen["real"]
    assert seen["real"][0] == "run.started" and seen["real"][-1] == "run.ended"
