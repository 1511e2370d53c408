"""ChangeStore: atomic creation, the status machine, compare-and-set, blobs, conflicts, ids."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.staging import (
    BlobMismatch,
    ChangeMeta,
    ChangeNotFound,
    ChangeSet,
    ChangeStore,
    ChangeTarget,
    Collected,
    InvalidChangeId,
    ManifestError,
    ScanResult,
    StagingError,
    StatusConflict,
    TransitionError,
    collect_tar,
)
from orchestrator.staging import store as store_module
from tests.unit.test_staging_support import END, LIMITS, header, member, sha

REPO = ChangeMeta(worker="writer", trust="untrusted", target=ChangeTarget.repo(), run_id="r1")
ZONE = ChangeMeta(worker="writer", trust="session", target=ChangeTarget.zone("out"), message="m")


def collected(tmp_path: Path, files: dict[bytes, bytes], *, bad: bool = False) -> Collected:
    raw = b"".join(member(name, data) for name, data in files.items())
    if bad:
        raw += header(b"evil", kind=b"2", linkname=b"/etc/shadow")
    return collect_tar(io.BytesIO(raw + END), limits=LIMITS, tmp_dir=tmp_path)


@pytest.fixture
def store(tmp_path: Path) -> ChangeStore:
    return ChangeStore(tmp_path / "sandbox" / "changes")


def make(store: ChangeStore, tmp_path: Path, meta: ChangeMeta = REPO, **files: bytes) -> ChangeSet:
    content = {name.replace("__", "/").encode(): data for name, data in files.items()}
    with collected(tmp_path, content or {b"a.md": b"a"}) as found:
        return store.create(found, meta)


def test_create_writes_a_complete_change_set(store: ChangeStore, tmp_path: Path) -> None:
    with collected(
        tmp_path, {b"a.md": b"alpha", b"d/b.md": b"beta", b"c.md": b"alpha"}, bad=True
    ) as found:
        change = store.create(found, ZONE)
    folder = store.root / change.id
    assert sorted(os.listdir(folder)) == ["blobs", "manifest.json"]
    assert sorted(os.listdir(folder / "blobs")) == sorted({sha(b"alpha"), sha(b"beta")})
    assert all(not os.stat(p).st_mode & 0o222 for p in (folder / "blobs").iterdir())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["id"] == change.id and manifest["status"] == "pending"
    assert manifest["target"] == {"kind": "zone", "name": "out"}
    assert manifest["files"][0] == {
        "path": "a.md",
        "operation": "create",
        "size": 5,
        "sha256": sha(b"alpha"),
        "mode": "0644",
        "base_sha256": None,
    }
    assert manifest["rejected"][0]["path"] == "evil"
    assert manifest["created_at"].endswith("Z") and manifest["history"][0]["status"] == "pending"
    assert store.get(change.id) == change
    assert store.list() == [change]
    assert store.verify_blobs(change.id) == change
    assert store.root.stat().st_mode & 0o777 == 0o700


def test_a_crash_half_way_leaves_no_change_set(
    store: ChangeStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(store, tmp_path)

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("power cut")

    monkeypatch.setattr(store_module, "write_durably", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        make(store, tmp_path)
    assert len(store.list()) == 1
    assert [n for n in os.listdir(store.root) if n.startswith(".tmp-")] == []


def test_a_killed_creator_leaves_only_an_invisible_temp_folder(
    store: ChangeStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = collected(tmp_path, {b"a.md": b"a"})

    def killed(*args: object) -> None:
        raise KeyboardInterrupt  # stands for SIGKILL: nothing after this point runs

    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)
    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        store.create(found, REPO)
    monkeypatch.undo()
    found.cleanup()
    [temp] = [n for n in os.listdir(store.root) if n.startswith(".tmp-")]
    assert store.list() == []
    with pytest.raises(InvalidChangeId):
        store.get(temp)
    os.rename(store.root / temp, store.root / ".tmp-999999999-dead")  # its process is gone
    assert store.clean_stale() == 1
    assert [n for n in os.listdir(store.root) if n.startswith(".tmp-")] == []


def test_ids_are_fresh_and_an_existing_change_set_is_never_overwritten(
    store: ChangeStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = make(store, tmp_path, a=b"first")
    ids = iter([first.id, "0123456789ab"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(ids))
    second = make(store, tmp_path, a=b"second")
    assert second.id == "0123456789ab"
    assert store.get(first.id).files[0].sha256 == sha(b"first")
    assert not hasattr(store, "replace") and not hasattr(store, "update_files")


@pytest.mark.parametrize(
    "bad", ["../etc", "../../x", "/etc/passwd", "0123456789ab/../x", "ABCDEF012345", "", "x" * 12]
)
def test_ids_are_validated_everywhere(store: ChangeStore, tmp_path: Path, bad: str) -> None:
    make(store, tmp_path)
    for call in (
        lambda: store.get(bad),
        lambda: store.set_status(bad, "discarded", reason="x"),
        lambda: store.blob_path(bad, "0" * 64),
        lambda: store.verify_blobs(bad),
        lambda: store.conflicts(bad),
        lambda: store.resolve(bad),
        lambda: store.record_scans(bad, []),
    ):
        with pytest.raises(InvalidChangeId):
            call()
    with pytest.raises(StagingError, match="not a sha256"):
        store.blob_path(store.list()[0].id, "../../manifest.json")


def test_resolve_accepts_unique_prefixes(
    store: ChangeStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = iter(["aaaa11111111", "aaaa22222222"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(ids))
    make(store, tmp_path)
    make(store, tmp_path)
    assert store.resolve("aaaa1") == "aaaa11111111"
    with pytest.raises(InvalidChangeId, match="matches aaaa11111111, aaaa22222222"):
        store.resolve("aaaa")
    with pytest.raises(ChangeNotFound):
        store.resolve("bbbb")
    with pytest.raises(ChangeNotFound):
        store.get("bbbbbbbbbbbb")


ALLOWED = {
    ("pending", "approved"),
    ("pending", "rejected"),
    ("pending", "discarded"),
    ("pending", "committed"),
    ("pending", "applied"),
    ("approved", "committed"),
    ("approved", "applied"),
    ("approved", "rejected"),
    ("approved", "discarded"),
}
STATUSES = ["pending", "approved", "rejected", "discarded", "committed", "applied"]
PATHS = {"pending": [], "approved": ["approved"], "rejected": ["rejected"],
         "discarded": ["discarded"], "committed": ["committed"], "applied": ["applied"]}  # fmt: skip


REACHABLE = [
    pytest.param(start, meta, id=f"{meta.target.kind}-{start}")
    for meta in (REPO, ZONE)
    for start in STATUSES
    if (start, meta.target.kind) not in {("committed", "zone"), ("applied", "repo")}
]


@pytest.mark.parametrize(("start", "meta"), REACHABLE)
def test_the_status_machine(
    store: ChangeStore, tmp_path: Path, start: str, meta: ChangeMeta
) -> None:
    kind = meta.target.kind
    for new in STATUSES:
        change = make(store, tmp_path, meta)
        for step in PATHS[start]:
            change = store.set_status(change.id, step, reason="setup")
        legal = (start, new) in ALLOWED and not (
            (new == "committed" and kind == "zone") or (new == "applied" and kind == "repo")
        )
        if legal:
            moved = store.set_status(change.id, new, reason="because", expect=start)
            assert moved.status == new and store.get(change.id).status == new
            assert moved.history[-1].status == new and moved.history[-1].reason == "because"
        else:
            with pytest.raises(TransitionError):
                store.set_status(change.id, new, reason="no")
            assert store.get(change.id).status == start


def test_compare_and_set_refuses_a_stale_expectation(store: ChangeStore, tmp_path: Path) -> None:
    change = make(store, tmp_path)
    store.set_status(change.id, "approved", reason="ok", expect="pending")
    with pytest.raises(StatusConflict, match="is approved, not pending"):
        store.set_status(change.id, "rejected", reason="late", expect="pending")
    with pytest.raises(TransitionError, match="not a status"):
        store.set_status(change.id, "merged", reason="x")


def _compete(root: str, change_id: str, new: str, barrier, results) -> None:  # type: ignore[no-untyped-def]
    store = ChangeStore(Path(root))
    barrier.wait()
    try:
        store.set_status(change_id, new, reason=f"by {new}", expect="pending")
        results.put(new)
    except StatusConflict:
        results.put("lost")


@pytest.mark.timeout(120)
def test_exactly_one_of_two_competing_processes_wins(store: ChangeStore, tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    for _ in range(4):
        change = make(store, tmp_path)
        barrier, results = context.Barrier(2), context.Queue()
        workers = [
            context.Process(
                target=_compete, args=(str(store.root), change.id, new, barrier, results)
            )
            for new in ("approved", "rejected")
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
        outcome = sorted(results.get(timeout=5) for _ in workers)
        final = store.get(change.id)
        assert outcome.count("lost") == 1 and final.status in outcome
        assert [h.status for h in final.history] == ["pending", final.status]


def test_verify_blobs_detects_tampering(store: ChangeStore, tmp_path: Path) -> None:
    change = make(store, tmp_path, a=b"original", b=b"other")
    blob = store.blob_path(change.id, sha(b"original"))
    os.chmod(blob, 0o644)
    blob.write_bytes(b"tampered")
    with pytest.raises(BlobMismatch, match=r"blob of a no longer matches"):
        store.verify_blobs(change.id)
    blob.unlink()
    os.symlink(store.blob_path(change.id, sha(b"other")), blob)
    with pytest.raises(BlobMismatch, match="cannot be opened"):
        store.verify_blobs(change.id)
    blob.unlink()
    with pytest.raises(BlobMismatch):
        store.verify_blobs(change.id)


def test_a_damaged_or_edited_manifest_is_refused(store: ChangeStore, tmp_path: Path) -> None:
    change = make(store, tmp_path)
    manifest = store.root / change.id / "manifest.json"
    data = json.loads(manifest.read_text())
    os.chmod(manifest, 0o600)
    edits: list[Callable[[dict[str, Any]], object]] = [
        lambda d: d["files"][0].update(path="../../etc/passwd"),
        lambda d: d["files"][0].update(path=".git/hooks/pre-commit"),
        lambda d: d["files"][0].update(mode="4755"),
        lambda d: d["files"][0].update(sha256="zz"),
        lambda d: d.update(status="merged"),
        lambda d: d.update(id="0123456789ab"),
        lambda d: d["target"].update(kind="host"),
    ]
    for edit in edits:
        broken = json.loads(json.dumps(data))
        edit(broken)
        manifest.write_text(json.dumps(broken))
        with pytest.raises(ManifestError):
            store.get(change.id)
    manifest.write_text("{not json")
    with pytest.raises(ManifestError, match="damaged"):
        store.list()


def test_conflicts_are_reported_for_open_change_sets_of_the_same_target(
    store: ChangeStore, tmp_path: Path
) -> None:
    mine = make(store, tmp_path, ZONE, a__b=b"1", c=b"2")
    same = make(store, tmp_path, ZONE, a__b=b"3")
    parent = make(store, tmp_path, ZONE, a=b"file where a folder is")
    closed = make(store, tmp_path, ZONE, c=b"4")
    store.set_status(closed.id, "discarded", reason="x")
    make(store, tmp_path, REPO, c=b"5")  # another target
    make(store, tmp_path, ZONE, z=b"6")  # other paths
    assert sorted(store.conflicts(mine.id)) == sorted([(same.id, ["a/b"]), (parent.id, ["a/b"])])


def test_scans_are_recorded_until_the_change_set_is_final(
    store: ChangeStore, tmp_path: Path
) -> None:
    change = make(store, tmp_path)
    results = [ScanResult("size", True), ScanResult("secrets", False)]
    assert store.record_scans(change.id, results).scans == tuple(results)
    assert store.get(change.id).scans == tuple(results)
    store.set_status(change.id, "rejected", reason="no")
    with pytest.raises(StagingError, match="scans are closed"):
        store.record_scans(change.id, results)


def test_an_empty_store_lists_nothing(store: ChangeStore) -> None:
    assert store.list() == []
    assert not store.root.exists()


def test_create_refuses_a_hand_made_collection_with_unsafe_paths(
    store: ChangeStore, tmp_path: Path
) -> None:
    import dataclasses

    found = collected(tmp_path, {b"a.md": b"a"})
    bad = dataclasses.replace(found.files[0], path="../../etc/cron.d/x")
    forged = dataclasses.replace(found, files=[bad])
    with pytest.raises(StagingError, match="'..' component"):
        store.create(forged, REPO)
    assert store.list() == []
    found.cleanup()
