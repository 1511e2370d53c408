"""Integration fixtures: a real engine, the worker image, and a final leak check.

On a laptop without Docker these tests skip; under CI (CI=true) an unreachable engine is a
failure, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from orchestrator import labels
from orchestrator.config import load_project, load_worker
from orchestrator.errors import OrchestratorError
from orchestrator.runtime import RunResult, execute, prepare

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def engine():
    from orchestrator.docker import DockerEngine
    from orchestrator.docker.images import WORKER_IMAGE, build_all

    try:
        eng = DockerEngine()
        eng.ping()
    except OrchestratorError as exc:
        if IN_CI:
            pytest.fail(f"CI=true and the Docker engine is unreachable: {exc}")
        pytest.skip(f"no Docker engine: {exc}")
    if not eng.image_exists(WORKER_IMAGE):
        build_all(eng)
    yield eng
    # The suite's last word: nothing labelled by this run of the tests is left.
    # Shared egress proxies and networks outlive runs by design (gc removes them when
    # idle); the egress tests remove their own. Everything else must be gone.
    owned = [o for o in eng.list_managed() if o.labels.get(labels.SHARED) != "true"]
    leftovers = [o for o in owned if labels.owner_state(o.labels) != "alive"]
    leftovers += [o for o in owned if o.labels.get(labels.OWNER_PID) == str(os.getpid())]
    for obj in leftovers:
        eng.remove_object(obj)
    assert not leftovers, f"tests left labelled objects behind: {leftovers}"


@pytest.fixture
def run_worker(engine, project):
    """Write a worker whose command is a Python script, run it, return the result."""

    def run(script: str, front: str = "", name: str = "w", **kwargs) -> RunResult:
        command = json.dumps(["python3", "-c", textwrap.dedent(script)])
        project.worker(name, f"command: {command}\n{textwrap.dedent(front).strip()}")
        loaded = load_project(project.root)
        return execute(engine, prepare(loaded, load_worker(loaded, name), **kwargs))

    return run


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
    """Run the real command line in a subprocess."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def containers_of(engine, pid: int) -> list:
    return [
        o
        for o in engine.list_managed()
        if o.kind == "container" and o.labels.get(labels.OWNER_PID) == str(pid)
    ]
