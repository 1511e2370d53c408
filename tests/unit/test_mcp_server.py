"""The MCP server in process, with the SDK's own client session over memory streams.

The session behind it is the fake over real sandbox files from ``test_tools``.
"""

from __future__ import annotations

import contextlib
import os

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.shared.memory import create_client_server_memory_streams

from orchestrator.audit import AuditFilter
from orchestrator.tools.mcp_server import build_server
from tests.unit.tools_support import toolset_for


@pytest.fixture
def tools(project):
    yield from toolset_for(project)


def drive(toolset, script, elicitation=None):
    """Run ``script(client)`` against a server for ``toolset``; return what it returns."""
    out = {}

    async def main():
        server = build_server(toolset)
        streams = create_client_server_memory_streams()
        async with streams as (client_streams, server_streams), anyio.create_task_group() as group:
            group.start_soon(
                lambda: server.run(
                    server_streams[0],
                    server_streams[1],
                    server.create_initialization_options(),
                    raise_exceptions=True,
                )
            )
            async with ClientSession(*client_streams, elicitation_callback=elicitation) as c:
                await c.initialize()
                out["value"] = await script(c)
            group.cancel_scope.cancel()

    anyio.run(main)
    return out["value"]


def refused(toolset):
    return toolset.audit_log.query(AuditFilter(operation="tool.refused"))


def test_tools_are_listed_with_their_schemas_and_hints(tools):
    async def script(client):
        return (await client.list_tools()).tools

    listed = {t.name: t for t in drive(tools, script)}
    assert list(listed) == [
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
    assert listed["read"].input_schema["required"] == ["path"]
    assert listed["read"].annotations.read_only_hint is True
    assert listed["delete"].annotations.destructive_hint is True


def test_calls_answer_json_and_refusals_are_tool_errors(tools):
    async def script(client):
        return [
            await client.call_tool("list", {"path": "/"}),
            await client.call_tool("read", {"path": "/input/a.txt"}),
            await client.call_tool("write", {"path": "/input/x", "content": "x"}),
            await client.call_tool("read", {"path": 7}),
        ]

    listing, read, ro, bad = drive(tools, script)
    assert not listing.is_error
    assert "input" in [e["name"] for e in listing.structured_content["entries"]]
    assert read.structured_content["text"] == "one\ntwo\n"
    assert ro.is_error
    assert ro.content[0].text.startswith("Cannot write '/input/x': /input is read-only. Writable:")
    assert bad.is_error
    assert bad.content[0].text == "Tool 'read': 'path' must be a string, not an integer"


def test_without_elicitation_a_call_needing_approval_is_refused_and_audited(tools):
    async def script(client):
        return await client.call_tool("delete", {"path": "/data/kept.txt"})

    answer = drive(tools, script)
    assert answer.is_error
    assert answer.content[0].text == (
        "needs approval: delete /data/kept.txt (zone /data asks before deletes)"
    )
    assert tools.session.files.exists("/data/kept.txt")
    assert [e.metadata["status"] for e in refused(tools)] == ["needs_approval"]


@pytest.mark.parametrize(
    ("reply", "runs"),
    [
        (types.ElicitResult(action="accept", content={"approve": True}), True),
        (types.ElicitResult(action="accept", content={"approve": False}), False),
        (types.ElicitResult(action="decline"), False),
        (types.ElicitResult(action="cancel"), False),
    ],
)
def test_with_elicitation_the_person_decides(tools, reply, runs):
    asked = []

    async def elicitation(context, params):
        asked.append(params)
        return reply

    async def script(client):
        return await client.call_tool("delete", {"path": "/data/kept.txt"})

    answer = drive(tools, script, elicitation)
    assert asked[0].message == (
        "The sandbox asks to delete /data/kept.txt (zone /data asks before deletes). Approve?"
    )
    assert asked[0].requested_schema["properties"]["approve"]["type"] == "boolean"
    assert answer.is_error is not runs
    assert tools.session.files.exists("/data/kept.txt") is not runs  # the run's private copy
    if not runs:
        assert answer.content[0].text.startswith("not approved: delete /data/kept.txt")
        assert [e.metadata["status"] for e in refused(tools)] == ["declined"]


def test_pre_approved_and_blocked_calls_never_ask(tools):
    asked = []

    async def elicitation(context, params):
        asked.append(params)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def script(client):
        return [
            await client.call_tool("read", {"path": "/input/a.txt"}),
            await client.call_tool("delete", {"path": "/notes/n.txt"}),
        ]

    read, blocked = drive(tools, script, elicitation)
    assert not read.is_error
    assert blocked.is_error
    assert "deletes in /notes are blocked" in blocked.content[0].text
    assert asked == []


def test_a_failing_tool_is_a_tool_error_and_names_are_escaped(tools, monkeypatch):
    (tools.root / "output").joinpath(os.fsdecode(b"zz\xff.md")).write_text("x")

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    async def script(client):
        listed = await client.call_tool("list", {"path": "/output"})
        monkeypatch.setattr(tools, "call", broken)
        failed = await client.call_tool("list", {"path": "/output"})
        monkeypatch.undo()
        after = await client.call_tool("read", {"path": "/input/a.txt"})
        return listed, failed, after

    listed, failed, after = drive(tools, script)
    assert [e["name"] for e in listed.structured_content["entries"]] == ["zz\\xff.md"]
    listed.model_dump_json().encode("utf-8")  # what the stdio transport writes
    assert failed.is_error
    assert failed.content[0].text == "list failed unexpectedly: RuntimeError: a bug"
    assert not after.is_error


def test_the_session_counts_as_busy_while_the_person_is_asked(tools, monkeypatch):
    busy: list[str] = []

    @contextlib.contextmanager
    def waiting():
        busy.append("start")
        try:
            yield
        finally:
            busy.append("end")

    monkeypatch.setattr(tools.session, "waiting", waiting, raising=False)
    during: list[list[str]] = []

    async def elicitation(context, params):
        during.append(list(busy))
        return types.ElicitResult(action="accept", content={"approve": True})

    async def script(client):
        return await client.call_tool("delete", {"path": "/data/kept.txt"})

    answer = drive(tools, script, elicitation)
    assert not answer.is_error
    assert during == [["start"]]  # asked while the session was held busy
    assert busy == ["start", "end"]  # and released once answered
