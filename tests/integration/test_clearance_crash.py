"""A clearance killed with SIGKILL at each step leaves a consistent state, and a re-run
finishes it: exactly one commit, the change set marked committed, nothing else touched.

Change sets come from the real staging store and are scanned by its real scanners."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.clearance import ClearanceError, clear
from orchestrator.staging import ChangeStore
from tests.unit.test_clearance_fakes import git, isolate_git, make_repo, stage_real

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from orchestrator.clearance import clear, clearing
    from orchestrator.staging import worktree
    from orchestrator.staging import ChangeStore

    stage, store_root, repo, change_id, branch = sys.argv[1:6]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    clearing._checkpoint = lambda name: die() if name == stage else None
    if stage == "mid-apply":  # after the first file, before the second
        real_write, count = worktree.WorkTree.write, [0]
        def write(self, *args):
            real_write(self, *args)
            count[0] += 1
            if count[0] == 1:
                die()
        worktree.WorkTree.write = write
    if stage == "temp-written":  # the temporary file exists, the rename has not happened
        worktree.os.rename = lambda *a, **k: die()
    clear(ChangeStore(Path(store_root)), change_id, Path(repo), branch=branch or None)
    print("finished")
    """
)

STAGES = [
    "commit-written",
    "mid-apply",
    "temp-written",
    "applied",
    "index-updated",
    "ref-updated",
    "marked",
]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    isolate_git(monkeypatch, tmp_path / "home")
    repo = make_repo(tmp_path / "repo", {"README.md": "v1\n", "old.md": "old\n"})
    (repo / "unrelated.txt").write_text("the user's own work\n")
    store = ChangeStore(tmp_path / "changes")
    change_id = stage_real(
        store.root,
        tmp_path,
        new={"a/new.md": b"new\n", "README.md": b"v2\n", "old.md": None, "z/last.md": b"last\n"},
        base={"README.md": b"v1\n", "old.md": b"old\n"},
    )
    return repo, store, change_id


def status_of(store, change_id):
    return store.get(change_id).status


def kill_at(stage, store, repo, change_id, branch=""):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, stage, str(store.root), str(repo), change_id, branch],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr)


def commits_with_trailer(repo, change_id, ref="--branches"):
    out = git(repo, "log", ref, "--format=%H", "--fixed-strings", f"--grep=Staged-Id: {change_id}")
    return out.split()


@pytest.mark.parametrize("stage", STAGES)
def test_a_killed_clearance_is_consistent_and_finishes_on_a_rerun(setup, stage):
    repo, store, change_id = setup
    head = git(repo, "rev-parse", "HEAD")
    kill_at(stage, store, repo, change_id)
    status = status_of(store, change_id)
    committed = commits_with_trailer(repo, change_id)
    # Consistent: no commit and pending, or a commit (marked or not yet marked).
    if stage in ("ref-updated", "marked"):
        assert len(committed) == 1
        assert git(repo, "rev-parse", "HEAD") == committed[0]
        assert status == ("committed" if stage == "marked" else "pending")
    else:
        assert committed == []
        assert git(repo, "rev-parse", "HEAD") == head
        assert status == "pending"

    result = clear(store, change_id, repo)

    assert result.already == (stage in ("ref-updated", "marked"))
    final = commits_with_trailer(repo, change_id)
    assert final == [result.commit] == [git(repo, "rev-parse", "HEAD")]
    assert git(repo, "rev-parse", "HEAD^") == head
    assert status_of(store, change_id) == "committed"
    assert (repo / "a/new.md").read_text() == "new\n"
    assert (repo / "README.md").read_text() == "v2\n"
    assert not (repo / "old.md").exists()
    assert (repo / "unrelated.txt").read_text() == "the user's own work\n"
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == "?? unrelated.txt"
    names = git(repo, "show", "--name-only", "--format=", "HEAD").split()
    assert sorted(names) == ["README.md", "a/new.md", "old.md", "z/last.md"]
    # And once more: nothing left to do.
    assert clear(store, change_id, repo).already


@pytest.mark.parametrize("stage", ["commit-written", "ref-updated"])
def test_a_killed_clearance_onto_another_branch_finishes_too(setup, stage):
    repo, store, change_id = setup
    head = git(repo, "rev-parse", "HEAD")
    kill_at(stage, store, repo, change_id, branch="results")
    assert git(repo, "rev-parse", "HEAD") == head
    result = clear(store, change_id, repo, branch="results")
    assert commits_with_trailer(repo, change_id) == [result.commit]
    assert git(repo, "rev-parse", "results") == result.commit
    assert git(repo, "rev-parse", "HEAD") == head
    assert (repo / "README.md").read_text() == "v1\n"
    assert status_of(store, change_id) == "committed"


def test_a_half_applied_change_set_with_a_changed_file_is_refused(setup):
    """Recovery only accepts the change set's own content, never an edit made since."""
    repo, store, change_id = setup
    kill_at("applied", store, repo, change_id)
    (repo / "README.md").write_text("edited after the crash\n")
    with pytest.raises(ClearanceError, match="README.md has uncommitted changes"):
        clear(store, change_id, repo)
    assert status_of(store, change_id) == "pending"
