"""Escaping worker text for a terminal: chunked streams, terminals against pipes, --raw."""

from __future__ import annotations

import io
import json
import os

import pytest

from orchestrator.cli import terminal
from orchestrator.cli.batch import _printable
from orchestrator.escaping import StreamEscaper, escape, escape_bytes, escape_surrogates, json_safe

HOSTILE = "a\x1b]52;c;SGk=\x07b\x1b[2J\x9b\u202e\u2066\u200b\r\x7f é\tz\\n\n"


def test_a_stream_escapes_as_the_whole_would_however_it_is_cut():
    raw = HOSTILE.encode() + b"\xff\xe2\x80"  # an undecodable byte, a character cut short
    whole = escape_bytes(raw, keep=terminal.KEEP).encode()
    for size in (1, 2, 3, 7):
        escaper = StreamEscaper(keep=terminal.KEEP)
        pieces = [escaper.feed(raw[i : i + size]) for i in range(0, len(raw), size)]
        assert b"".join(pieces) + escaper.finish() == whole
    assert whole.endswith(b"\\xff\\xe2\\x80")


def test_what_a_terminal_would_obey_is_shown_and_the_rest_kept():
    shown = escape(HOSTILE, keep=terminal.KEEP)
    for obeyed in ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u200b", "\r", "\x7f"):
        assert obeyed not in shown
    assert "\\x1b]52;c;SGk=\\x07" in shown and "\\u202e" in shown and "\\x9b" in shown
    assert "é\tz\\n\n" in shown  # text, tabs, newlines and backslashes as they were


@pytest.fixture
def tty():
    master, slave = os.openpty()
    with os.fdopen(slave, "wb", buffering=0) as stream:
        yield stream
    os.close(master)


def test_worker_output_is_escaped_on_a_terminal_only(tty, monkeypatch):
    monkeypatch.setattr(terminal.Raw, "asked", False)
    pipe = io.BytesIO()
    output = terminal.WorkerOutput(pipe, tty)
    assert output.escapers["stdout"] is None and output.escapers["stderr"] is not None
    output.write("stdout", HOSTILE.encode())
    output.write("stdout", b"\xe2\x80")
    output.close()
    assert pipe.getvalue() == HOSTILE.encode() + b"\xe2\x80"  # a pipe: bytes unchanged


def test_raw_passes_everything_to_a_terminal(tty, monkeypatch):
    monkeypatch.setattr(terminal.Raw, "asked", True)
    assert not terminal.escaping(tty)
    assert terminal.WorkerOutput(tty, tty).escapers == {"stdout": None, "stderr": None}
    assert terminal.shown(HOSTILE, tty) == HOSTILE
    monkeypatch.setattr(terminal.Raw, "asked", False)
    assert terminal.escaping(tty) and terminal.shown(HOSTILE, tty) != HOSTILE
    assert terminal.shown(HOSTILE, io.StringIO()) == HOSTILE


def test_batch_lines_never_carry_what_a_worker_wrote_raw():
    line = _printable("OCI runtime exec failed: \x1b]52;c;SGk=\x07\nsecond \u202eline")
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    assert "\\x1b]52" in line and "\\u202e" in line


def test_only_lone_surrogates_are_escaped_for_utf8():
    assert escape_surrogates("plain \\ \x1b text é") == "plain \\ \x1b text é"
    # os.fsdecode(b"bad\xff.txt"), and a surrogate no byte stands for
    assert escape_surrogates("bad\udcff.txt") == "bad\\xff.txt"
    assert escape_surrogates("x\ud800y") == "x\\ud800y"
    data = json_safe({"k\udc80": ["a\udcfe", ("b",), 1, None, True], "n": 2.5})
    assert data == {"k\\x80": ["a\\xfe", ["b"], 1, None, True], "n": 2.5}
    json.dumps(data, ensure_ascii=False).encode("utf-8")
