"""Session folders: removed when a one-off run leaves them empty, pruned by age, never
following a link."""

from __future__ import annotations

import os

import pytest

from orchestrator import labels
from orchestrator.config import load_project, load_worker
from orchestrator.prepare import prepare
from orchestrator.runtime import ManagedObject, execute, open_audit
from orchestrator.runtime.container import ContainerBackend
from orchestrator.runtime.session_folders import (
    parse_duration,
    prune_sessions,
    remove_empty_sessions,
    remove_if_empty,
    sessions_in_use,
)
from tests.unit.fake_engine import FakeEngine

DAY = 86400.0


def run_audited(engine, prepared, **kwargs):
    """execute() with the project's own audit log, and no outbox reader."""
    return execute(
        ContainerBackend(engine),
        prepared,
        audit=open_audit(prepared.project),
        staging=None,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 7 * DAY), ("2w", 14 * DAY),
     ("1d12h", 1.5 * DAY), ("1.5h", 5400), (" 7D ", 7 * DAY)],
)  # fmt: skip
def test_human_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "7 days", "d", "-1d", "1y", "7d!"])
def test_bad_durations_name_the_fix(text):
    with pytest.raises(ValueError, match="e.g. 7d or 12h"):
        parse_duration(text)


def test_remove_if_empty_keeps_anything_that_holds_something_and_links(tmp_path):
    empty, full, target = tmp_path / "empty", tmp_path / "full", tmp_path / "target"
    empty.mkdir()
    full.mkdir()
    (full / ".hidden").write_text("x")
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    assert remove_if_empty(empty) is True and not empty.exists()
    assert remove_if_empty(full) is False and (full / ".hidden").exists()
    assert remove_if_empty(link) is False and link.is_symlink() and target.is_dir()
    assert remove_if_empty(tmp_path / "gone") is False


def _session(root, name, age, now, content=True):
    folder = root / name
    folder.mkdir(parents=True)
    if content:
        (folder / "notes.txt").write_text(name)
    os.utime(folder, (now - age, now - age))
    return folder


def test_prune_removes_only_old_unused_sessions_without_following_links(tmp_path):
    now = 1_800_000_000.0
    root = tmp_path / "sessions"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    old = _session(root, "old", 8 * DAY, now)
    (old / "escape").symlink_to(outside)
    _session(root, "young", 1 * DAY, now)
    _session(root, "busy", 30 * DAY, now)
    (root / "stray-link").symlink_to(outside)
    report = prune_sessions(root, 7 * DAY, {"busy"}, now=now)
    assert [s.session_id for s in report.removed] == ["old"]
    assert report.in_use == ["busy"] and report.kept == 1
    assert [name for name, _ in report.failed] == ["stray-link"]
    assert not old.exists() and (root / "young").is_dir() and (root / "busy").is_dir()
    assert (outside / "precious").read_text() == "keep me"
    assert prune_sessions(tmp_path / "none", DAY, set()).removed == []


def test_sessions_in_use_are_those_of_containers_whose_owner_lives():
    me = labels.current_owner().labels()
    dead = {**me, labels.OWNER_PID: "999999999"}
    engine = FakeEngine(
        managed=[
            ManagedObject("container", "a", "a", {**me, labels.SESSION: "live"}),
            ManagedObject("container", "b", "b", {**dead, labels.SESSION: "dead"}),
            ManagedObject("network", "n", "n", {**me, labels.SESSION: "net"}),
        ]
    )
    assert sessions_in_use(engine) == {"live"}


def test_gc_removes_only_empty_session_folders_of_dead_runs_never_a_path(tmp_path):
    me = labels.current_owner().labels()
    sessions = tmp_path / "sessions"
    for name in ("empty", "full", "shared", "x"):
        (sessions / name).mkdir(parents=True)
    (sessions / "full" / "notes.md").write_text("kept")
    (tmp_path / "outside").mkdir()
    live = ManagedObject("container", "l", "l", {**me, labels.SESSION: "shared"})
    engine = FakeEngine(managed=[live])  # a live run still uses "shared"
    dead = [
        ManagedObject("container", str(n), str(n), {labels.SESSION: name})
        for n, name in enumerate(["empty", "full", "shared", "../outside", "x/..", "..", "gone"])
    ]
    assert remove_empty_sessions(engine, tmp_path, dead) == ["empty"]
    assert sorted(p.name for p in sessions.iterdir()) == ["full", "shared", "x"]
    assert (tmp_path / "outside").is_dir()


def test_a_one_off_run_removes_its_session_folder_when_left_empty(project):
    project.worker("w", 'command: ["true"]\ntrust: session\nsandbox: {}')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    result = run_audited(FakeEngine(), prepared)
    assert result.exit_code == 0
    assert not prepared.paths.session.exists()
    assert prepared.paths.session.parent.is_dir()  # the shared parent stays


def test_a_named_or_filled_session_folder_stays(project):
    project.worker("w", 'command: ["true"]\ntrust: session\nsandbox: {}')
    loaded = load_project(project.root)
    named = prepare(loaded, load_worker(loaded, "w"), session_id="mine")
    run_audited(FakeEngine(), named)
    assert named.paths.session.is_dir()

    class Writing(FakeEngine):
        def start(self, container_id: str) -> None:
            super().start(container_id)
            (filled.paths.session / "result.txt").write_text("kept")

    filled = prepare(loaded, load_worker(loaded, "w"))
    run_audited(Writing(), filled)
    assert (filled.paths.session / "result.txt").read_text() == "kept"
