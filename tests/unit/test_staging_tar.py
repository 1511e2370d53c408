"""collect_tar on hostile streams: every bad entry is refused with its reason, the rest kept."""

from __future__ import annotations

import io
import os
import tarfile
import time
import tracemalloc
from pathlib import Path

import pytest

from orchestrator.config.models import OutboxLimits
from orchestrator.staging import STREAM, Collected, collect_tar
from orchestrator.staging.tarstream import META_MAX, stream_budget
from tests.unit.test_staging_support import (
    END,
    LIMITS,
    SPARSE_APPARENT,
    blob_names,
    gnu_longname,
    gnu_sparse,
    header,
    member,
    pad,
    pax,
    pax_sparse,
    sha,
    snapshot,
    tar_of,
    tarfile_member,
)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    folder = tmp_path / "scratch"
    folder.mkdir()
    return folder


def collect(
    raw: bytes, scratch: Path, limits: OutboxLimits = LIMITS, **options: object
) -> Collected:
    return collect_tar(io.BytesIO(raw), limits=limits, tmp_dir=scratch, **options)  # type: ignore[arg-type]


def reasons(collected: Collected) -> dict[str, str]:
    return {r.path: r.reason for r in collected.rejected}


def test_regular_files_are_kept_byte_for_byte_and_only_blobs_are_written(
    tmp_path: Path, scratch: Path
) -> None:
    files = {
        "./a.md": b"hello\n",
        "./d/e/b.json": b"{}",
        "./empty.txt": b"",
        "./same.md": b"hello\n",
    }
    raw = tar_of(list(files.items()))
    before = snapshot(tmp_path)
    collected = collect(raw, scratch)
    assert not collected.rejected and not collected.truncated
    assert [f.path for f in collected.files] == ["a.md", "d/e/b.json", "empty.txt", "same.md"]
    for item in collected.files:
        content = files["./" + item.path]
        assert item.sha256 == sha(content) and item.size == len(content)
        assert item.blob is not None and item.blob.read_bytes() == content
        assert item.operation == "create" and item.mode == 0o644
    assert blob_names(collected.blob_dir) == {sha(b"hello\n"), sha(b"{}"), sha(b"")}
    assert collected.blob_dir.parent == scratch
    assert snapshot(tmp_path, skip=collected.blob_dir) == before
    collected.cleanup()
    assert snapshot(tmp_path) == before


def test_modes_keep_only_the_execute_bit(scratch: Path) -> None:
    raw = (
        member(b"run.sh", b"#!/bin/sh\n", mode=0o6755)
        + member(b"sticky.md", b"x", mode=0o1600)
        + END
    )
    collected = collect(raw, scratch)
    assert {f.path: f.mode for f in collected.files} == {"run.sh": 0o755, "sticky.md": 0o644}


@pytest.mark.parametrize(
    ("kind", "linkname", "reason"),
    [
        (b"2", b"/etc/passwd", "symbolic link to '/etc/passwd'"),
        (b"1", b"a.md", "hard link to 'a.md'"),
        (b"6", b"", "FIFO"),
        (b"3", b"", "character device"),
        (b"4", b"", "block device"),
        (b"V", b"", "unsupported entry type"),
        (b"Z", b"", "unsupported entry type"),
    ],
)
def test_non_regular_entries_are_rejected_and_the_rest_kept(
    scratch: Path, kind: bytes, linkname: bytes, reason: str
) -> None:
    raw = (
        member(b"a.md", b"first")
        + header(b"odd", kind=kind, linkname=linkname)
        + member(b"b.md", b"second")
        + END
    )
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["a.md", "b.md"]
    assert reason in reasons(collected)["odd"]
    assert not collected.truncated


def test_sparse_members_are_rejected(scratch: Path) -> None:
    out = io.BytesIO()
    info = tarfile.TarInfo("holes")
    info.type = tarfile.GNUTYPE_SPARSE
    raw = info.tobuf(tarfile.GNU_FORMAT) + member(b"ok.md", b"ok") + END
    out.write(raw)
    collected = collect(out.getvalue(), scratch)
    assert "sparse" in reasons(collected)["holes"]
    assert [f.path for f in collected.files] == ["ok.md"]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (b"../escape.md", "'..' component"),
        (b"a/../../escape.md", "'..' component"),
        (b"/etc/cron.d/x", "absolute name"),
        (b".git/config", "'.git' component"),
        (b"sub/.GIT/hooks/pre-commit", "'.git' component"),
        (b".git./hooks/x", "'.git' component"),
        (b".git /x", "'.git' component"),
        (b"GIT~1/config", "'.git' component"),
        (".g\u200cit/config".encode(), "invisible"),
        (b"bad\xff\xfe.md", "not valid UTF-8"),
        (b"clear\x1b[2J.md", "control characters"),
        (b"cr\rname.md", "control characters"),
        ("evil\u202egnp.md".encode(), "bidirectional"),
        (b"x" * 99, None),
    ],
)
def test_unsafe_names_are_rejected(scratch: Path, name: bytes, reason: str | None) -> None:
    raw = member(name, b"payload") + member(b"fine.md", b"fine") + END
    collected = collect(raw, scratch)
    if reason is None:
        assert len(collected.files) == 2
        return
    assert [f.path for f in collected.files] == ["fine.md"]
    [rejection] = collected.rejected
    assert reason in rejection.reason
    assert rejection.path.isprintable() and "\x1b" not in rejection.path


def test_non_utf8_names_through_pax_and_gnu_headers_are_rejected(scratch: Path) -> None:
    raw = (
        pax({b"hdrcharset": b"BINARY", b"path": b"pax\xff.md"})
        + member(b"placeholder1", b"p")
        + gnu_longname(b"long/" + b"n" * 120 + b"\xc3\x28.md")
        + member(b"placeholder2", b"g")
        + pax({b"path": b"nul\x00inside.md"})
        + member(b"placeholder3", b"n")
        + tarfile_member("gnu\udcff.md", b"via tarfile")
        + tarfile_member("pax\udcfe.md", b"via tarfile", fmt=tarfile.PAX_FORMAT)
        + member(b"fine.md", b"fine")
        + END
    )
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["fine.md"]
    texts = [r.reason for r in collected.rejected]
    assert texts.count("name is not valid UTF-8") == 4
    assert "name contains a NUL byte" in texts
    assert all(r.path.isprintable() for r in collected.rejected)
    assert any("\\xff" in r.path for r in collected.rejected)


def test_pax_path_overrides_are_checked_too(scratch: Path) -> None:
    raw = pax({b"path": b"../../etc/passwd"}) + member(b"harmless.md", b"root::0:0") + END
    collected = collect(raw, scratch)
    assert not collected.files
    assert "'..' component" in collected.rejected[0].reason


def test_duplicates_are_all_rejected_and_file_folder_clashes_too(scratch: Path) -> None:
    raw = (
        member(b"twice.md", b"one")
        + member(b"keep.md", b"keep")
        + member(b"./twice.md", b"two")
        + member(b"twice.md", b"three")
        + member(b"f", b"file")
        + member(b"f/under.md", b"x")
        + member(b"d/in.md", b"y")
        + member(b"d", b"file over folder")
        + header(b"keep.md/", kind=b"5")
        + END
    )
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["d/in.md", "f", "keep.md"]
    found = [(r.path, r.reason) for r in collected.rejected]
    assert sum("duplicate" in reason for _, reason in found) == 3
    assert ("f/under.md", "its folder 'f' is a file") in found
    assert ("d", "this name is both a file and a folder") in found
    assert ("keep.md", "this name is both a file and a folder") in found  # tarfile drops the /
    assert blob_names(collected.blob_dir) == {sha(b"file"), sha(b"y"), sha(b"keep")}


def test_folders_are_accepted_silently_unless_their_name_is_unsafe(scratch: Path) -> None:
    raw = (
        header(b"./", kind=b"5")
        + header(b"./docs/", kind=b"5")
        + header(b"./.git/", kind=b"5")
        + member(b"./docs/a.md", b"a")
        + END
    )
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["docs/a.md"]
    assert list(reasons(collected)) == [".git"]  # shown without the leading ./


def test_entry_count_is_capped_and_reading_stops(scratch: Path) -> None:
    limits = OutboxLimits(size=1 << 20, max_files=3, max_file_size=1 << 10)
    raw = b"".join(member(f"f{n}.md".encode(), b"x%d" % n) for n in range(6)) + END
    collected = collect(raw, scratch, limits)
    assert [f.path for f in collected.files] == ["f0.md", "f1.md", "f2.md"]
    assert collected.truncated
    assert [r.path for r in collected.rejected] == ["f3.md"]
    assert "more than 3 entries" in collected.rejected[0].reason


def test_folder_count_is_capped_for_an_endless_stream_of_folders(scratch: Path) -> None:
    class Endless(io.RawIOBase):
        def __init__(self) -> None:
            self.n = 0
            self.buf = b""

        def readable(self) -> bool:
            return True

        def readinto(self, target) -> int:  # type: ignore[no-untyped-def]
            while len(self.buf) < len(target):
                self.n += 1
                self.buf += header(b"d%d/" % self.n, kind=b"5")
            size = len(target)
            target[:size] = self.buf[:size]
            self.buf = self.buf[size:]
            return size

    limits = OutboxLimits(size=1 << 20, max_files=50, max_file_size=1 << 10)
    started = time.monotonic()
    collected = collect_tar(Endless(), limits=limits, tmp_dir=scratch)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    assert collected.truncated and "more than 50 folders" in collected.rejected[-1].reason


def test_per_file_and_total_caps_refuse_files_but_collection_goes_on(scratch: Path) -> None:
    limits = OutboxLimits(size=3000, max_files=100, max_file_size=1500)
    raw = (
        member(b"big.bin", b"b" * 1501)
        + member(b"one.md", b"1" * 1400)
        + member(b"two.md", b"2" * 1400)
        + member(b"three.md", b"3" * 1400)
        + member(b"small.md", b"s" * 10)
        + END
    )
    collected = collect(raw, scratch, limits)
    assert [f.path for f in collected.files] == ["one.md", "small.md", "two.md"]
    found = reasons(collected)
    assert "per-file cap of 1500" in found["big.bin"]
    assert "total over the cap of 3000" in found["three.md"]
    assert collected.total_size <= 3000 and not collected.truncated
    assert blob_names(collected.blob_dir) == {sha(b"1" * 1400), sha(b"2" * 1400), sha(b"s" * 10)}


def test_suffix_allowlist(scratch: Path) -> None:
    raw = member(b"a.md", b"a") + member(b"b.json", b"{}") + member(b"c.sh", b"x") + END
    collected = collect(raw, scratch, suffixes=[".md", ".json"])
    assert [f.path for f in collected.files] == ["a.md", "b.json"]
    assert "suffix not allowed" in reasons(collected)["c.sh"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [10 << 30, 2**80])
def test_a_huge_claimed_size_costs_nothing(scratch: Path, size: int) -> None:
    raw = member(b"ok.md", b"ok") + header(b"huge.bin", size=size) + b"x" * 5000
    tracemalloc.start()
    started = time.monotonic()
    try:
        collected = collect(raw, scratch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 5
    assert peak < 16 << 20
    assert [f.path for f in collected.files] == ["ok.md"]
    assert "huge.bin" in reasons(collected) and collected.truncated
    assert blob_names(collected.blob_dir) == {sha(b"ok")}


def test_a_short_body_is_a_truncation_and_earlier_files_are_kept(scratch: Path) -> None:
    raw = member(b"whole.md", b"w" * 700) + header(b"cut.md", size=4000) + b"c" * 1000
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["whole.md"]
    assert collected.truncated
    assert "stream broke inside this file" in reasons(collected)["cut.md"]
    assert blob_names(collected.blob_dir) == {sha(b"w" * 700)}


@pytest.mark.parametrize(
    "tail",
    [
        b"",  # no end-of-archive blocks at all
        header(b"next.md", size=10)[:300],  # a header cut in the middle
        b"\x01" * 512,  # a block that is not a header
        header(b"over.md", size=64 << 10 + 5) + b"x" * 100,  # skipping runs off the end
    ],
)
def test_a_stream_that_breaks_between_members_keeps_what_was_read(
    scratch: Path, tail: bytes
) -> None:
    raw = member(b"a.md", b"a" * 600) + member(b"b.md", b"b") + tail
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["a.md", "b.md"]
    assert collected.truncated
    assert any(r.path == STREAM or r.path == "over.md" for r in collected.rejected)


@pytest.mark.parametrize("raw", [b"", b"not a tar archive at all" * 40, b"\0" * 100])
def test_garbage_is_reported_not_raised(scratch: Path, raw: bytes) -> None:
    collected = collect(raw, scratch)
    assert not collected.files and collected.truncated
    assert collected.rejected[0].path == STREAM


def test_an_empty_archive_is_clean(scratch: Path) -> None:
    collected = collect(END, scratch)
    assert not collected.files and not collected.rejected and not collected.truncated


def test_oversized_meta_headers_stop_reading_before_they_are_buffered(scratch: Path) -> None:
    body = b"x" * (META_MAX + 1)
    raw = (
        member(b"a.md", b"a")
        + header(b"./PaxHeaders/x", size=len(body), kind=b"x")
        + pad(body)
        + member(b"b.md", b"b")
        + END
    )
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["a.md"]
    assert collected.truncated and "extended header" in collected.rejected[0].reason


def test_skipping_refused_files_cannot_run_past_the_stream_budget(scratch: Path) -> None:
    limits = OutboxLimits(size=1024, max_files=10, max_file_size=1024)
    assert stream_budget(limits) == 2048 + 4096 * 36
    raw = (
        member(b"a.md", b"a")
        + member(b"skip1.bin", b"z" * 60_000)
        + member(b"skip2.bin", b"z" * 60_000)
        + member(b"skip3.bin", b"z" * 60_000)
        + member(b"b.md", b"b")
        + END
    )
    collected = collect(raw, scratch, limits)
    assert [f.path for f in collected.files] == ["a.md"]
    assert collected.truncated
    found = reasons(collected)
    assert "per-file cap" in found["skip1.bin"] and "per-file cap" in found["skip2.bin"]
    assert "more than the stream may hold" in found["skip3.bin"]


def test_reading_stops_at_the_stream_budget_whatever_tarfile_asks_for(scratch: Path) -> None:
    limits = OutboxLimits(size=1024, max_files=10, max_file_size=1024)
    body = b"9 a=b\n" * ((stream_budget(limits) + 10_000) // 6)  # under META_MAX, over budget
    assert len(body) < META_MAX
    raw = member(b"a.md", b"a") + header(b"./PaxHeaders/x", size=len(body), kind=b"x") + pad(body)
    collected = collect(raw + member(b"b.md", b"b") + END, scratch, limits)
    assert [f.path for f in collected.files] == ["a.md"]
    assert collected.truncated and "longer than the outbox" in collected.rejected[0].reason


def test_collect_cleans_its_blob_folder_when_the_host_side_fails(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.staging import CollectionError

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(CollectionError, match="No space left"):
        collect(member(b"a.md", b"a") + END, scratch)
    assert list(scratch.iterdir()) == []


def hostile_tail() -> bytes:
    """What a worker may leave after a sparse file: a report, then entries to refuse."""
    return (
        member(b"./report.md", b"the report")
        + header(b"./link", kind=b"2", linkname=b"/etc/passwd")
        + header(b"./fifo", kind=b"6")
        + header(b"./.git", kind=b"5")
        + member(b"./.git/config", b"[core]")
        + END
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "sparse",
    [gnu_sparse(b"./big"), pax_sparse(b"./big", version="0.1"), pax_sparse(b"./big")],
    ids=["gnu", "pax-0.1", "pax-1.0"],
)
def test_a_huge_sparse_file_is_refused_and_every_later_entry_still_read(
    scratch: Path, sparse: bytes
) -> None:
    tracemalloc.start()
    try:
        collected = collect(sparse + hostile_tail(), scratch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    assert [f.path for f in collected.files] == ["report.md"]
    found = reasons(collected)
    assert f"sparse file ({SPARSE_APPARENT} bytes apparent, " in found["big"]
    assert "symbolic link to '/etc/passwd'" in found["link"]
    assert "FIFO" in found["fifo"]
    assert ".git" in found[".git/config"]
    assert not collected.truncated


def test_a_long_sparse_map_chain_is_skipped_without_being_kept(scratch: Path) -> None:
    raw = gnu_sparse(b"holes", b"h" * 700, chain=2000) + member(b"ok.md", b"ok") + END
    tracemalloc.start()
    try:
        collected = collect(raw, scratch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # tarfile would keep 42,000 map entries
    assert "sparse file" in reasons(collected)["holes"]
    assert [f.path for f in collected.files] == ["ok.md"]
    assert not collected.truncated


def test_a_sparse_map_chain_cut_by_the_end_of_the_stream_names_the_last_entry(
    scratch: Path,
) -> None:
    cut = gnu_sparse(b"holes", chain=3)[: 512 * 3]
    collected = collect(member(b"a.md", b"a") + cut, scratch)
    assert [f.path for f in collected.files] == ["a.md"]
    assert collected.truncated
    assert "entries after 'a.md' were not read" in reasons(collected)[STREAM]


def test_a_sparse_file_storing_more_than_the_stream_may_hold_stops_reading(
    scratch: Path,
) -> None:
    limits = OutboxLimits(size=1024, max_files=10, max_file_size=1024)
    raw = member(b"a.md", b"a") + gnu_sparse(b"big", b"z" * 200_000) + member(b"b.md", b"b")
    collected = collect(raw + END, scratch, limits)
    assert [f.path for f in collected.files] == ["a.md"]
    assert collected.truncated
    assert (
        "more than the stream may hold; entries after it were not read"
        in (reasons(collected)["big"])
    )


def test_a_broken_stream_says_after_which_entry_nothing_was_read(scratch: Path) -> None:
    raw = member(b"a.md", b"a") + member(b"b.md", b"b") + b"\x01" * 512
    collected = collect(raw, scratch)
    assert [f.path for f in collected.files] == ["a.md", "b.md"]
    assert "entries after 'b.md' were not read" in reasons(collected)[STREAM]


def test_a_size_that_disagrees_with_the_stored_data_is_refused_and_skipped(
    scratch: Path,
) -> None:
    # A global pax header replaces the size of later members after tarfile has used the
    # header's own size to find the next one: the member is refused, reading goes on.
    body = b"11 size=5\n"
    overriding = header(b"./PaxHeaders/g", size=len(body), kind=b"g") + pad(body)
    raw = overriding + member(b"liar.md", b"l" * 600) + member(b"ok.md", b"ok12") + END
    collected = collect(raw, scratch)
    assert "headers disagree" in reasons(collected)["liar.md"]
