"""The stdio front of ``orchestrator mcp`` without an engine: it answers ``initialize`` and
``tools/list`` exactly as the SDK server does (both from ``orchestrator.tools.catalog``), it
imports nothing but the standard library, it holds the rest and replays the answered
``initialize`` into the SDK server, the first tool call waits for the session, and a
failure to open is a tool error that ends the server; through the real entry point, an
unknown worker is answered as such and the process exits 125 without a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time

import anyio
import mcp_types as types
import pytest
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, KNOWN_PROTOCOL_VERSIONS

from orchestrator.tools import catalog
from orchestrator.tools.mcp_front import REPLAY_ID, Front
from orchestrator.tools.mcp_server import build_server, serve_front, waiting_for
from orchestrator.tools.opening import Opening
from tests.unit.tools_support import toolset_for

CLIENT = {"name": "test", "version": "1"}


def request(ident, method, params=None):
    message = {"jsonrpc": "2.0", "id": ident, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message)


def initialize(ident=1, version="2025-06-18", capabilities=None):
    params = {"protocolVersion": version, "capabilities": capabilities or {}, "clientInfo": CLIENT}
    return request(ident, "initialize", params)


class Pipes:
    """A front over two pipes: ``send`` a line to it, ``answer`` reads its next line."""

    def __init__(self):
        to_front, self._client_out = os.pipe()
        self._client_in, from_front = os.pipe()
        self.front = Front(os.fdopen(to_front, "rb", buffering=0), from_front, version="")
        self._from_front = from_front
        self._buffer = b""
        self.front.start()

    def send(self, *lines):
        for line in lines:
            os.write(self._client_out, (line + "\n").encode())

    def answer(self, timeout=20):
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._client_in], [], [], timeout)
            assert ready, "no answer in time"
            chunk = os.read(self._client_in, 65536)
            assert chunk, "the front's output ended"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def end(self):
        os.close(self._client_out)

    def close(self):
        for fd in (self._client_out, self._from_front, self._client_in):
            with contextlib.suppress(OSError):
                os.close(fd)
        assert self.front.join(10)


@pytest.fixture
def pipes():
    made = Pipes()
    yield made
    made.close()


def sdk_answers(lines):
    """What the SDK server answers to ``lines`` (raw JSON-RPC), by request id."""
    answers = {}

    async def main():
        server = build_server(toolset=waiting_for(Opening(lambda: None)))
        streams = create_client_server_memory_streams()
        async with streams as (client, served), anyio.create_task_group() as group:
            group.start_soon(
                lambda: server.run(served[0], served[1], server.create_initialization_options())
            )
            for line in lines:
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                await client[1].send(SessionMessage(message))
                if isinstance(message, types.JSONRPCRequest):
                    out = (await client[0].receive()).message
                    answers[out.id] = out.model_dump(by_alias=True, exclude_unset=True, mode="json")
            group.cancel_scope.cancel()

    anyio.run(main)
    return answers


@pytest.mark.parametrize("version", [*KNOWN_PROTOCOL_VERSIONS, "1999-01-01"])
def test_the_front_answers_initialize_and_tools_list_as_the_sdk_server(pipes, version):
    lines = [
        initialize(1, version, {"elicitation": {}}),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        request(2, "tools/list"),
        request(3, "tools/list", {"cursor": "x"}),
        request(4, "ping"),
    ]
    sdk = sdk_answers(lines)
    pipes.send(*lines)
    front = {answer["id"]: answer for answer in (pipes.answer() for _ in range(4))}
    assert front == sdk
    assert pipes.front.answered == ["initialize", "tools/list", "tools/list", "ping"]
    expected = (
        version if version in HANDSHAKE_PROTOCOL_VERSIONS else HANDSHAKE_PROTOCOL_VERSIONS[-1]
    )
    assert front[1]["result"]["protocolVersion"] == expected
    assert [t["name"] for t in front[2]["result"]["tools"]] == [
        "list", "read", "write", "delete", "stat", "exec", "stage", "context", "checkpoint",
        "branch",
    ]  # fmt: skip


def test_the_catalog_negotiates_the_sdks_versions():
    assert catalog.HANDSHAKE_VERSIONS == HANDSHAKE_PROTOCOL_VERSIONS


def test_the_front_imports_only_the_standard_library():
    probe = (
        "import json, sys\nbefore = set(sys.modules)\nimport orchestrator.tools.mcp_front\n"
        "print(json.dumps(sorted(m for m in set(sys.modules) - before\n"
        "             if m.split('.')[0] not in sys.stdlib_module_names)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert all(name.startswith("orchestrator") for name in json.loads(loaded)), loaded


def test_the_front_holds_the_rest_and_replays_initialize(pipes):
    held = [
        request(7, "tools/list"),  # before initialize: the SDK's to refuse
        json.dumps({"jsonrpc": "2.0", "id": 8, "method": "initialize", "params": {}}),  # malformed
        "not json",
    ]
    pipes.send(*held)
    pipes.send(initialize(9), request(10, "tools/call", {"name": "list", "arguments": {}}))
    pipes.send(request(11, "tools/list", {"_meta": {"io.modelcontextprotocol/x": 1}}))
    assert pipes.answer()["id"] == 9
    delivered = []
    arrived = threading.Event()

    def deliver(line):
        delivered.append(line)
        if line is None:
            arrived.set()

    time.sleep(0.1)  # the front has read every line by now
    pipes.front.attach(deliver)
    pipes.send(request(12, "tools/list"))
    pipes.end()
    assert arrived.wait(10)
    assert [line.strip() for line in delivered[:3]] == held
    replay = json.loads(delivered[3])
    assert replay["id"] == REPLAY_ID and replay["method"] == "initialize"
    assert [json.loads(line)["id"] for line in delivered[4:7]] == [10, 11, 12]
    assert delivered[7:] == [None]
    assert pipes.front.answered == ["initialize"]


def served(pipes, opener, lines, answers):
    """Initialize through the front, then serve the client with ``opener`` behind it and
    send ``lines``: the answers (by id, the front's to initialize too), the thread, the end."""
    pipes.send(initialize(1, capabilities={"elicitation": {}}))
    got = {1: pipes.answer()}  # by the front: the server is not there yet
    ended = {}

    async def main():
        tools = waiting_for(Opening(opener))
        ended["value"] = await serve_front(pipes.front, tools, signals=False)

    thread = threading.Thread(target=anyio.run, args=(main,), daemon=True)
    thread.start()
    pipes.send(*lines)
    for _ in range(answers):
        answer = pipes.answer()
        got[answer["id"]] = answer
    return got, thread, ended


def test_the_first_call_waits_for_the_session_and_the_rest_is_the_sdks(pipes, project):
    tools = next(toolset_for(project))
    released = threading.Event()

    def opener():
        released.wait(10)
        return tools.session

    threading.Timer(0.3, released.set).start()
    lines = [
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        request(2, "tools/call", {"name": "read", "arguments": {"path": "/input/a.txt"}}),
    ]
    got, thread, ended = served(pipes, opener, lines, 1)
    assert REPLAY_ID not in got  # the SDK's answer to the replayed initialize is dropped
    read = got[2]["result"]
    assert not read.get("isError") and read["structuredContent"]["text"] == "one\ntwo\n"
    pipes.send(request(3, "tools/list"))
    assert pipes.answer()["id"] == 3  # now answered by the SDK server
    assert pipes.front.answered == ["initialize"]
    pipes.end()
    thread.join(10)
    assert not thread.is_alive() and ended == {"value": None}


def test_a_failure_to_open_is_a_tool_error_and_ends_the_server(pipes):
    def opener():
        raise OSError(13, "Permission denied", "/var/run/docker.sock")

    lines = [
        request(2, "tools/list"),
        request(3, "tools/call", {"name": "list", "arguments": {"path": "/"}}),
    ]
    got, thread, ended = served(pipes, opener, lines, 2)
    assert got[3]["result"]["isError"] is True
    assert got[3]["result"]["content"][0]["text"] == (
        "the sandbox could not be opened: /var/run/docker.sock: Permission denied"
    )
    thread.join(10)
    assert not thread.is_alive() and ended == {"value": None}


def test_an_unknown_worker_is_answered_then_the_command_exits_125(project):
    env = {**os.environ, "ORCHESTRATOR_NO_SERVER": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "mcp", "nobody", "--project", str(project.root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        lines = [
            initialize(1),
            request(2, "tools/list"),
            request(3, "tools/call", {"name": "stat", "arguments": {"path": "/"}}),
        ]
        proc.stdin.write(("\n".join(lines) + "\n").encode())
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(3)]
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert answers[2]["result"]["isError"] is True
    message = answers[2]["result"]["content"][0]["text"]
    assert message.startswith("the sandbox could not be opened: ") and "nobody" in message
    assert code == 125, err
    assert "Traceback" not in err and "could not be opened" in err, err


def test_the_discover_probe_is_declined_so_the_client_uses_the_handshake(pipes):
    envelope = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    pipes.send(request(1, "server/discover", {"_meta": envelope}), initialize(2))
    declined, initialized = pipes.answer(), pipes.answer()
    assert declined["error"]["code"] == -32601  # method not found: the client falls back
    assert initialized["result"]["protocolVersion"] == "2025-06-18"
    delivered = []
    pipes.front.attach(delivered.append)
    pipes.send(request(3, "server/discover"))  # never reaches the SDK server either
    assert pipes.answer()["id"] == 3
    assert pipes.front.answered == ["server/discover", "initialize", "server/discover"]
    assert [json.loads(line)["id"] for line in delivered] == [REPLAY_ID]
