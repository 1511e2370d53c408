"""What a worker prints never drives the terminal: shown escaped on a terminal, bytes in pipes.

The worker prints an OSC 52 clipboard write, CSI colours and a cursor move, a C1 CSI, a
right-to-left override and, for the pipe, a NUL, a carriage return and a byte that is no
UTF-8. Each command runs through the real entry point (``python -m orchestrator``) with its
output on a real pseudo-terminal, or on pipes.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time

import pytest

from orchestrator.audit import AuditLog
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

PAYLOAD = (
    b"osc52 \x1b]52;c;SGVsbG8=\x07 csi \x1b[31mred\x1b[0m up \x1b[2A c1 \xc2\x9b6n "
    b"rlo \xe2\x80\xaegnp.exe tab\tback\\slash\n"
)
ERR_PAYLOAD = b"err \x1b]52;c;RVZJTA==\x07 \xe2\x81\xa6isolate\n"
PIPE_EXTRA = b"nul \x00 cr \r not-utf8 \xff\xfe end"
#: How the escaped payload reads on a terminal.
SHOWN = (
    "osc52 \\x1b]52;c;SGVsbG8=\\x07 csi \\x1b[31mred\\x1b[0m up \\x1b[2A c1 \\x9b6n "
    "rlo \\u202egnp.exe tab\tback\\slash\n"
)
SHOWN_ERR = "err \\x1b]52;c;RVZJTA==\\x07 \\u2066isolate\n"
#: Bytes a terminal would obey, none of which may reach it unescaped.
OBEYED = (b"\x1b", b"\xc2\x9b", "\u202e".encode(), "\u2066".encode(), b"\x07")


def printer(project, extra: bytes = b"") -> None:
    script = f"""
    import sys
    sys.stdout.buffer.write({PAYLOAD + extra!r})
    sys.stdout.flush()
    sys.stderr.buffer.write({ERR_PAYLOAD!r})
    """
    command = json.dumps(["python3", "-c", textwrap.dedent(script)])
    project.worker("w", f"command: {command}\nsandbox: {{}}")


def in_terminal(*args: str, timeout: float = 120) -> tuple[int, bytes]:
    """Run the command line with stdin, stdout and stderr on one pseudo-terminal."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
        env={**os.environ, "COLUMNS": "400"},  # tables need no wrapping
    )
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            seen += data
        code = process.wait(timeout=30)
    finally:
        process.kill()
        os.close(master)
    return code, bytes(seen).replace(b"\r\n", b"\n")  # the terminal's own newline mapping


def assert_shown(seen: bytes) -> None:
    for raw in OBEYED:
        assert raw not in seen, (raw, seen)
    text = seen.decode("utf-8")
    assert SHOWN in text and SHOWN_ERR in text, text


def test_run_on_a_terminal_shows_escapes_and_raw_passes_them(engine, project):
    printer(project)
    code, seen = in_terminal("run", "w", "--project", str(project.root))
    assert code == 0, seen
    assert_shown(seen)
    assert b"orchestrator: run " in seen  # its own lines are there, unchanged
    code, seen = in_terminal("run", "w", "--raw", "--project", str(project.root))
    assert code == 0, seen
    assert PAYLOAD in seen and ERR_PAYLOAD in seen


def test_run_through_pipes_keeps_every_byte(engine, project):
    printer(project, PIPE_EXTRA)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "w", "--project", str(project.root)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == PAYLOAD + PIPE_EXTRA
    assert done.stderr.count(ERR_PAYLOAD) == 1


def test_run_json_on_a_terminal(engine, project):
    """--json: the JSON document is JSON (its encoding escapes), the live stream escaped."""
    printer(project)
    code, seen = in_terminal("run", "w", "--json", "--project", str(project.root))
    assert code == 0, seen
    assert_shown(seen)
    document = json.loads(seen[seen.index(b"\n{") :])
    assert document["stdout"] == PAYLOAD.decode()


def test_session_exec_on_a_terminal_and_through_pipes(engine, project):
    project.worker("w", "trust: session\nsandbox: {}")
    root = str(project.root)
    started = cli("session", "start", "w", "--project", root, "--json")
    assert started.returncode == 0, started.stderr
    sid = started.json()["id"]
    script = (
        f"import sys; sys.stdout.buffer.write({PAYLOAD + PIPE_EXTRA!r}); sys.stdout.flush(); "
        f"sys.stderr.buffer.write({ERR_PAYLOAD!r})"
    )
    command = ("session", "exec", sid, "--project", root, "--", "python3", "-c", script)
    try:
        code, seen = in_terminal(*command)
        assert code == 0, seen
        assert_shown(seen)
        code, seen = in_terminal(*command[:3], "--raw", *command[3:])
        assert code == 0, seen
        assert PAYLOAD in seen and ERR_PAYLOAD in seen
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", *command], capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == PAYLOAD + PIPE_EXTRA
        assert done.stderr == ERR_PAYLOAD
    finally:
        assert cli("session", "stop", sid, "--project", root).returncode == 0


def test_the_audit_table_shows_what_a_worker_chose_escaped(project):
    """Paths and reasons in the audit log may be a worker's choice (a file it asked for)."""
    root = project.root
    (root / ".sandbox").mkdir(mode=0o700)
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    log.record(
        "sandbox.write",
        allowed=False,
        reason="Cannot write '/input/\x1b]52;c;SGVsbG8=\x07x': /input is read-only",
        path="/input/\u202egnp.exe",
    )
    log.close()
    code, seen = in_terminal("audit", "--project", str(root))
    assert code == 0, seen
    # The table has colours of its own; what the worker chose may not drive anything.
    for raw in (b"\x1b]52", b"\x07", "\u202e".encode()):
        assert raw not in seen, (raw, seen)
    text = seen.decode()
    assert "\\x1b]52;c;SGVsbG8=\\x07x" in text and "\\u202egnp.exe" in text, text
