"""The E2B server's process service beyond one command (docs/e2b.md), through the
unmodified ``e2b`` SDK against the real server (``orchestrator e2b serve`` in a
subprocess, the fixture of :mod:`tests.integration.test_e2b`): standard input, connecting
to a running command, a PTY, and the async client's streamed folder watch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from e2b import AsyncSandbox, CommandExitException, PtySize, Sandbox
from e2b.exceptions import NotFoundException, SandboxException

from orchestrator.audit import AuditFilter
from orchestrator.config import load_project
from orchestrator.runtime import open_audit
from tests.conftest import wait_until
from tests.integration.test_e2b import server  # noqa: F401 - the fixture

pytestmark = pytest.mark.docker


def _read_until(handle, done: Callable[[bytes], bool], into: bytearray) -> bytes:
    """Read a handle's output (stdout or pty) into ``into`` until ``done(into)``."""
    if done(bytes(into)):
        return bytes(into)
    for stdout, _, pty in handle:
        into += pty if pty is not None else (stdout or "").encode()
        if done(bytes(into)):
            return bytes(into)
    raise AssertionError(f"the output ended without what was awaited: {bytes(into)!r}")


def test_stdin_connect_list_and_kill(server):  # noqa: F811 - the fixture
    sandbox = Sandbox.create("box", timeout=120)
    try:
        # standard input: sent in pieces, then closed (the command then reads end of file)
        reader = sandbox.commands.run(
            "while read -r line; do echo got $line; done; echo eof", background=True, stdin=True
        )
        sandbox.commands.send_stdin(reader.pid, "one\n")
        sandbox.commands.send_stdin(reader.pid, b"two\nthr")
        reader.send_stdin("ee\n")
        sandbox.commands.close_stdin(reader.pid)
        assert reader.wait().stdout == "got one\ngot two\ngot three\neof\n"
        # a stream of input in one call, in order
        streamed = sandbox.commands.run("cat; echo end", background=True, stdin=True)
        sandbox.commands.stream_input(streamed.pid, ["al", b"pha\n", "beta\n"])
        sandbox.commands.close_stdin(streamed.pid)
        assert streamed.wait().stdout == "alpha\nbeta\nend\n"
        # a command started without stdin gets none: input for it is refused in one line
        quiet = sandbox.commands.run("sleep 30", background=True)
        with pytest.raises(SandboxException, match="without stdin: run it with stdin=True"):
            sandbox.commands.send_stdin(quiet.pid, "x")
        assert quiet.kill()
        # connect to a running command: its output from then on; list shows it; the
        # connected handle's kill stops it
        ticker = sandbox.commands.run(
            "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done", background=True
        )
        assert wait_until(lambda: [p.pid for p in sandbox.commands.list()] == [ticker.pid], 10)
        [listed] = sandbox.commands.list()
        assert "tick" in " ".join(listed.args)
        first = bytearray()
        _read_until(ticker, lambda b: b"tick 3\n" in b, first)
        connected = sandbox.commands.connect(ticker.pid)
        assert connected.pid == ticker.pid
        later = bytearray()
        seen = _read_until(connected, lambda b: b.count(b"\n") >= 3, later).decode()
        numbers = [int(line.split()[1]) for line in seen.splitlines() if line.startswith("tick")]
        assert numbers[0] > 3 and numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        assert connected.kill()
        with pytest.raises(CommandExitException) as killed:
            connected.wait()
        assert killed.value.exit_code == 137  # SIGKILL
        assert wait_until(lambda: sandbox.commands.list() == [], 10)
        # nothing to connect to once it has ended
        with pytest.raises(NotFoundException):
            sandbox.commands.connect(ticker.pid)
        with pytest.raises(NotFoundException):
            sandbox.commands.send_stdin(ticker.pid, "x")
    finally:
        assert sandbox.kill()


def test_pty(server):  # noqa: F811 - the fixture
    sandbox = Sandbox.create("box", timeout=120)
    try:
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
        shown = bytearray()
        sandbox.pty.send_stdin(terminal.pid, b"echo h''i; tty; stty size\n")
        _read_until(terminal, lambda b: b"hi\r\n" in b and b"24 80\r\n" in b, shown)
        assert b"/dev/pts/" in shown  # a real pseudo-terminal, its lines ended \r\n
        assert [p.pid for p in sandbox.commands.list()] == [terminal.pid]
        sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=100))
        sandbox.pty.send_stdin(terminal.pid, b"stty size\n")
        _read_until(terminal, lambda b: b"40 100\r\n" in b, shown)
        sandbox.pty.stream_input(terminal.pid, [b"echo str", b"eam''ed\n"])
        _read_until(terminal, lambda b: b"streamed\r\n" in b, shown)
        # another client connects to the same terminal: it sees what is typed from now on
        other = sandbox.pty.connect(terminal.pid, timeout=0)
        sandbox.pty.send_stdin(terminal.pid, b"echo ag''ain\n")
        _read_until(other, lambda b: b"again\r\n" in b, bytearray())
        assert sandbox.pty.kill(terminal.pid)
        with pytest.raises(CommandExitException):
            terminal.wait()
        assert wait_until(lambda: sandbox.commands.list() == [], 10)
    finally:
        assert sandbox.kill()


def test_async_watch_while_a_command_writes(server):  # noqa: F811 - the fixture
    project = server["project"]

    async def go() -> tuple[set[tuple[str, str]], list[str]]:
        sandbox = await AsyncSandbox.create("box", timeout=120)
        try:
            await sandbox.files.make_dir("/tmp/w")
            events: list[tuple[str, str]] = []
            watch = await sandbox.files.watch_dir(
                "/tmp/w", on_event=lambda e: events.append((e.name, e.type.name)), recursive=True
            )
            output: list[str] = []
            writer = await sandbox.commands.run(
                "for i in 1 2 3; do echo $i > /tmp/w/f$i; echo wrote $i; sleep 0.5; done; "
                "mkdir /tmp/w/sub; echo x > /tmp/w/sub/g; sleep 1; rm /tmp/w/f1",
                background=True,
                on_stdout=output.append,
            )
            assert (await writer.wait()).exit_code == 0
            deadline = time.monotonic() + 15
            while ("f1", "REMOVE") not in events and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await watch.stop()
            # a folder that is not there, or not a folder: the SDK's own errors
            with pytest.raises(NotFoundException, match="No such file or directory"):
                await sandbox.files.watch_dir("/tmp/nowhere", on_event=print)
            with pytest.raises(SandboxException, match="/tmp/w/f2: Not a directory"):
                await sandbox.files.watch_dir("/tmp/w/f2", on_event=print)
            return set(events), output
        finally:
            await sandbox.kill()

    events, output = asyncio.run(go())
    assert output == ["wrote 1\n", "wrote 2\n", "wrote 3\n"]
    assert {
        ("f1", "CREATE"),
        ("f2", "CREATE"),
        ("f3", "CREATE"),
        ("sub", "CREATE"),
        ("sub/g", "CREATE"),
        ("f1", "REMOVE"),
    } <= events, events
    assert {kind for _, kind in events} <= {"CREATE", "WRITE", "REMOVE"}
    # the watch looked many times, but is one exec in the audit log (and its kill one more)
    audit = open_audit(load_project(project.root))
    execs = [
        " ".join(e.metadata["argv"]) for e in audit.query(AuditFilter(operation="session.exec"))
    ]
    assert len([c for c in execs if "cksum" in c and " /tmp/w " in c]) == 1, execs
    assert len([c for c in execs if "E2B_WATCH_ID" in c]) == 1, execs
