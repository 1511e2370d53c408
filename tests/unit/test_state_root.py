"""The private folders and files the orchestrator acts on: the record key, the audit log
and the walk that opens them, each tried with what another writer would plant."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.audit import AuditLog
from orchestrator.errors import AuditError
from orchestrator.runtime import state_key
from orchestrator.runtime.state_root import StateRootRefused, open_private


@pytest.fixture
def key_home(tmp_path, monkeypatch) -> Path:
    """The record key's folder in a temporary place (and no key cached from before)."""
    folder = tmp_path / "state"
    monkeypatch.setattr(state_key, "key_folder", lambda: folder)
    state_key._key.cache_clear()
    yield folder
    state_key._key.cache_clear()


def test_the_key_is_made_once_private_and_signs_what_it_verifies(key_home):
    mac = state_key.sign({"a": 1}, "/p/runs/x/access.json")
    info = os.stat(key_home / state_key.KEY_FILE)
    assert (info.st_mode & 0o777, os.stat(key_home).st_mode & 0o777) == (0o600, 0o700)
    assert state_key.signed_by_us({"a": 1}, "/p/runs/x/access.json", mac)
    assert not state_key.signed_by_us({"a": 2}, "/p/runs/x/access.json", mac)
    assert not state_key.signed_by_us({"a": 1}, "/q/runs/x/access.json", mac)  # moved
    assert not state_key.signed_by_us({"a": 1}, "/p/runs/x/access.json", None)


@pytest.mark.parametrize("plant", ["readable", "link", "short"])
def test_a_key_others_could_read_or_planted_is_refused(key_home, tmp_path, plant):
    key_home.mkdir(mode=0o700)
    key = key_home / state_key.KEY_FILE
    if plant == "link":
        (tmp_path / "elsewhere").write_bytes(b"k" * 32)
        key.symlink_to(tmp_path / "elsewhere")
    else:
        key.write_bytes(b"k" * (32 if plant == "readable" else 5))
        os.chmod(key, 0o644 if plant == "readable" else 0o600)
    with pytest.raises(StateRootRefused, match=f"record key {key}"):
        state_key.sign({}, "x")


def test_a_key_folder_others_may_write_is_refused(key_home):
    key_home.mkdir(mode=0o700)
    os.chmod(key_home, 0o777)
    with pytest.raises(StateRootRefused, match="has mode 0777: other users may write it"):
        state_key.sign({}, "x")


def test_the_walk_refuses_a_link_on_the_way_and_makes_the_folder_0700(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(StateRootRefused, match=r"link is a symbolic link \(to "):
        open_private(tmp_path / "link" / "state", "the folder", "fix it")
    assert not (tmp_path / "real" / "state").exists()
    fd, made = open_private(tmp_path / "a" / "state", "the folder", "fix it")
    os.close(fd)
    assert made and (tmp_path / "a" / "state").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("name", ["audit.jsonl", "audit.jsonl.lock"])
def test_the_audit_log_and_its_lock_are_never_followed_through_a_link(tmp_path, name):
    """A link at the log's or the lock's name: refused, the target neither written nor
    created (a missing target included)."""
    folder = tmp_path / "sandbox"
    folder.mkdir()
    target = tmp_path / "target"
    target.write_text("root's file\n")
    (folder / name).symlink_to(target)
    missing = tmp_path / "missing"
    with AuditLog(folder / "audit.jsonl") as log, pytest.raises(AuditError, match="symbolic link"):
        log.record("run.started")
    assert target.read_text() == "root's file\n"
    (folder / name).unlink()
    (folder / name).symlink_to(missing)
    with AuditLog(folder / "audit.jsonl") as log, pytest.raises(AuditError, match="symbolic link"):
        log.record("run.started")
    assert not missing.exists()


def test_the_audit_log_is_never_reached_through_a_linked_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "sandbox").symlink_to(tmp_path / "real")
    with AuditLog(tmp_path / "sandbox" / "audit.jsonl") as log, pytest.raises(AuditError):
        log.record("run.started")
    assert list((tmp_path / "real").iterdir()) == []
