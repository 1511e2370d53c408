"""The openai-agents SDK's sandbox client (docs/agents-sandbox.md), driven offline.

A real ``Runner.run`` of a ``SandboxAgent`` whose model is the SDK's own ``ScriptedModel``:
its tool calls (the SDK's ``exec_command``) run in this project's session, their output
reaches the agent's result, every command is in the project's audit log, and nothing is
left afterwards. Beside it, the session's own API (files, users) and the refusals.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from agents import Runner
from agents.items import ToolCallOutputItem
from agents.run import RunConfig
from agents.sandbox import LocalSnapshotSpec, Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import File
from agents.sandbox.errors import (
    ConfigurationError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.testing import ScriptedModel, assistant_message, function_call

from orchestrator.audit import AuditFilter
from orchestrator.config import load_project
from orchestrator.integrations.agents import client as agents_client
from orchestrator.integrations.agents.client import (
    OrchestratorSandboxClient,
    OrchestratorSandboxClientOptions,
)
from orchestrator.runtime import open_audit
from tests.integration.conftest import containers_of

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _state_home(tmp_path, monkeypatch):
    """The Runner's default snapshots (and their folder) go under the test's own folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _options(project, **extra) -> OrchestratorSandboxClientOptions:
    return OrchestratorSandboxClientOptions(
        project=str(project.root),
        zones=[{"name": "data", "mode": "ro"}],
        resources={"memory": "256m", "timeout": 60},
        **extra,
    )


def _shell(call_id: str, cmd: str):
    return function_call("exec_command", {"cmd": cmd}, call_id=call_id)


def _tar_with(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return buffer.getvalue()


def _refused(output: str) -> bool:
    return "Read-only file system" in output or "Permission denied" in output


def _nothing_left(engine, project) -> None:
    assert containers_of(engine, os.getpid()) == []
    assert agents_client._live == {}
    runs = project.root / ".sandbox" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


def test_an_agent_runs_its_tools_in_the_session(isolation, engine, project, tmp_path):
    project.zone("data", "ro", files={"notes.txt": "hello from the zone\n"})
    model = ScriptedModel(
        [
            [_shell("c1", "echo made > made.txt && cat made.txt seed.txt && pwd && id -u")],
            [_shell("c2", "cat /data/notes.txt; touch /data/planted")],
            [_shell("c3", "echo hi > /etc/planted")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(
        name="worker",
        model=model,
        instructions="use the shell",
        default_manifest=Manifest(entries={"seed.txt": File(content=b"seeded\n")}),
    )
    sandbox = SandboxRunConfig(client=OrchestratorSandboxClient(), options=_options(project))

    result = asyncio.run(
        Runner.run(agent, "go", run_config=RunConfig(sandbox=sandbox, tracing_disabled=True))
    )

    assert result.final_output == "done"
    said = [str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert len(said) == 3, said
    uid = project.identity[0]
    assert f"made\nseeded\n/workspace\n{uid}\n" in said[0], said[0]
    assert "hello from the zone" in said[1], said[1]
    # a read-only zone stays read-only, so does the root (runc and gVisor word it differently)
    assert _refused(said[1]) and _refused(said[2]), said
    model.assert_complete()

    audit = open_audit(load_project(project.root))
    execs = audit.query(AuditFilter(operation="session.exec"))
    commands = [" ".join(e.metadata["argv"]) for e in execs]
    assert any("echo made > made.txt" in c for c in commands), commands
    assert any("cat /data/notes.txt" in c for c in commands), commands
    assert len({e.session_id for e in execs}) == 1
    (started,) = audit.query(AuditFilter(operation="run.started"))
    assert started.metadata["isolation"] == isolation
    assert started.metadata["network"] == "none"
    assert len(audit.query(AuditFilter(operation="run.ended"))) == 1

    # the Runner's default snapshot: the workspace as a tar on the host, relative paths
    (snapshot,) = (tmp_path / "state").rglob("*.tar")
    with tarfile.open(snapshot) as tar:
        names = {Path(name).as_posix().removeprefix("./") for name in tar.getnames()}
        assert {"made.txt", "seed.txt"} <= names, names
    _nothing_left(engine, project)


#: A request through the proxy the session's commands get; prints the HTTP status.
FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=20).status)\n"
    "except urllib.error.HTTPError as e:\n    print(e.code)\n"
)


def test_the_session_api_files_users_network_and_resume(engine, project, tmp_path):
    project.isolation = "runc"  # the API, not the runtime, is under test here
    project.zone("data", "ro", files={"notes.txt": "zone text\n"})
    client = OrchestratorSandboxClient(_options(project, network={"allow": ["allowed.test:80"]}))

    async def scenario():
        snapshots = LocalSnapshotSpec(base_path=tmp_path / "snapshots")
        session = await client.create(manifest=Manifest(root="/tmp/work"), snapshot=snapshots)
        async with session:
            await session.write(Path("sub/a.txt"), io.BytesIO(b"written\n"))
            assert (await session.read(Path("sub/a.txt"))).read() == b"written\n"
            done = await session.exec("cat sub/a.txt /data/notes.txt")
            assert done.stdout == b"written\nzone text\n"
            # the SDK's editor (apply_patch) works over these files
            await session.apply_patch(
                {"type": "create_file", "path": "sub/b.txt", "diff": "+patched\n"}
            )
            await session.apply_patch(
                {"type": "update_file", "path": "sub/b.txt", "diff": "-patched\n+again\n"}
            )
            assert (await session.read(Path("sub/b.txt"))).read().rstrip() == b"again"
            # the allowlist is the egress proxy's: a name not on it is refused (403)
            fetched = await session.exec("python3", "-c", FETCH, "http://denied.test/", shell=False)
            assert fetched.stdout == b"403\n", fetched
            with pytest.raises(WorkspaceReadNotFoundError):
                await session.read(Path("missing.txt"))
            with pytest.raises(ConfigurationError, match="user 'root' is refused"):
                await session.exec("id", user="root")
            own = str(project.identity[0])
            assert (await session.exec("id -u", user=own)).stdout.decode().strip() == own
            # the state round-trips as JSON; resuming it in this process is the same session
            payload = json.loads(json.dumps(client.serialize_session_state(session.state)))
            state = client.deserialize_session_state(payload)
            again = await client.resume(state)
            await again.start()  # as the Runner does
            assert (await again.exec("cat sub/a.txt")).stdout == b"written\n"
        await client.delete(session)
        assert not await session.running()
        # resumed after it is gone (another process, say): a new session, the workspace
        # restored from the snapshot its end persisted
        fresh = await client.resume(client.deserialize_session_state(payload))
        async with fresh:
            assert fresh.state.orchestrator_session != session.state.orchestrator_session
            assert (await fresh.exec("cat sub/a.txt")).stdout == b"written\n"
            with pytest.raises(WorkspaceArchiveWriteError, match="snapshot is refused"):
                await fresh.hydrate_workspace(io.BytesIO(_tar_with("../outside.txt")))
        await client.delete(fresh)

    asyncio.run(scenario())
    audit = open_audit(load_project(project.root))
    decisions = {
        (e.metadata["host"], e.allowed)
        for e in audit.query(AuditFilter(operation="egress.decision"))
    }
    assert ("denied.test", False) in decisions, decisions
    _nothing_left(engine, project)


@pytest.mark.parametrize(
    ("agent_extra", "option_extra", "said"),
    [
        ({"run_as": "root"}, {}, "run_as adds one"),
        ({}, {"exposed_ports": (8080,)}, "publishes no ports"),
        ({}, {"network": "wide"}, "network"),
    ],
)
def test_what_is_refused_is_one_line_before_any_container(
    engine, project, agent_extra, option_extra, said
):
    project.zone("data", "ro")
    agent = SandboxAgent(name="w", model=ScriptedModel([]), **agent_extra)
    sandbox = SandboxRunConfig(
        client=OrchestratorSandboxClient(), options=_options(project, **option_extra)
    )
    with pytest.raises(ValueError, match=said) as info:
        asyncio.run(
            Runner.run(agent, "go", run_config=RunConfig(sandbox=sandbox, tracing_disabled=True))
        )
    message = str(info.value)
    assert message.startswith("orchestrator sandbox: ") and "\n" not in message, message
    assert open_audit(load_project(project.root)).query(AuditFilter(operation="run.started")) == []
    _nothing_left(engine, project)


def test_inline_options_run_in_a_project_without_a_workers_folder(engine, tmp_path):
    # docs/agents-sandbox.md's options describe the worker inline: no workers folder needed.
    root = tmp_path / "bare"
    (root / "data").mkdir(parents=True)
    (root / "data" / "notes.txt").write_text("zone text\n")
    (root / "orchestrator.yaml").write_text(
        "zones:\n  data: {path: data, mode: ro}\nisolation: {untrusted: runc}\n"
    )
    client = OrchestratorSandboxClient(
        OrchestratorSandboxClientOptions(
            project=str(root), zones=[{"name": "data", "mode": "ro"}], resources={"memory": "256m"}
        )
    )

    async def scenario():
        session = await client.create(manifest=Manifest(root="/tmp/work"))
        async with session:
            done = await session.exec("cat /data/notes.txt; ls -A /workers; touch /workers/x")
        await client.delete(session)
        return done

    done = asyncio.run(scenario())
    assert done.stdout == b"zone text\n"  # the zone; /workers empty
    assert b"Read-only file system" in done.stderr
    assert not (root / "workers").exists()
    assert containers_of(engine, os.getpid()) == []
