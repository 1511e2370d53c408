"""The backend contract: one run lifecycle, the same on every backend.

A run's host side (folders, access, set-id sweep, staging, the audit log's start and end)
is :class:`orchestrator.runtime.run.Run`, once; a backend only launches, waits, reads and
removes (:mod:`orchestrator.runtime.backend`). These cases run the same workers through an
:class:`~orchestrator.Orchestrator` on each backend and assert the same outcome, result and
audit operations, each with the same metadata keys: on the tests' fake engine and the
real one (Docker, or Podman with ``--engine=podman``), and on Docker against a swarm.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from orchestrator.runner import Orchestrator
from orchestrator.runtime.container import ContainerBackend
from tests.integration.conftest import script_worker
from tests.unit.fake_engine import FakeEngine, Program
from tests.unit.seam_only import SeamOnly

pytestmark = pytest.mark.docker

#: A worker with an outbox: output on both streams, one result file, exit 3.
REPORTS = """
import sys
print("to stdout")
print("to stderr", file=sys.stderr)
open("/staged/report.md", "w").write("findings\\n")
sys.exit(3)
"""


#: What a swarm run records beyond a Docker run's keys: what the service does not enforce
#: (start), the backend and the node the task ran on (end). Nothing a Docker run records
#: may be missing.
SWARM_ONLY = {"run.started": {"not_enforced"}, "run.ended": {"engine", "node"}}


def entries(project, run_id: str) -> list[dict]:
    """The audit log's entries about one run, in order."""
    lines = (project.root / ".sandbox" / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("run_id") == run_id]


def keys(project, run_id: str) -> list[tuple[str, set[str]]]:
    """Each of those entries' operation and the keys of its metadata."""
    return [(e["operation"], set(e.get("metadata") or {})) for e in entries(project, run_id)]


def assert_same_keys(docker, swarm) -> None:
    """The swarm run's entries have the Docker run's metadata keys, plus :data:`SWARM_ONLY`."""
    assert [op for op, _ in docker] == [op for op, _ in swarm]
    for (op, ours), (_, theirs) in zip(docker, swarm, strict=True):
        assert ours - theirs == set(), (op, "missing on the swarm", ours - theirs)
        assert theirs - ours == SWARM_ONLY.get(op, set()), (op, "only on the swarm", theirs - ours)


@pytest.fixture
def runc_project(project):
    project.extra = "isolation: {untrusted: runc, session: runc}\n"
    project.write_project()
    return project


def test_docker_and_swarm_run_the_same_lifecycle(engine, swarm, runc_project):
    from orchestrator.docker.swarm import SwarmBackend

    script_worker(runc_project, REPORTS)
    seen = {}
    for kind, backend in (("docker", ContainerBackend(engine)), ("swarm", SwarmBackend(swarm))):
        with Orchestrator(runc_project.root, backend=backend) as orch:
            result = orch.run("w")
        assert result.exit_code == 3 and result.status == "exited", (kind, result)
        assert result.container_removed
        assert "to stdout" in result.stdout and "to stderr" in result.stderr
        assert result.outbox.files == 1, (kind, result.outbox)
        seen[kind] = keys(runc_project, result.run_id)
    assert_same_keys(seen["docker"], seen["swarm"])
    ops = [op for op, _ in seen["docker"]]
    assert ops[0] == "run.started" and ops[-1] == "run.ended", ops
    assert "outbox.staged" in ops or any(op.startswith("change") for op in ops), ops


def test_a_timeout_ends_the_same_on_docker_and_swarm(engine, swarm, runc_project):
    from orchestrator.docker.swarm import SwarmBackend

    script_worker(runc_project, "import time; time.sleep(60)", "sandbox: {}\nresources: {}")
    seen = {}
    for kind, backend in (("docker", ContainerBackend(engine)), ("swarm", SwarmBackend(swarm))):
        with Orchestrator(runc_project.root, backend=backend) as orch:
            result = orch.run("w", timeout=3)
        assert result.exit_code == 124 and result.status == "timeout", (kind, result)
        assert result.container_removed and "3" in (result.error or "")
        seen[kind] = keys(runc_project, result.run_id)
    assert_same_keys(seen["docker"], seen["swarm"])
    assert seen["docker"][-1][0] == "run.ended"


def test_a_swarm_run_records_the_engine_and_its_default_runtime(engine, swarm, runc_project):
    """``run.started`` names the backend and the runtime the task got: a service cannot
    name one, so it is the engine's default (a Docker run records the one it asked for)."""
    from orchestrator.docker.swarm import SwarmBackend

    runc_project.worker("w", 'command: ["true"]')
    started = {}
    for kind, backend in (("docker", ContainerBackend(engine)), ("swarm", SwarmBackend(swarm))):
        with Orchestrator(runc_project.root, backend=backend) as orch:
            result = orch.run("w")
        assert result.exit_code == 0, (kind, result)
        [started[kind]] = [
            e["metadata"]
            for e in entries(runc_project, result.run_id)
            if e["operation"] == "run.started"
        ]
    default = str(swarm.api.info().get("DefaultRuntime") or "runc")
    assert started["swarm"]["engine"] == "swarm"
    assert started["swarm"]["runtime"] == default
    assert started["docker"]["engine"] == engine.flavour()
    assert started["docker"]["runtime"] == "runc"  # what isolation: runc asks for


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
        seen[name] = keys(runc_project, result.run_id)
    assert seen["fake"] == seen["real"]  # the same operations, each with the same keys
    assert seen["real"][0][0] == "run.started" and seen["real"][-1][0] == "run.ended"


#: How a runc run's outbox (``/staged``) is read (:func:`~orchestrator.runtime.supervised.read_outbox`).
READ_OUTBOX = ("/bin/sh", "-c", 'exec tar --sparse -C "$0" -cf - .', "/staged")


def empty_folder_tar() -> bytes:
    """What ``tar -C folder -cf - .`` writes for an empty folder: its ``./`` entry."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        entry = tarfile.TarInfo("./")
        entry.type, entry.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(entry)
    return out.getvalue()


def test_a_backend_of_only_backend_and_launch_holds_a_session_as_the_real_one_does(
    engine, runc_project
):
    """A new backend needs only ``Backend`` and ``Launch``: the fake engine's backend,
    seen through those alone (:class:`~tests.unit.seam_only.SeamOnly`), holds a session
    (execs, host-side files, close) with the real engine's results and audit operations."""
    runc_project.zone("data", "rw")
    runc_project.worker(
        "w", 'command: ["true"]\ntrust: workspace\nsandbox: {zones: [{name: data, mode: rw}]}'
    )
    # The outbox is read as the real engine's tar reads an empty folder.
    fake = FakeEngine(programs={READ_OUTBOX: Program((("stdout", empty_folder_tar()),))})
    seen = {}
    for name, on in (("fake", fake), ("real", engine)):
        backend = SeamOnly(ContainerBackend(on))
        with Orchestrator(runc_project.root, backend=backend) as orch:
            with orch.open_session("w") as session:
                done = session.exec("echo out")
                assert (done.exit_code, done.stdout, done.timed_out) == (0, "out\n", False), name
                session.write("/data/note.txt", name)
                assert session.read("/data/note.txt").text == name
            result = session.close()
        assert result.status == "closed" and result.container_removed, (name, result)
        assert len(backend.launches) == 1
        seen[name] = keys(runc_project, result.run_id)
    assert seen["fake"] == seen["real"], seen  # the same operations, each with the same keys
    ops = [operation for operation, _ in seen["real"]]
    assert ops[0] == "run.started" and "session.exec" in ops and "run.ended" in ops, ops
