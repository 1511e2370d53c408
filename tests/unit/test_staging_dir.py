"""collect_dir on real trees: links, FIFOs, sparse files and odd names, never followed."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from orchestrator.config.models import OutboxLimits
from orchestrator.hostfs.paths import open_beneath
from orchestrator.staging import (
    ChangeMeta,
    ChangeStore,
    ChangeTarget,
    Collected,
    CollectionError,
    collect_dir,
)
from orchestrator.staging.blobs import CHUNK, BlobSink
from tests.unit.test_staging_support import LIMITS, blob_names, every_byte_under, sha, snapshot

SECRET = b"host-secret-7f3a9c: do not leak"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "outbox"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_bytes(b"alpha\n")
    (root / "b.json").write_bytes(b"{}")
    return root


@pytest.fixture
def host_secret(tmp_path: Path) -> Path:
    path = tmp_path / "host" / "credentials"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def collect(
    root: Path, tmp_path: Path, limits: OutboxLimits = LIMITS, **options: object
) -> Collected:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return collect_dir(root, limits=limits, tmp_dir=scratch, **options)  # type: ignore[arg-type]


def reasons(collected: Collected) -> dict[str, str]:
    return {r.path: r.reason for r in collected.rejected}


def test_plain_files_are_collected_with_modes(tree: Path, tmp_path: Path) -> None:
    (tree / "run.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(tree / "run.sh", 0o4755)
    collected = collect(tree, tmp_path)
    assert [(f.path, f.operation, f.mode) for f in collected.files] == [
        ("b.json", "create", 0o644),
        ("docs/a.md", "create", 0o644),
        ("run.sh", "create", 0o755),
    ]
    for item in collected.files:
        assert item.blob is not None and item.blob.read_bytes() == (tree / item.path).read_bytes()
        assert item.sha256 == sha((tree / item.path).read_bytes())


def test_links_to_host_files_never_leak_them(tree: Path, tmp_path: Path, host_secret: Path) -> None:
    os.symlink(host_secret, tree / "link.md")
    os.symlink(host_secret.parent, tree / "linkdir")
    os.symlink("../../host/credentials", tree / "docs" / "relative.md")
    os.link(host_secret, tree / "hard.md")
    store = ChangeStore(tmp_path / "changes")
    before = snapshot(tmp_path / "host")
    collected = collect(tree, tmp_path)
    found = reasons(collected)
    assert found["link.md"].startswith("symbolic link")
    assert found["linkdir"].startswith("symbolic link")
    assert found["docs/relative.md"].startswith("symbolic link")
    assert found["hard.md"].startswith("hard link (2 names")
    meta = ChangeMeta(worker="w", trust="untrusted", target=ChangeTarget.repo())
    store.create(collected, meta)
    assert SECRET not in every_byte_under(collected.blob_dir)
    assert SECRET not in every_byte_under(store.root)
    assert snapshot(tmp_path / "host") == before


def test_hard_links_inside_the_folder_are_refused_too(tree: Path, tmp_path: Path) -> None:
    os.link(tree / "b.json", tree / "c.json")
    collected = collect(tree, tmp_path)
    assert [f.path for f in collected.files] == ["docs/a.md"]
    assert set(reasons(collected)) == {"b.json", "c.json"}


@pytest.mark.timeout(20)
def test_fifos_and_sockets_are_never_opened(tree: Path, tmp_path: Path) -> None:
    os.mkfifo(tree / "pipe.md")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tree / "sock"))
    result: list[Collected] = []
    worker = threading.Thread(target=lambda: result.append(collect(tree, tmp_path)), daemon=True)
    worker.start()
    worker.join(10)
    server.close()
    assert not worker.is_alive(), "collect_dir blocked on a FIFO"
    [collected] = result
    found = reasons(collected)
    assert found["pipe.md"].startswith("FIFO")
    assert found["sock"].startswith("socket")


@pytest.mark.skipif(os.getuid() != 0, reason="making device nodes needs root")
def test_device_nodes_are_refused_without_being_opened(tree: Path, tmp_path: Path) -> None:
    os.mknod(tree / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    collected = collect(tree, tmp_path)
    assert reasons(collected)["null"].startswith("character device")


@pytest.mark.timeout(30)
def test_a_10gb_sparse_file_is_refused_quickly_without_filling_the_disk(
    tree: Path, tmp_path: Path
) -> None:
    with open(tree / "huge.bin", "wb") as handle:
        handle.truncate(10 << 30)
    limits = OutboxLimits(size=1 << 20, max_files=100, max_file_size=4096)
    started = time.monotonic()
    collected = collect(tree, tmp_path, limits)
    assert time.monotonic() - started < 5
    assert "per-file cap of 4096" in reasons(collected)["huge.bin"]
    used = sum(os.lstat(e.path).st_size for e in os.scandir(collected.blob_dir))
    assert used <= 4096 + CHUNK
    assert [f.path for f in collected.files] == ["b.json", "docs/a.md"]


def test_the_read_cap_holds_even_when_the_size_lies() -> None:
    """A file growing after lstat: at most cap + 1 bytes are read, nothing is kept."""
    sink = BlobSink()
    taken = 0

    def endless(view: memoryview) -> int:
        nonlocal taken
        taken += len(view)
        view[:] = b"z" * len(view)
        return len(view)

    try:
        assert sink.write(endless, 10_000) is None
        assert taken == 10_001
        assert blob_names(sink.folder) == set()
    finally:
        sink.discard()


def test_odd_names_and_git_metadata_are_refused(tree: Path, tmp_path: Path) -> None:
    (tree / ".git" / "hooks").mkdir(parents=True)
    (tree / ".git" / "hooks" / "post-checkout").write_bytes(b"#!/bin/sh\nevil\n")
    (tree / "sub" / ".Git").mkdir(parents=True)
    (tree / "sub" / ".Git" / "config").write_bytes(b"[core]\n")
    fd = os.open(os.fsencode(tree) + b"/bad\xff.md", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)
    (tree / "esc\x1b[31m.md").write_bytes(b"x")
    collected = collect(tree, tmp_path)
    found = reasons(collected)
    assert "'.git' component" in found[".git"]
    assert "'.git' component" in found["sub/.Git"]
    assert found["bad\\xff.md"] == "name is not valid UTF-8"
    assert found["esc\\x1b[31m.md"] == "name contains control characters"
    assert [f.path for f in collected.files] == ["b.json", "docs/a.md"]
    assert b"evil" not in every_byte_under(collected.blob_dir)


def test_too_many_files_stops_the_walk(tree: Path, tmp_path: Path) -> None:
    for n in range(10):
        (tree / f"f{n}.md").write_bytes(b"%d" % n)
    limits = OutboxLimits(size=1 << 20, max_files=5, max_file_size=1024)
    collected = collect(tree, tmp_path, limits)
    assert len(collected.files) == 5 and collected.truncated
    assert "more than 5 entries" in collected.rejected[-1].reason


def test_the_total_cap_refuses_what_would_go_over_it(tree: Path, tmp_path: Path) -> None:
    for n in range(4):
        (tree / f"big{n}.bin").write_bytes(bytes([n]) * 1000)
    limits = OutboxLimits(size=2500, max_files=100, max_file_size=2000)
    collected = collect(tree, tmp_path, limits)
    assert collected.total_size <= 2500
    assert sum("total over the cap" in r.reason for r in collected.rejected) == 2


def test_suffix_allowlist(tree: Path, tmp_path: Path) -> None:
    collected = collect(tree, tmp_path, suffixes=[".md"])
    assert [f.path for f in collected.files] == ["docs/a.md"]
    assert "suffix not allowed" in reasons(collected)["b.json"]


def test_changes_against_a_base(tmp_path: Path) -> None:
    base, root = tmp_path / "base", tmp_path / "copy"
    for folder in (base, root):
        (folder / "keep").mkdir(parents=True)
        (folder / "same.md").write_bytes(b"same")
        (folder / "keep" / "k.md").write_bytes(b"k")
    (base / "changed.md").write_bytes(b"old")
    (root / "changed.md").write_bytes(b"new")
    (base / "gone.md").write_bytes(b"bye")
    (base / "script.sh").write_bytes(b"echo")
    (root / "script.sh").write_bytes(b"echo")
    os.chmod(root / "script.sh", 0o755)
    (root / "new.md").write_bytes(b"hello")
    (base / "was-file").write_bytes(b"file")
    (root / "was-file").mkdir()
    (root / "was-file" / "now.md").write_bytes(b"inside")
    collected = collect(root, tmp_path, base=base)
    assert {(f.path, f.operation) for f in collected.files} == {
        ("changed.md", "update"),
        ("gone.md", "delete"),
        ("new.md", "create"),
        ("script.sh", "update"),
        ("was-file", "delete"),
        ("was-file/now.md", "create"),
    }
    files = {f.path: f for f in collected.files}
    assert files["changed.md"].base_sha256 == sha(b"old")
    assert files["gone.md"].base_sha256 == sha(b"bye") and files["gone.md"].blob is None
    assert files["new.md"].base_sha256 is None
    assert collected.unchanged == 2
    assert blob_names(collected.blob_dir) == {
        sha(b"new"),
        sha(b"echo"),
        sha(b"hello"),
        sha(b"inside"),
    }


def test_refused_entries_never_turn_into_deletions(tmp_path: Path, host_secret: Path) -> None:
    base, root = tmp_path / "base", tmp_path / "copy"
    for folder in (base, root):
        folder.mkdir()
    (base / "doc.md").write_bytes(b"doc")
    (base / "dir").mkdir()
    (base / "dir" / "inner.md").write_bytes(b"inner")
    os.symlink(host_secret, root / "doc.md")
    os.symlink(host_secret.parent, root / "dir")
    collected = collect(root, tmp_path, base=base)
    assert collected.files == []
    assert set(reasons(collected)) == {"doc.md", "dir"}


def test_no_deletions_when_the_walk_stopped_early(tmp_path: Path) -> None:
    base, root = tmp_path / "base", tmp_path / "copy"
    base.mkdir()
    root.mkdir()
    (base / "zzz.md").write_bytes(b"z")
    for n in range(5):
        (root / f"f{n}.md").write_bytes(b"%d" % n)
    limits = OutboxLimits(size=1 << 20, max_files=3, max_file_size=1024)
    collected = collect(root, tmp_path, limits, base=base)
    assert collected.truncated
    assert all(f.operation == "create" for f in collected.files)


def test_the_root_must_be_a_real_folder(tree: Path, tmp_path: Path) -> None:
    os.symlink(tree, tmp_path / "alias")
    with pytest.raises(CollectionError, match="not a symbolic link"):
        collect(tmp_path / "alias", tmp_path)
    with pytest.raises(CollectionError, match="existing folder"):
        collect(tmp_path / "missing", tmp_path)
    assert list((tmp_path / "scratch").iterdir()) == []


def test_nothing_outside_the_blob_folder_changes(
    tree: Path, tmp_path: Path, host_secret: Path
) -> None:
    os.symlink(host_secret, tree / "link")
    os.mkfifo(tree / "fifo")
    (tmp_path / "scratch").mkdir()
    before = snapshot(tmp_path)
    collected = collect(tree, tmp_path)
    assert snapshot(tmp_path, skip=collected.blob_dir) == before
    collected.cleanup()
    assert snapshot(tmp_path) == before


@pytest.mark.timeout(20)
def test_open_beneath_follows_nothing_and_never_blocks(tree: Path, host_secret: Path) -> None:
    os.symlink(host_secret.parent, tree / "up")
    os.mkfifo(tree / "docs" / "pipe")
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = open_beneath(root, "docs/a.md")
        assert os.read(fd, 100) == b"alpha\n"
        os.close(fd)
        for path in ("up/credentials", "docs/pipe", "docs", "docs/missing.md"):
            with pytest.raises(OSError):  # noqa: PT011 - errno varies by case
                open_beneath(root, path)
    finally:
        os.close(root)
