"""The E2B process service's pieces that need no engine: its shell scripts run by the
host's /bin/sh (the same POSIX tools as the worker image's), the watch's listing cutter,
and the checks of a PTY's size."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from orchestrator.e2b import processes, wire
from orchestrator.e2b.processes import split_size
from orchestrator.e2b.watches import MAX_LISTING, _Listings
from orchestrator.e2b.wire import ConnectFailure
from orchestrator.integrations import transfer


def _sh(script: str, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["/bin/sh", "-c", script, "sh", *args], input=data, capture_output=True, timeout=20
    )


def test_stdin_is_held_open_between_inputs_and_ends_when_closed(tmp_path):
    fifo = str(tmp_path / "stdin")
    command = subprocess.Popen(
        ["/bin/sh", "-c", processes.STDIN_WRAPPER, "sh", fifo, "sh", "-c", "cat; echo eof"],
        stdout=subprocess.PIPE,
    )
    try:
        assert _sh(processes._SEND, fifo, data=b"one\n").returncode == 0
        time.sleep(0.3)  # the first writer has gone: no end of file for the command
        assert command.poll() is None
        assert _sh(processes._SEND, fifo, data=b"two\n").returncode == 0
        assert _sh(processes._CLOSE, fifo).returncode == 0
        out, _ = command.communicate(timeout=10)
    finally:
        command.kill()
    assert out == b"one\ntwo\neof\n"
    assert command.returncode == 0
    assert not (tmp_path / "stdin").exists()  # the FIFOs go with the command
    # input for a command that has gone: refused (after waiting a moment for its FIFOs)
    assert _sh(processes._SEND, fifo, data=b"late\n").returncode == 3


def test_the_wrapper_keeps_the_command_s_exit_status(tmp_path):
    fifo = str(tmp_path / "stdin")
    done = _sh(processes.STDIN_WRAPPER, fifo, "sh", "-c", "exit 7")
    assert done.returncode == 7


def test_a_watch_prints_a_listing_only_when_the_folder_changed(tmp_path):
    (tmp_path / "a").write_text("a")
    loop = subprocess.Popen(
        ["/bin/sh", "-c", processes.WATCH_LOOP, "sh", str(tmp_path), "1", "0.05"],
        stdout=subprocess.PIPE,
    )
    try:
        time.sleep(0.6)
        (tmp_path / "b").write_text("b")
        time.sleep(0.6)
    finally:
        loop.kill()
        out, _ = loop.communicate(timeout=10)
    listings = _Listings().feed(out)
    assert len(listings) == 2, listings  # the first look, and the one after b appeared
    names = [sorted(e.path.rsplit("/", 1)[-1] for e in wire.parse_entries(x)) for x in listings]
    assert names == [["a"], ["a", "b"]]


def test_watching_a_missing_folder_fails_at_once(tmp_path):
    done = _sh(processes.WATCH_LOOP, str(tmp_path / "nowhere"), "1", "0.05")
    assert done.returncode == 1 and b"nowhere: No such file or directory" in done.stderr
    (tmp_path / "file").write_text("x")
    done = _sh(processes.WATCH_LOOP, str(tmp_path / "file"), "1", "0.05")
    assert done.returncode == 2 and b"file: Not a directory" in done.stderr


def test_listings_are_cut_at_their_marker_across_chunks():
    cutter = _Listings()
    record = b"f\t1\t644\tu\tg\t1.0\t\t/w/x\0"
    assert cutter.feed(record[:5]) == []
    assert cutter.feed(record[5:] + b"=") == []
    assert cutter.feed(b"\0=\0") == [record, b""]
    with pytest.raises(transfer.TooMuch):
        cutter.feed(record * (MAX_LISTING // len(record) + 1))


@pytest.mark.parametrize(
    ("pty", "size"),
    [
        (None, None),
        ({}, None),
        ({"size": {"rows": 40, "cols": 100}}, (40, 100)),
        ({"x": 1}, (24, 80)),
    ],
)
def test_a_pty_s_size(pty, size):
    assert split_size(pty) == size


@pytest.mark.parametrize("size", [{"rows": 0, "cols": 80}, {"rows": "24", "cols": 80}])
def test_a_bad_pty_size_is_invalid_argument(size):
    with pytest.raises(ConnectFailure) as failed:
        split_size({"size": size})
    assert failed.value.code == "invalid_argument"


def test_a_quiet_stream_sends_keepalives_until_its_end():
    async def go() -> list[bytes]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        out = []
        async for item in processes._drain(queue, 0.05):
            out.append(item)
            if len(out) == 2:
                queue.put_nowait(b"data")
                queue.put_nowait(None)
        return out

    keepalive = wire.frame({"event": {"keepalive": {}}})
    assert asyncio.run(go()) == [keepalive, keepalive, b"data"]
