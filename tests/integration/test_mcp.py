"""``orchestrator mcp`` end to end: the SDK's own stdio client launches the real command
against the real engine, and drives a live session through its tools."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from orchestrator import labels
from orchestrator.audit import AuditFilter
from orchestrator.config import load_project
from orchestrator.runtime import open_audit
from tests.integration.conftest import cli, containers_of

pytestmark = pytest.mark.docker


@pytest.fixture
def mcp_project(engine, project):
    project.zone("input", "ro", files={"notes.txt": "alpha\nbeta\n"})
    project.zone("data", "rw", files={"kept.txt": "original"})
    project.worker(
        "w",
        "trust: session\nsandbox: {zones: [{name: input}, "
        "{name: data, mode: rw, approval: {write: ask, delete: ask}}]}",
    )
    return project


def serve(project, script, elicitation=None):
    """Launch ``python -m orchestrator mcp w`` with the SDK's stdio client, run
    ``script(client)``, disconnect; return what the script returned and the server's pid."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator", "mcp", "w", "--project", str(project.root)],
        env={**os.environ, "TESTCONTAINERS_RYUK_DISABLED": "true"},
    )
    out = {}

    async def main():
        errlog = open(project.root / "mcp.stderr", "w")  # noqa: SIM115
        try:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write, elicitation_callback=elicitation) as client,
            ):
                await client.initialize()
                out["value"] = await script(client)
        finally:
            errlog.close()

    anyio.run(main)
    return out["value"]


def text(result: types.CallToolResult) -> str:
    return result.content[0].text


def test_a_real_client_lists_reads_is_refused_execs_and_stages(engine, mcp_project):
    project = mcp_project

    async def script(client):
        tools = [t.name for t in (await client.list_tools()).tools]
        listed = await client.call_tool("list", {"path": "/"})
        read = await client.call_tool("read", {"path": "/input/notes.txt"})
        refused = await client.call_tool("write", {"path": "/input/x.txt", "content": "x"})
        asked = await client.call_tool("delete", {"path": "/data/kept.txt"})
        ran = await client.call_tool(
            "exec", {"command": "echo made > /session/report.md && id -u && cat /input/notes.txt"}
        )
        staged = await client.call_tool(
            "stage", {"files": ["/session/report.md"], "message": "a report"}
        )
        context = await client.call_tool("context", {})
        return tools, listed, read, refused, asked, ran, staged, context

    tools, listed, read, refused, asked, ran, staged, context = serve(project, script)
    assert tools == [
        "list",
        "read",
        "write",
        "delete",
        "stat",
        "exec",
        "stage",
        "context",
        "checkpoint",
        "branch",
    ]
    names = [e["name"] for e in listed.structured_content["entries"]]
    assert {"input", "data", "session", "staged"} <= set(names)
    assert read.structured_content["text"] == "alpha\nbeta\n"
    assert refused.is_error
    assert text(refused).startswith("Cannot write '/input/x.txt': /input is read-only. Writable:")
    assert not (project.root / "input" / "x.txt").exists()
    assert asked.is_error  # the SDK's client declares no elicitation unless given a callback
    assert text(asked) == "needs approval: delete /data/kept.txt (zone /data asks before deletes)"
    assert not ran.is_error, text(ran)
    assert ran.structured_content["exit_code"] == 0
    uid = ran.structured_content["stdout"].splitlines()[0]
    assert uid != "0"
    assert ran.structured_content["stdout"].endswith("alpha\nbeta\n")
    assert not staged.is_error, text(staged)
    change_id = staged.structured_content["change_set"]
    assert context.structured_content["trust"] == "session"

    listing = cli("staged", "list", "--project", str(project.root), "--json")
    assert listing.returncode == 0, listing.stderr
    assert change_id in listing.stdout
    assert "a report" in listing.stdout

    audit = open_audit(load_project(project.root))
    refusals = audit.query(AuditFilter(operation="tool.refused"))
    assert [(e.metadata["tool"], e.metadata["status"]) for e in refusals] == [
        ("write", "blocked"),
        ("delete", "needs_approval"),
    ]
    session_id = refusals[0].session_id
    assert session_id
    closed = audit.query(AuditFilter(operation="session.closed", session=session_id))
    assert len(closed) == 1
    assert containers_of(engine, os.getpid()) == []
    assert not [o for o in engine.list_managed() if o.labels.get(labels.SESSION) == session_id]
    said = (project.root / "mcp.stderr").read_text()
    assert f"mcp: session {session_id} closed" in said, said
    assert "container removed" in said, said


def test_elicitation_asks_the_person_before_a_delete(engine, mcp_project):
    asked = []

    async def approve(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def script(client):
        deleted = await client.call_tool("delete", {"path": "/data/kept.txt"})
        after = await client.call_tool("stat", {"path": "/data/kept.txt"})
        return deleted, after

    deleted, after = serve(mcp_project, script, approve)
    assert asked == [
        "The sandbox asks to delete /data/kept.txt (zone /data asks before deletes). Approve?"
    ]
    assert not deleted.is_error, text(deleted)
    assert after.is_error
    assert "does not exist" in text(after)
    # an 'ask' zone: the real folder changes only when its change set is approved
    assert (mcp_project.root / "data" / "kept.txt").read_text() == "original"


@pytest.mark.parametrize("delay", [0.0, 1.5], ids=["while-starting", "while-serving"])
def test_sigterm_closes_the_session_and_removes_its_container(engine, mcp_project, delay):
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "mcp", "w", "--project", str(mcp_project.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stderr.readline()  # said once the container is up
        assert "mcp: session" in first, first
        assert len(containers_of(engine, proc.pid)) == 1
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == ""  # nothing but the protocol ever goes to stdout
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "closed" in err and "container removed" in err, err
    assert containers_of(engine, proc.pid) == []


def test_a_name_that_is_not_utf8_is_answered_escaped_and_the_server_lives_on(engine, mcp_project):
    async def script(client):
        made = await client.call_tool(
            "exec", {"command": "python3 -c \"open(b'/session/zz\\xff.txt','w').write('x')\""}
        )
        listed = await client.call_tool("list", {"path": "/session"})
        long = await client.call_tool("write", {"path": "/session/" + "a" * 300, "content": "x"})
        after = await client.call_tool("read", {"path": "/input/notes.txt"})
        return made, listed, long, after

    made, listed, long, after = serve(mcp_project, script)
    assert not made.is_error and made.structured_content["exit_code"] == 0, text(made)
    assert not listed.is_error, text(listed)
    assert "zz\\xff.txt" in [e["name"] for e in listed.structured_content["entries"]]
    assert "zz\\\\xff.txt" in text(listed)  # the JSON text of the name
    assert long.is_error and "too long" in text(long)
    assert not after.is_error and after.structured_content["text"] == "alpha\nbeta\n"
