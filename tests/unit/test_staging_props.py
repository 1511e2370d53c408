"""Property tests: random trees and streams mixing good files with hostile entries.

Whatever the mix: every accepted path is safe (relative, no ``..``, no ``.git``, UTF-8,
within the caps), every hostile entry is rejected, accepted content is byte-identical,
and nothing outside the blob folder changes.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config.models import OutboxLimits
from orchestrator.staging import Collected, collect_dir, collect_tar, printable, safe_path
from orchestrator.staging.names import UnsafeName, checked_path
from tests.unit.test_staging_support import (
    END,
    blob_names,
    every_byte_under,
    header,
    member,
    sha,
    snapshot,
)

LIMITS = OutboxLimits(size=1 << 20, max_files=1000, max_file_size=1500)
SECRET = b"outside-secret-0451"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

safe_names = st.from_regex(r"[a-z0-9]{1,6}(/[a-z0-9_-]{1,6}){0,2}\.(md|txt)", fullmatch=True)
spoilers = st.sampled_from(
    [
        lambda n: b"../" + n,
        lambda n: b"a/../../" + n,
        lambda n: b"/" + n,
        lambda n: b".git/" + n,
        lambda n: b"x/.GiT/" + n,
        lambda n: b"git~1/" + n,
        lambda n: n + b"\xff",
        lambda n: b"\xc3" + n,
        lambda n: n + b"\x1b[2J",
        lambda n: n + b"\x7f",
        lambda n: "\u202e".encode() + n,
    ]
)
contents = st.binary(max_size=2000)


def check_accepted(collected: Collected, expected: dict[str, bytes]) -> None:
    paths = [f.path for f in collected.files]
    assert set(paths) == set(expected)
    total = 0
    for item in collected.files:
        assert safe_path(item.path) == item.path
        assert not item.path.startswith("/") and ".." not in item.path.split("/")
        assert ".git" not in [p.lower() for p in item.path.split("/")]
        item.path.encode("utf-8")  # valid UTF-8, no surrogates
        assert item.size <= LIMITS.max_file_size
        assert item.blob is not None and item.blob.read_bytes() == expected[item.path]
        assert item.sha256 == sha(expected[item.path])
        total += item.size
    assert total <= LIMITS.size and len(paths) <= LIMITS.max_files
    assert blob_names(collected.blob_dir) == {f.sha256 for f in collected.files}


@st.composite
def tar_entries(draw: st.DrawFn) -> list[tuple[bytes, str, bytes, bool]]:
    names = draw(st.lists(safe_names, min_size=1, max_size=12, unique=True))
    entries = []
    for name in names:
        raw = name.encode()
        kind = draw(st.sampled_from(["file", "file", "file", "symlink", "hardlink", "fifo", "chr"]))
        spoiled = draw(st.integers(0, 3)) == 0
        if spoiled:
            raw = draw(spoilers)(raw)
        entries.append((raw, kind, draw(contents), spoiled))
    return entries


@SETTINGS
@given(entries=tar_entries())
def test_hostile_tar_streams(entries: list[tuple[bytes, str, bytes, bool]]) -> None:
    codes = {"symlink": b"2", "hardlink": b"1", "fifo": b"6", "chr": b"3"}
    raw = b""
    expected: dict[str, bytes] = {}
    bad: list[bytes] = []
    for name, kind, data, spoiled in entries:
        if kind == "file":
            raw += member(name, data)
        else:
            raw += header(name, kind=codes[kind], linkname=b"/etc/shadow")
        if kind == "file" and not spoiled and len(data) <= LIMITS.max_file_size:
            expected[name.decode()] = data
        else:
            bad.append(name)
    with tempfile.TemporaryDirectory() as tmp:
        before = snapshot(Path(tmp))
        collected = collect_tar(io.BytesIO(raw + END), limits=LIMITS, tmp_dir=Path(tmp))
        check_accepted(collected, expected)
        assert sorted(r.path for r in collected.rejected) == sorted(printable(n) for n in bad)
        assert not collected.truncated
        assert snapshot(Path(tmp), skip=collected.blob_dir) == before


@st.composite
def dir_entries(draw: st.DrawFn) -> list[tuple[str, str, bytes]]:
    kinds = ["file", "file", "file", "symlink", "hardlink", "fifo", "badname", "ctlname", "git"]
    count = draw(st.integers(min_value=1, max_value=12))
    return [
        (
            f"d{n % 3}/e{n}" if draw(st.booleans()) else f"e{n}",
            draw(st.sampled_from(kinds)),
            draw(contents),
        )
        for n in range(count)
    ]


@SETTINGS
@given(entries=dir_entries())
def test_hostile_folders(entries: list[tuple[str, str, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp)
        secret = top / "host" / "secret"
        secret.parent.mkdir()
        secret.write_bytes(SECRET)
        root = top / "outbox"
        root.mkdir()
        expected: dict[str, bytes] = {}
        hostile: list[str] = []
        for name, kind, data in entries:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            shown = name
            if kind == "file":
                path.write_bytes(data)
                if len(data) <= LIMITS.max_file_size:
                    expected[name] = data
                else:
                    hostile.append(shown)
                continue
            if kind == "symlink":
                os.symlink(secret, path)
            elif kind == "hardlink":
                os.link(secret, path)
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "badname":
                raw = os.fsencode(path) + b"\xfe"
                with open(raw, "wb") as handle:
                    handle.write(SECRET)
                shown = name + "\\xfe"
            elif kind == "ctlname":
                (root / (name + "\x1b")).write_bytes(SECRET)
                shown = name + "\\x1b"
            else:
                (path / ".git").mkdir(parents=True)
                (path / ".git" / "config").write_bytes(SECRET)
                shown = name + "/.git"
            hostile.append(shown)
        before = snapshot(top)
        collected = collect_dir(root, limits=LIMITS, tmp_dir=top)
        check_accepted(collected, expected)
        assert sorted(r.path for r in collected.rejected) == sorted(hostile)
        assert SECRET not in every_byte_under(collected.blob_dir)
        assert snapshot(top, skip=collected.blob_dir) == before
        collected.cleanup()


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["a", "B", "0", ".", "..", "/", "-", "_", "~", " ", "git", ".git", "\x1b", "é"]
        ),
        max_size=12,
    ).map("".join)
)
def test_the_fast_path_for_plain_names_agrees_with_every_rule(raw: str) -> None:
    def outcome(check: Callable[[str], str]) -> str:
        try:
            return check(raw)
        except UnsafeName as exc:
            return f"refused: {exc}"

    assert outcome(safe_path) == outcome(checked_path)
