"""Session folders through the real command line: one-off runs leave no empty folder, and
``gc --sessions-older-than`` prunes old sessions, keeps live ones, and audits removals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

DAY = 86400


def sessions_of(project) -> set[str]:
    folder = project.root / ".sandbox" / "sessions"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


def worker(project, name: str, shell: str) -> None:
    command = json.dumps(["sh", "-c", shell])
    project.worker(name, f"command: {command}\ntrust: session\nsandbox: {{}}")


def backdate(folder, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(folder, (then, then), follow_symlinks=False)


def test_one_off_runs_leave_no_empty_session_folders(engine, project, tmp_path):
    worker(project, "quiet", "true")
    worker(project, "writer", "echo kept > /session/notes.txt")
    worker(project, "linker", "ln -s / /session/escape")
    for name in ("quiet", "quiet", "quiet"):
        assert cli("run", name, "--project", str(project.root)).returncode == 0
    assert sessions_of(project) == set()
    assert cli("run", "writer", "--project", str(project.root)).returncode == 0
    assert cli("run", "linker", "--project", str(project.root)).returncode == 0
    assert cli("run", "quiet", "--project", str(project.root), "--session", "named").returncode == 0
    kept = sessions_of(project)
    assert len(kept) == 3 and "named" in kept  # what holds something, and a named session
    root = project.root / ".sandbox" / "sessions"
    assert any((root / s / "escape").is_symlink() for s in kept)
    assert os.path.isdir("/etc")
    # Nothing per-run is left empty anywhere under the sandbox root: only shared folders.
    sandbox = project.root / ".sandbox"
    empty = {
        os.path.relpath(folder, sandbox)
        for folder, dirs, files in os.walk(sandbox)
        if not dirs and not files
    }
    assert empty <= {"changes", "runs", "workspaces/default", "sessions/named"}, empty


@pytest.mark.serial
def test_gc_prunes_old_sessions_keeps_live_ones_and_audits(engine, project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    worker(project, "writer", "echo x > /session/notes.txt; ln -s /etc /session/escape")
    for session in ("old", "young"):
        args = ("run", "writer", "--project", str(project.root), "--session", session)
        assert cli(*args).returncode == 0
    root = project.root / ".sandbox" / "sessions"
    (root / "old" / "outside").symlink_to(outside)
    backdate(root / "old", 8)
    backdate(root / "young", 1)

    worker(project, "sleeper", "echo x > /session/notes.txt; sleep 60")
    live = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "sleeper", "--project", str(project.root),
         "--session", "live"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (root / "live" / "notes.txt").exists():
            assert time.monotonic() < deadline and live.poll() is None, live.stderr
            time.sleep(0.2)
        backdate(root / "live", 30)

        bad = cli("gc", "--project", str(project.root), "--sessions-older-than", "a week")
        assert bad.returncode == 125 and "e.g. 7d or 12h" in bad.stderr
        done = cli("gc", "--project", str(project.root), "--sessions-older-than", "7d", "--json")
        assert done.returncode == 0, done.stderr
        data = done.json()
        assert data["sessions_removed"] == ["old"]
        assert data["sessions_in_use"] == ["live"]
        assert sessions_of(project) == {"young", "live"}
        assert (outside / "precious").read_text() == "keep me"
        assert os.path.isfile("/etc/hostname") or os.path.isdir("/etc")
    finally:
        live.send_signal(signal.SIGTERM)
        live.communicate(timeout=60)
    audit = [
        json.loads(line)
        for line in (project.root / ".sandbox" / "audit.jsonl").read_text().splitlines()
    ]
    removed = [e for e in audit if e["operation"] == "gc.session_removed"]
    assert [e["session_id"] for e in removed] == ["old"]
    assert removed[0]["metadata"]["age_s"] >= 8 * DAY - 60
