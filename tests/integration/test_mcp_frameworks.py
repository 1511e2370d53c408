"""``orchestrator mcp`` driven by the agent frameworks people wire MCP servers into, each with
its own client and its own scripted test model (no LLM), under runc and gVisor:

- pydantic-ai: ``MCPToolset`` over a stdio transport, a ``FunctionModel`` calling the tools
  one by one, approvals through its elicitation handler;
- openai-agents: ``MCPServerStdio`` with its default timeouts (5 s for everything, the first
  tool call included), ``agents.testing.ScriptedModel``, approvals through
  ``require_approval``.

Each test is one session (one container) doing it all: list ``/``, read, exec, a refused
write whose message names the writable zones, a write, ``stage``, and an approval.
langchain-mcp-adapters is not here: it pins ``mcp<2`` and cannot share this environment
(docs/mcp.md says how to configure it).
"""

from __future__ import annotations

import json
import os
import sys
from importlib.util import find_spec

import anyio
import pytest

from tests.integration.conftest import IN_CI, cli, containers_of

pytestmark = pytest.mark.docker

MISSING = [name for name in ("agents", "pydantic_ai", "fastmcp") if find_spec(name) is None]
if MISSING:  # `make test` installs them (the dev extras); under CI=true their absence fails
    message = f"not installed: {', '.join(MISSING)} (pip install -e '.[dev]')"
    if IN_CI:
        raise ImportError(message)
    pytest.skip(message, allow_module_level=True)

COMMAND = [sys.executable, "-m", "orchestrator", "mcp", "w", "--project"]


@pytest.fixture
def mcp_project(engine, project, isolation):
    project.zone("input", "ro", files={"notes.txt": "alpha\nbeta\n"})
    project.zone("data", "rw", files={"kept.txt": "original"})
    project.worker(
        "w",
        "trust: session\nsandbox: {zones: [{name: input}, "
        "{name: data, mode: rw, approval: {write: ask, delete: ask}}]}",
    )
    return project


def env():
    return {**os.environ, "TESTCONTAINERS_RYUK_DISABLED": "true"}


def staged_messages(project):
    listing = cli("staged", "list", "--project", str(project.root), "--json")
    assert listing.returncode == 0, listing.stderr
    return listing.stdout


def test_pydantic_ai_mcp_toolset_with_a_function_model(engine, mcp_project):
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import FunctionModel

    project = mcp_project
    calls = [
        ("list", {"path": "/"}),
        ("read", {"path": "/input/notes.txt"}),
        ("exec", {"command": "ls -l /input /data && id -u"}),
        ("write", {"path": "/input/x.txt", "content": "x"}),
        ("write", {"path": "/session/report.md", "content": "made\n"}),
        ("stage", {"files": ["/session/report.md"], "message": "pydantic-ai report"}),
        ("delete", {"path": "/data/kept.txt"}),
        ("stat", {"path": "/data/kept.txt"}),
    ]
    seen = []  # what came back to the model for each call: (kind, content)
    asked = []

    def model(messages, info):
        for part in messages[-1].parts if isinstance(messages[-1], ModelRequest) else []:
            if isinstance(part, ToolReturnPart):
                seen.append(("ok", part.content))
            elif isinstance(part, RetryPromptPart):
                seen.append(("error", part.content))
        step = sum(isinstance(m, ModelResponse) for m in messages)
        if step < len(calls):
            name, args = calls[step]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{step}")])
        return ModelResponse(parts=[TextPart("done")])

    async def approve(message, response_type, params, context):
        asked.append(message)
        return {"approve": True}

    async def main():
        transport = StdioTransport(sys.executable, [*COMMAND[1:], str(project.root)], env=env())
        toolset = MCPToolset(transport, elicitation_handler=approve, max_retries=5)
        agent = Agent(FunctionModel(model), toolsets=[toolset])
        async with toolset:
            names = [tool.name for tool in (await toolset.client.list_tools())]
            result = await agent.run("use the sandbox")
        return names, result.output

    names, output = anyio.run(main)
    assert output == "done"
    assert names == [
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
    assert len(seen) == len(calls), seen
    # a refusal reaches the model as the tool's answer: {"ok": false, "error": ...}
    listed, read, ran, refused, wrote, staged, deleted, gone = (c for _, c in seen)
    assert {"input", "data", "session", "staged"} <= {e["name"] for e in listed["entries"]}
    assert read["text"] == "alpha\nbeta\n"
    assert ran["exit_code"] == 0, ran
    assert "notes.txt" in ran["stdout"] and "kept.txt" in ran["stdout"]
    assert ran["stdout"].splitlines()[-1] != "0"
    assert "Cannot write '/input/x.txt': /input is read-only. Writable: /data, /session" in (
        str(refused)
    )
    assert wrote["path"] == "/session/report.md"
    assert staged["change_set"] in staged_messages(project)
    assert asked == [
        "The sandbox asks to delete /data/kept.txt (zone /data asks before deletes). Approve?"
    ]
    assert deleted["review"] is True
    assert "does not exist" in str(gone)  # deleted in the session's view of the zone
    assert (project.root / "data" / "kept.txt").read_text() == "original"  # until reviewed
    assert not (project.root / "input" / "x.txt").exists()
    assert containers_of(engine, os.getpid()) == []


def test_openai_agents_mcp_server_stdio_with_a_scripted_model(engine, mcp_project):
    from agents import Agent, Runner, set_tracing_disabled
    from agents.items import ToolCallOutputItem
    from agents.mcp import MCPServerStdio
    from agents.testing import ScriptedModel, assistant_message, function_call

    set_tracing_disabled(True)  # nothing leaves the machine
    project = mcp_project
    calls = [
        ("list", {"path": "/"}),
        ("read", {"path": "/input/notes.txt"}),
        ("exec", {"command": "ls -l /input /data && id -u"}),
        ("write", {"path": "/input/x.txt", "content": "x"}),
        ("write", {"path": "/session/report.md", "content": "made\n"}),
        ("stage", {"files": ["/session/report.md"], "message": "openai-agents report"}),
        ("delete", {"path": "/data/kept.txt"}),  # approved by the person in the framework
        ("write", {"path": "/session/nope.md", "content": "x"}),  # rejected in the framework
    ]
    steps = [[function_call(name, args, call_id=f"c{i}")] for i, (name, args) in enumerate(calls)]
    model = ScriptedModel([*steps, [assistant_message("done")]])
    params = {"command": sys.executable, "args": [*COMMAND[1:], str(project.root)], "env": env()}

    async def main():
        server = MCPServerStdio(
            params,
            name="sandbox",
            require_approval={"always": {"tool_names": ["write", "delete"]}},
        )
        approvals = []
        async with server:
            agent = Agent(name="a", model=model, mcp_servers=[server])
            result = await Runner.run(agent, "use the sandbox", max_turns=20)
            while result.interruptions:
                state = result.to_state()
                for item in result.interruptions:
                    approvals.append(item.tool_name or item.raw_item.name)
                    args = json.loads(item.raw_item.arguments)
                    if args.get("path") == "/session/nope.md":
                        state.reject(item)
                    else:
                        state.approve(item)
                result = await Runner.run(agent, state, max_turns=20)
        outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
        return approvals, result.final_output, outputs

    approvals, final, outputs = anyio.run(main)
    assert final == "done"
    assert approvals == ["write", "write", "delete", "write"]
    texts = [text_of(output) for output in outputs]
    assert len(texts) == len(calls), texts
    listed, read, ran, refused, wrote, staged, deleted, rejected = texts
    assert {"input", "data", "session", "staged"} <= {
        e["name"] for e in json.loads(listed)["entries"]
    }
    assert json.loads(read)["text"] == "alpha\nbeta\n"
    ran = json.loads(ran)
    assert ran["exit_code"] == 0 and "notes.txt" in ran["stdout"] and "kept.txt" in ran["stdout"]
    assert refused.startswith(
        "Cannot write '/input/x.txt': /input is read-only. Writable: /data, /session"
    )
    assert json.loads(wrote)["path"] == "/session/report.md"
    assert json.loads(staged)["change_set"] in staged_messages(project)
    # The framework's approval is the model's client saying yes, not the person answering
    # the server: the zone's own 'ask' still holds (this client offers no elicitation).
    assert deleted == "needs approval: delete /data/kept.txt (zone /data asks before deletes)"
    assert "written" not in rejected and "nope.md" not in rejected  # never reached the server
    assert (project.root / "data" / "kept.txt").read_text() == "original"
    assert containers_of(engine, os.getpid()) == []


def text_of(output):
    """A tool output as the model got it: the text of its one content item."""
    if isinstance(output, list):
        assert len(output) == 1, output
        output = output[0]
    if isinstance(output, dict):
        return output["text"]
    return str(output)
