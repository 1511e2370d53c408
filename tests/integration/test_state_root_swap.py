"""State below the sandbox root is reached through the checked root's descriptor.

Whoever may write the folder above the sandbox root (the project folder's owner, when root
runs in a user's project) can rename the checked root away after the check and put a link
or a folder of their own at its name. The audit log and the change store opened after the
check must go on acting on the folder that was checked: nothing is written into, or read
from, what was swapped in."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project
from orchestrator.runtime.host_folders import open_audit
from orchestrator.runtime.mount_sources import MountSources
from orchestrator.runtime.outbox import change_store
from orchestrator.runtime.session_server import control_dir
from orchestrator.runtime.state_root import StateRootRefused, open_state_root
from orchestrator.staging import ChangeStore
from tests.unit.test_clearance_fakes import stage_real


def swap(root: Path, planted: str, decoy: Path) -> Path:
    """Move the checked root away and plant ``planted`` (a link to ``decoy``, or a folder
    of someone else's holding a forged store) at its name; returns the moved folder."""
    moved = root.with_name(root.name + "-checked")
    os.rename(root, moved)
    if planted == "link":
        root.symlink_to(decoy)
    else:
        os.mkdir(root, 0o777)  # a fresh folder, as another user would make it
        os.symlink(decoy, root / "changes")
    return moved


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_a_name_swapped_after_the_check_redirects_no_write_or_read(project, tmp_path, planted):
    loaded = load_project(project.root)
    root = loaded.sandbox_root
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    audit = open_audit(loaded)
    store = change_store(loaded)
    before = stage_real(store, tmp_path / "work", new={"a.md": b"checked\n"})
    audit.record("test.before")

    moved = swap(root, planted, decoy)
    forged = ChangeStore(decoy)  # the same id, forged content, in the swapped-in place
    stage_real(forged, tmp_path / "forged", new={"a.md": b"forged\n"})
    os.rename(decoy / next(p for p in os.listdir(decoy) if len(p) == 12), decoy / before)

    audit.record("test.after")
    after = stage_real(store, tmp_path / "work", new={"b.md": b"after\n"})
    assert [f.path for f in store.get(before).files] == ["a.md"]
    with store.open_blob(before, store.get(before).files[0].sha256) as blob:
        assert blob.read() == b"checked\n"
    store.set_status(after, "rejected", reason="test")
    assert sorted(os.listdir(moved / "changes")) == sorted([".lock", before, after])
    assert sorted(os.listdir(decoy)) == sorted([".lock", before])  # only the forger's
    assert not (decoy / "audit.jsonl").exists()
    ops = [e.operation for e in AuditLog(moved / "audit.jsonl").query(AuditFilter())]
    assert ops == ["test.before", "test.after"]
    assert [e.operation for e in audit.query(AuditFilter(operation="test.*"))] == ops
    assert audit.verify().ok
    audit.close()
    # A later check sees the swap, and refuses it.
    with pytest.raises(StateRootRefused), control_dir(loaded, create=True):
        pass
    assert not (decoy / "control").exists()


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_a_mount_source_in_the_sandbox_root_is_held_from_the_checked_root(
    project, tmp_path, planted
):
    """A run's mount sources inside the sandbox root (session, workspace and run folders)
    are opened from the checked root's descriptor: after a swap of the root's name the
    engine is given (as root) a pin of the checked folder, and the run sees the swap."""
    loaded = load_project(project.root)
    root = loaded.sandbox_root
    session = root / "sessions" / "s1"
    session.mkdir(parents=True)
    (session / "marker").write_text("checked\n")
    decoy = tmp_path / "decoy"
    (decoy / "sessions" / "s1").mkdir(parents=True)
    (decoy / "sessions" / "s1" / "marker").write_text("decoy\n")
    fd = open_state_root(loaded)
    moved = root.with_name(root.name + "-checked")
    os.rename(root, moved)
    if planted == "link":
        root.symlink_to(decoy)
    else:
        os.rename(decoy, root)
    sources = MountSources(f"swap-{uuid.uuid4().hex[:8]}", pin=os.geteuid() == 0)
    try:
        sources.hold([(str(session), True)], beneath=(root, fd))
        if os.geteuid() == 0:  # the engine would mount the pin: the checked folder
            assert Path(sources.source(str(session)), "marker").read_text() == "checked\n"
        [problem] = sources.changed()  # and the run stops: its path leads elsewhere now
        assert str(session) in problem
    finally:
        sources.release()
        os.close(fd)
