"""State below the sandbox root is reached through the checked root's descriptor.

Whoever may write the folder above the sandbox root (the project folder's owner, when root
runs in a user's project) can rename the checked root away after the check and put a link
or a folder of their own at its name. The audit log and the change store opened after the
check must go on acting on the folder that was checked: nothing is written into, or read
from, what was swapped in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project
from orchestrator.runtime.host_folders import open_audit
from orchestrator.runtime.outbox import change_store
from orchestrator.runtime.session_server import control_dir
from orchestrator.runtime.state_root import StateRootRefused
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
