"""``gc`` of run folders (``runs/<id>/``): a dead owner's folder goes (audited), a live
owner's stays, as do a folder whose access record still lists changes, one whose owner is
not recorded, and a mount point; links are never followed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.audit import AuditLog
from orchestrator.runtime import run_folders
from orchestrator.runtime.access_record import RECORD


def dead_owner() -> dict[str, str]:
    """The labels of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    me = labels.current_owner()
    return {**labels.Owner(child.pid, "1", me.pid_ns).labels(), labels.RUN_ID: "x"}


def run_folder(root: Path, name: str, owner: dict[str, str] | None) -> Path:
    folder = root / "runs" / name
    (folder / "inputs").mkdir(parents=True)
    (folder / "inputs" / "copy.txt").write_text("an input's copy")
    if owner is not None:
        (folder / run_folders.OWNER_FILE).write_text(json.dumps(owner))
    return folder


def test_claim_records_this_process_and_the_run(tmp_path):
    folder = tmp_path / "runs" / "r1"
    run_folders.claim(folder, {labels.RUN_ID: "r1", labels.WORKER: "w"})
    assert (folder.stat().st_mode & 0o777, (folder.parent.stat().st_mode & 0o777)) == (0o700,) * 2
    owner = json.loads((folder / run_folders.OWNER_FILE).read_text())
    assert owner[labels.RUN_ID] == "r1" and owner[labels.WORKER] == "w"
    assert labels.owner_state(owner) == "alive"
    assert sorted(os.listdir(folder)) == [run_folders.OWNER_FILE]


def test_a_dead_owners_folder_goes_and_is_audited_a_live_ones_stays(tmp_path):
    dead = run_folder(tmp_path, "dead", dead_owner())
    live = run_folder(tmp_path, "live", {**labels.current_owner().labels()})
    audit = AuditLog(tmp_path / "audit.jsonl")
    done = run_folders.sweep(tmp_path, audit=audit)
    assert (done.removed, done.left, done.in_use) == (["dead"], [], 1)
    assert not dead.exists() and (live / "inputs" / "copy.txt").exists()
    (entry,) = [e for e in audit.query() if e.operation == "gc.run_folder_removed"]
    assert entry.run_id == "dead" and entry.path == str(dead)


def test_what_is_left_and_why(tmp_path):
    record = run_folder(tmp_path, "record", dead_owner())
    (record / RECORD).write_text(json.dumps({"process": dead_owner()}))
    unknown = run_folder(tmp_path, "unknown", None)
    foreign = run_folder(tmp_path, "foreign", {**dead_owner(), labels.OWNER_NS: "pid:[1]"})
    (tmp_path / "runs" / "file").write_text("not a folder")
    done = run_folders.sweep(tmp_path)
    left = dict(done.left)
    assert done.removed == []
    assert "access" in left["record"] and (record / RECORD).exists()
    assert left["unknown"] == "no owner recorded" and unknown.exists()
    assert "another pid namespace" in left["foreign"] and foreign.exists()
    assert left["file"] == "not a folder"
    assert run_folders.sweep(tmp_path, everything=True).removed == ["foreign"]


def test_the_access_records_owner_counts_when_there_is_no_owner_file(tmp_path):
    folder = run_folder(tmp_path, "r", None)
    (folder / RECORD).write_text(json.dumps({"process": labels.current_owner().labels()}))
    assert run_folders.sweep(tmp_path).in_use == 1 and folder.exists()


def test_links_are_removed_never_followed(tmp_path):
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep.txt").write_text("keep")
    folder = run_folder(tmp_path, "dead", dead_owner())
    (folder / "inputs" / "to-folder").symlink_to(outside)
    (folder / "inputs" / "to-file").symlink_to(outside / "sub" / "keep.txt")
    (tmp_path / "runs" / "linked").symlink_to(outside)  # a run folder that is a link
    done = run_folders.sweep(tmp_path)
    assert done.removed == ["dead"] and dict(done.left) == {"linked": "not a folder"}
    assert (outside / "sub" / "keep.txt").read_text() == "keep"


def test_a_mount_point_is_never_entered(tmp_path, monkeypatch):
    mounted = run_folder(tmp_path, "mounted", dead_owner())
    inner = run_folder(tmp_path, "inner", dead_owner())
    where = os.path.realpath(tmp_path / "runs")
    monkeypatch.setattr(
        run_folders, "mount_points", lambda: {f"{where}/mounted", f"{where}/inner/inputs"}
    )
    done = run_folders.sweep(tmp_path)
    assert done.removed == []
    left = dict(done.left)
    assert left["mounted"] == f"a mount point, not entered: {where}/mounted"
    assert left["inner"] == f"a mount point, not entered: {where}/inner/inputs"
    assert (mounted / "inputs" / "copy.txt").exists() and (inner / "inputs" / "copy.txt").exists()


def test_a_real_mount_of_another_device_is_never_entered(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount")
    folder = run_folder(tmp_path, "dead", dead_owner())
    target = folder / "inputs"
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (target / "on-the-mount.txt").write_text("not ours")
        done = run_folders.sweep(tmp_path)
        assert done.removed == [] and "a mount point" in dict(done.left)["dead"]
        assert (target / "on-the-mount.txt").read_text() == "not ours"
        # the device check alone, as if the mount table did not list it:
        found: list[str] = []
        top = os.open(tmp_path / "runs", os.O_RDONLY | os.O_DIRECTORY)
        try:
            device = os.fstat(top).st_dev
            run_folders._remove(top, "dead", str(folder), device, set(), found)
        finally:
            os.close(top)
        assert found == [str(target)] and (target / "on-the-mount.txt").exists()
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_nothing_to_sweep(tmp_path):
    assert run_folders.sweep(tmp_path) == run_folders.FolderSweep()
    (tmp_path / "runs").symlink_to(tmp_path)
    assert run_folders.sweep(tmp_path) == run_folders.FolderSweep()
