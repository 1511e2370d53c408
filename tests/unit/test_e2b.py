"""The E2B server's pure parts and its key file (no engine): Connect's envelopes, the
file entries, the key made 0600 and refused when it is a link or others may read it."""

from __future__ import annotations

import json
import os
import struct

import pytest

from orchestrator.e2b import wire
from orchestrator.e2b.server import KEY_FILE, E2bError, api_key


def test_frames_round_trip_and_the_end_carries_the_error():
    data = wire.frame({"event": {"start": {"pid": 7}}}) + wire.end_frame()
    assert list(wire.unframe(data)) == [{"event": {"start": {"pid": 7}}}]
    end = wire.end_frame(wire.ConnectFailure("not_found", "gone"))
    flags, size = struct.unpack(">BI", end[:5])
    assert flags == 2 and json.loads(end[5:]) == {"error": {"code": "not_found", "message": "gone"}}
    assert size == len(end) - 5


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"\x00\x00\x00", "truncated"),
        (b"\x00\x00\x00\x00\x09{}", "truncated"),
        (b"\x01\x00\x00\x00\x02{}", "compressed"),
        (b"\x00\x00\x00\x00\x02[]", "not a JSON object"),
        (b"\x00\x00\x00\x00\x02{x", "not JSON"),
    ],
)
def test_a_malformed_envelope_is_invalid_argument(body, says):
    with pytest.raises(wire.ConnectFailure, match=says) as failed:
        list(wire.unframe(body))
    assert failed.value.code == "invalid_argument"
    assert wire.connect_status(failed.value.code) == 400


def test_find_records_become_entry_infos():
    out = (
        b"f\t3\t644\tnobody\tnogroup\t1700000000.5\t\t/tmp/a b.txt\0"
        b"d\t4096\t755\tnobody\tnogroup\t1700000000\t\t/tmp/dir\0"
        b"l\t7\t777\tnobody\tnogroup\t1700000000\t/etc/x\t/tmp/link\0"
    )
    entries = [e.to_json() for e in wire.parse_entries(out)]
    assert entries[0]["name"] == "a b.txt" and entries[0]["type"] == "FILE_TYPE_FILE"
    assert entries[0]["size"] == "3" and entries[0]["permissions"] == "-rw-r--r--"
    assert entries[0]["modifiedTime"] == "2023-11-14T22:13:20.500000Z"
    assert entries[1]["type"] == "FILE_TYPE_DIRECTORY" and entries[1]["permissions"] == "drwxr-xr-x"
    assert entries[2]["symlinkTarget"] == "/etc/x" and entries[2]["isSymlink"] is True


def test_the_key_is_made_private_once_and_reused(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        key = api_key(fd)
        assert key.startswith("e2b_") and len(key) == 44
        assert oct((tmp_path / KEY_FILE).stat().st_mode & 0o777) == "0o600"
        assert api_key(fd) == key
    finally:
        os.close(fd)


def test_a_key_file_others_may_read_or_a_link_is_refused(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        (tmp_path / "elsewhere").write_text("e2b_planted\n")
        (tmp_path / KEY_FILE).symlink_to(tmp_path / "elsewhere")
        with pytest.raises(E2bError, match="is a link"):
            api_key(fd)
        (tmp_path / KEY_FILE).unlink()
        (tmp_path / KEY_FILE).write_text("e2b_readable\n")
        (tmp_path / KEY_FILE).chmod(0o644)
        with pytest.raises(E2bError, match="not yours alone"):
            api_key(fd)
    finally:
        os.close(fd)


def test_a_gzip_upload_is_inflated_to_the_cap_and_no_further(monkeypatch):
    import gzip

    from orchestrator.e2b import app

    monkeypatch.setattr(app, "MAX_FILE", 1000)
    assert app._gunzip(gzip.compress(b"x" * 1000)) == b"x" * 1000
    with pytest.raises(wire.ConnectFailure, match="over 1000 bytes"):
        app._gunzip(gzip.compress(b"\0" * 1_000_000))
    with pytest.raises(wire.ConnectFailure, match="not gzip"):
        app._gunzip(b"plain")
    with pytest.raises(wire.ConnectFailure, match="cut short"):
        app._gunzip(gzip.compress(b"y" * 500)[:-12])


def test_watch_events_are_the_difference_between_two_looks():
    from orchestrator.e2b.app import _changes

    before = {"/w/a": ("f", 1, 1.0), "/w/b": ("f", 1, 1.0), "/w/c": ("f", 1, 1.0)}
    now = {"/w/a": ("f", 1, 1.0), "/w/b": ("f", 2, 1.0), "/w/d/e": ("f", 0, 2.0)}
    assert _changes("/w/", before, now) == [
        {"name": "b", "type": "EVENT_TYPE_WRITE"},
        {"name": "c", "type": "EVENT_TYPE_REMOVE"},
        {"name": "d/e", "type": "EVENT_TYPE_CREATE"},
    ]
    assert _changes("/w", now, now) == []
