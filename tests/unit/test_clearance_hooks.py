"""Hooks and fsmonitor planted in the repository never run during clearance.

Each planted program appends its name to a marker file. A sanity step first shows that plain
git does run them, so the test cannot pass because the plants are broken.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from orchestrator.clearance import SAFE_CONFIG, clear
from tests.unit.test_clearance_fakes import FakeScanners, FakeStore, git, isolate_git, make_repo

HOOKS = (
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "post-index-change",
    "reference-transaction",
    "pre-push",
    "post-checkout",
    "pre-auto-gc",
)


def plant(folder, marker, name):
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text(f'#!/bin/sh\necho "{name}" >> "{marker}"\nexit 0\n')
    script.chmod(0o755)
    return script


@pytest.fixture(params=["git-dir-hooks", "work-tree-hooks-path"])
def planted(request, tmp_path, monkeypatch):
    isolate_git(monkeypatch, tmp_path / "home")
    repo = make_repo(tmp_path / "repo", {"README.md": "hi\n"})
    marker = tmp_path / "marker"
    if request.param == "git-dir-hooks":
        folder = repo / ".git" / "hooks"
    else:  # the hooks folder is in the work tree, where a worker could have written
        folder = repo / ".githooks"
        git(repo, "config", "core.hooksPath", ".githooks")
    for name in HOOKS:
        plant(folder, marker, name)
    monitor = plant(tmp_path / "bin", marker, "fsmonitor")
    git(repo, "config", "core.fsmonitor", str(monitor))
    git(repo, "config", "core.untrackedCache", "true")
    # The user's own configuration may say the same: the -c options must win there too.
    (tmp_path / "home" / "gitconfig").write_text(f"[core]\n\tfsmonitor = {monitor}\n")
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    if request.param == "work-tree-hooks-path":
        git(repo, "add", ".githooks")
        git(repo, "commit", "-q", "-m", "hooks")
    return repo, marker, remote


def test_the_plants_are_live_for_plain_git(planted):
    repo, marker, _ = planted
    subprocess.run(["git", "status"], cwd=repo, capture_output=True, check=True)
    subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", "x"],
        cwd=repo,
        capture_output=True,
        check=True,
    )
    ran = marker.read_text().split()
    assert "fsmonitor" in ran
    assert "pre-commit" in ran
    assert "post-commit" in ran


def test_no_hook_and_no_fsmonitor_runs_during_clearance(planted, tmp_path):
    repo, marker, remote = planted
    store = FakeStore(tmp_path / "changes")
    (repo / "untracked.txt").write_text("dirty elsewhere\n")
    first = store.stage(
        {"reports/a.md": b"a\n", "README.md": b"changed\n"}, operations={"README.md": "update"}
    )
    result = clear(store, first, repo, push=True, scanners=FakeScanners())
    second = store.stage({"reports/b.md": b"b\n"})
    clear(store, second, repo, branch="other", scanners=FakeScanners())
    assert result.pushed
    assert git(remote, "rev-parse", "refs/heads/main") == result.commit
    assert not marker.exists(), f"ran: {marker.read_text()}"


def test_the_safe_options_are_the_documented_ones():
    assert "core.hooksPath=/dev/null" in SAFE_CONFIG
    assert "core.fsmonitor=false" in SAFE_CONFIG
    assert "core.untrackedCache=false" in SAFE_CONFIG


def test_git_is_started_with_the_safe_options(planted, tmp_path, monkeypatch):
    """Every git process sees the options: a wrapper on PATH records each command line."""
    repo, marker, _ = planted
    real_git = subprocess.run(
        ["which", "git"], capture_output=True, text=True, check=True
    ).stdout.strip()
    wrapper_dir = tmp_path / "wrap"
    wrapper_dir.mkdir()
    log = tmp_path / "calls"
    wrapper = wrapper_dir / "git"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{real_git}" "$@"\n')
    wrapper.chmod(0o755)
    import git as gitpython

    monkeypatch.setenv("PATH", f"{wrapper_dir}{os.pathsep}{os.environ['PATH']}")
    gitpython.refresh(str(wrapper))
    try:
        store = FakeStore(tmp_path / "changes")
        clear(store, store.stage({"c.md": b"c"}), repo, scanners=FakeScanners())
    finally:
        monkeypatch.undo()
        gitpython.refresh()
    calls = [call for call in log.read_text().splitlines() if call != "version"]
    assert len(calls) > 5
    for call in calls:
        assert call.startswith(
            "-c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false "
            "--literal-pathspecs --no-optional-locks "
        ), call
    assert not marker.exists()


def test_configuration_from_the_environment_cannot_turn_hooks_back_on(
    planted, tmp_path, monkeypatch
):
    repo, marker, _ = planted
    hooks = tmp_path / "env-hooks"
    for name in HOOKS:
        plant(hooks, marker, name)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.hooksPath")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(hooks))
    monkeypatch.setenv("GIT_CONFIG_KEY_1", "core.fsmonitor")
    monkeypatch.setenv("GIT_CONFIG_VALUE_1", str(tmp_path / "bin" / "fsmonitor"))
    store = FakeStore(tmp_path / "changes")
    clear(store, store.stage({"d.md": b"d"}), repo, scanners=FakeScanners())
    assert not marker.exists(), f"ran: {marker.read_text()}"
