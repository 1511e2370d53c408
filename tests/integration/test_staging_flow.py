"""Outbox → change set → review → clearance, with a hostile worker in a real container."""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project
from orchestrator.staging import ChangeStore
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

HOSTILE = r"""
import os
os.chdir("/staged")
open("report.md", "w").write("# Findings\n\nAll good.\n")
os.makedirs("docs", exist_ok=True)
open("docs/notes.txt", "w").write("notes\n")
os.symlink("/etc/passwd", "passwd-link")                 # a symlink
os.symlink(os.environ["HOST_SECRET"], "host-link")        # pointing at a host path
os.link("report.md", "hard-link")                         # a hardlink
os.mkfifo("pipe")                                         # a FIFO
os.makedirs(".git/hooks", exist_ok=True)                  # a .git component
open(".git/hooks/post-checkout", "w").write("#!/bin/sh\necho pwned\n")
open(b"bad-\xff-name.txt", "w").write("x")                # not valid UTF-8
open("big.bin", "wb").write(os.urandom(3 << 20))          # over the per-file cap
print("staged")
"""


def git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo_project(project):
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "config", "user.email", "t@example.invalid")
    git(project.root, "config", "user.name", "tester")
    (project.root / ".gitignore").write_text(".sandbox/\n")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "start")
    project.extra = "sandbox: {outbox: {size: 16m, max_files: 20, max_file_size: 1m}}\n"
    project.write_project()
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "project file")
    return project


def test_hostile_outbox_is_filtered_then_reviewed_and_cleared(engine, repo_project, tmp_path):
    project = repo_project
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-CONTENT")
    project.worker(
        "w",
        f"command: {json.dumps(['python3', '-c', HOSTILE])}\nsandbox: {{}}\n"
        f"env: {{HOST_SECRET: {json.dumps(str(secret))}}}",
    )
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "worker")
    before = {
        p: p.read_bytes()
        for p in project.root.rglob("*")
        if p.is_file() and ".sandbox" not in p.parts
    }

    result = cli("run", "w", "--project", str(project.root), "--json")
    assert result.returncode == 0, result.stderr
    outbox = result.json()["outbox"]
    change_id = outbox["change_id"]
    reasons = {r["path"].removeprefix("./"): r["reason"] for r in outbox["rejected"]}
    for path in ("passwd-link", "host-link", "pipe", ".git/hooks/post-checkout", "big.bin"):
        assert any(p.startswith(path) for p in reasons), (path, reasons)
    assert any("bad-" in p for p in reasons)
    assert any("link" in r for p, r in reasons.items() if p in ("hard-link", "report.md"))
    # Nothing on the host changed yet; the secret went nowhere.
    after = {
        p: p.read_bytes()
        for p in project.root.rglob("*")
        if p.is_file() and ".sandbox" not in p.parts
    }
    assert after == before
    sandbox = load_project(project.root).sandbox_root
    for path in sandbox.rglob("*"):
        if path.is_file():
            assert b"HOST-SECRET-CONTENT" not in path.read_bytes()

    store = ChangeStore(sandbox / "changes")
    change = store.get(change_id)
    assert change.status == "pending"
    accepted = {f.path for f in change.files}
    assert "docs/notes.txt" in accepted
    # tar stores one of two hardlinked names as the file, the other as a link: refused
    assert len({"report.md", "hard-link"} & accepted) == 1
    audit = AuditLog(sandbox / "audit.jsonl")
    denied = audit.query(AuditFilter(operation="change.entry_rejected", denied_only=True))
    assert {e.path for e in denied} >= {"passwd-link", "pipe"}

    listing = cli("staged", "list", "--project", str(project.root), "--json")
    assert change_id in listing.stdout
    shown = cli("staged", "show", change_id, "--project", str(project.root), "--no-color")
    assert shown.returncode == 0, shown.stderr
    assert "notes" in shown.stdout
    assert "(trust untrusted, run " in shown.stdout and ", session " in shown.stdout

    cleared = cli("clear", change_id, "--yes", "--project", str(project.root))
    assert cleared.returncode == 0, cleared.stderr + cleared.stdout
    log = git(project.root, "log", "-1", "--format=%B")
    assert f"Staged-Id: {change_id}" in log
    assert "Worker: w" in log
    assert "Trust: untrusted" in log
    assert (project.root / "docs" / "notes.txt").read_text() == "notes\n"
    assert not (project.root / ".git" / "hooks" / "post-checkout").exists()
    assert not (project.root / "passwd-link").exists()
    assert store.get(change_id).status == "committed"
    # Clearing twice does nothing twice.
    again = cli("clear", change_id, "--yes", "--project", str(project.root))
    assert git(project.root, "log", "--format=%H").count("\n") == 4, again.stderr


def test_discard_and_reject(engine, repo_project):
    project = repo_project
    script = "open('/staged/a.md', 'w').write('a')"
    project.worker("w", f"command: {json.dumps(['python3', '-c', script])}\nsandbox: {{}}")
    ids = []
    for _ in range(2):
        result = cli("run", "w", "--project", str(project.root), "--json")
        ids.append(result.json()["outbox"]["change_id"])
    assert cli("staged", "discard", ids[0], "--project", str(project.root)).returncode == 0
    rejected = cli(
        "staged", "reject", ids[1], "--reason", "not wanted", "--project", str(project.root)
    )
    assert rejected.returncode == 0, rejected.stderr
    store = ChangeStore(load_project(project.root).sandbox_root / "changes")
    assert (store.get(ids[0]).status, store.get(ids[1]).status) == ("discarded", "rejected")
    refused = cli("clear", ids[1], "--yes", "--project", str(project.root))
    assert refused.returncode == 125
    assert "Traceback" not in refused.stderr


def test_file_count_cap(engine, repo_project):
    script = "[open(f'/staged/f{i:02}.txt', 'w').write(str(i)) for i in range(30)]"
    repo_project.worker("w", f"command: {json.dumps(['python3', '-c', script])}\nsandbox: {{}}")
    outbox = cli("run", "w", "--project", str(repo_project.root), "--json").json()["outbox"]
    assert outbox["files"] == 20
    assert any("more than 20 entries" in r["reason"] for r in outbox["rejected"])
