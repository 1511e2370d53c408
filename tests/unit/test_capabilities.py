"""What a backend supports is one value (``Backend.capabilities``), checked once where a
session, a warm pool or a child worker is asked for: refused in one line naming the backend
and what it lacks, before anything is made. And the runtime above the seam needs nothing
of a backend but ``Backend`` and ``Launch``: a run and a session through a backend seen
through the seam alone (:class:`tests.unit.seam_only.SeamOnly`) over the fake engine."""

from __future__ import annotations

import json

import pytest

from orchestrator import Orchestrator
from orchestrator.errors import OrchestratorError
from orchestrator.runtime.container import ContainerBackend
from tests.unit.fake_engine import FakeEngine
from tests.unit.seam_only import SeamOnly

NO_EXEC = {"exec": False}


def operations(project) -> list[str]:
    log = project.root / ".sandbox" / "audit.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line)["operation"] for line in lines]


def take_one(orch):
    with orch.pool("w", size=1) as pool:  # refused here, before any run is prepared
        return pool.take(timeout=10)


def test_a_run_and_a_session_need_only_backend_and_launch(project):
    project.zone("data", "rw")
    project.worker(
        "w", 'command: ["true"]\ntrust: workspace\nsandbox: {zones: [{name: data, mode: rw}]}'
    )
    engine = FakeEngine()
    backend = SeamOnly(ContainerBackend(engine))
    orch = Orchestrator(project.root, backend=backend)
    assert orch.run("w").status == "exited"
    with orch.open_session("w") as session:
        done = session.exec("echo out")
        assert (done.exit_code, done.stdout) == (0, "out\n")
        session.write("/data/note.txt", "kept")
        assert session.read("/data/note.txt").text == "kept"
        assert session.spec.run_id == session.run_id
    assert session.close().container_removed
    assert engine.containers == set()
    assert len(backend.launches) == 2


@pytest.mark.parametrize(
    ("asked", "needs"),
    [
        (lambda orch: orch.open_session("w"), "a session or a warm pool"),
        (take_one, "a session or a warm pool"),
    ],
    ids=["session", "pool"],
)
def test_a_backend_without_exec_refuses_sessions_and_pools_before_making_anything(
    project, asked, needs
):
    project.worker("w", 'command: ["true"]')
    engine = FakeEngine()
    orch = Orchestrator(
        project.root, backend=SeamOnly(ContainerBackend(engine), name="vm", capabilities=NO_EXEC)
    )
    with pytest.raises(OrchestratorError) as refused:
        asked(orch)
    assert str(refused.value) == (
        f"the vm backend cannot exec into a run, which {needs} needs: use the docker backend "
        "(--engine docker)"
    )
    assert "create" not in engine.calls and "run.started" not in operations(project)


def test_a_backend_without_exec_refuses_a_child_worker_and_removes_what_it_made(project):
    project.zone("data", "ro", files={"in.txt": "x"})
    project.worker("main", 'command: ["true"]\ntrust: session\nchildren: [kid]')
    project.worker("kid", 'command: ["true"]')
    engine = FakeEngine()
    orch = Orchestrator(
        project.root, backend=SeamOnly(ContainerBackend(engine), name="vm", capabilities=NO_EXEC)
    )
    result = None
    with pytest.raises(
        OrchestratorError, match="the vm backend cannot exec into a run, which a child worker needs"
    ):
        result = orch.run("main")
    assert result is None and "create" not in engine.calls
    ops = operations(project)
    assert ops[-1] == "run.ended" and "run.started" in ops  # the start has its end


def test_the_docker_backend_states_its_capabilities():
    capabilities = ContainerBackend(FakeEngine()).capabilities
    assert capabilities.exec and capabilities.secret_files and capabilities.credential_proxies
    assert not capabilities.pinned_mounts  # the fake's engine does not see this process's
    assert capabilities.setid_refusal is None  # its plan's no-new-privileges hold


def test_the_swarm_states_what_it_lacks():
    from orchestrator.docker.swarm import SwarmBackend
    from orchestrator.docker.swarm.backend import SETID_REASON

    capabilities = SwarmBackend().capabilities  # no engine is asked
    assert not (capabilities.exec or capabilities.secret_files or capabilities.pinned_mounts)
    assert not capabilities.credential_proxies
    assert capabilities.setid_refusal == SETID_REASON
