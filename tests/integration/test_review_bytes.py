"""The reviewer sees every byte that will be committed: issue 32's conftest.py attack, run
by an untrusted worker (gVisor) and reviewed and cleared through the real command line."""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project
from tests.integration.conftest import cli, require_gvisor

pytestmark = pytest.mark.docker

PAYLOAD = "raise SystemExit('PAYLOAD-RAN')  # the line a reviewer must see"
#: tests/conftest.py: a latin-1 coding line, ~70 KB of docstring (valid UTF-8), one latin-1
#: byte, then the payload: the first 64 KiB decode as UTF-8, the whole file does not.
ATTACK = f"""
import os
os.makedirs("/staged/tests", exist_ok=True)
body = (
    b"# -*- coding: latin-1 -*-\\n"
    + b'\"\"\"' + b"Fixtures for the test suite, documented at length.\\n" * 1400 + b'\"\"\"\\n'
    + b"AUTHOR = 'Ren\\xe9'\\n"
    + {PAYLOAD!r}.encode() + b"\\n"
)
open("/staged/tests/conftest.py", "wb").write(body)
open("/staged/report.md", "w").write("# Report\\n")
print("staged", len(body))
"""


def git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True
    ).stdout


def test_a_conftest_valid_utf8_only_up_front_is_shown_flagged_and_needs_the_ack(engine, project):
    require_gvisor(engine)
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "config", "user.email", "t@example.invalid")
    git(project.root, "config", "user.name", "tester")
    (project.root / ".gitignore").write_text(".sandbox/\n")
    project.worker("w", f"command: {json.dumps(['python3', '-c', ATTACK])}\nsandbox: {{}}")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "start")
    where = ("--project", str(project.root))

    ran = cli("run", "w", *where, "--json")
    assert ran.returncode == 0, ran.stderr
    change_id = ran.json()["outbox"]["change_id"]
    sandbox = load_project(project.root).sandbox_root
    audit = AuditLog(sandbox / "audit.jsonl")
    [started] = audit.query(AuditFilter(operation="run.started"))
    assert started.trust_level == "untrusted"
    assert started.metadata["isolation"] == "gvisor"

    shown = cli("staged", "show", change_id, *where, "--no-color")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert f"+{PAYLOAD}" in lines  # the payload line, in full
    assert "+AUTHOR = 'Ren\\xe9'" in lines  # the latin-1 byte, escaped
    assert not any(line.startswith("+ now:") for line in lines)
    assert "binary FAILED" in shown.stdout and "sensitive-paths FAILED" in shown.stdout
    assert "! binary: tests/conftest.py: not UTF-8 text from byte " in shown.stdout
    assert "! sensitive-paths: tests/conftest.py: runs code by itself" in shown.stdout
    assert "clearing    needs --ack-sensitive tests/conftest.py" in lines
    as_json = cli("staged", "show", change_id, *where, "--json").json()
    assert as_json["sensitive"] == ["tests/conftest.py"]
    assert set(as_json["blocking"]) == {"binary", "sensitive-paths"}

    head = git(project.root, "rev-parse", "HEAD")
    for extra in ((), ("--override-scanners",)):
        refused = cli("clear", change_id, "-y", *extra, *where)
        assert refused.returncode == 125, refused.stderr
        [message] = refused.stderr.strip().splitlines()
        assert "tests/conftest.py" in message and "--ack-sensitive tests/conftest.py" in message
    # The acknowledgement covers the file that runs code, not the other scanners' findings.
    refused = cli("clear", change_id, "-y", "--ack-sensitive", "tests/conftest.py", *where)
    assert refused.returncode == 125 and "scanners block it: binary" in refused.stderr
    wrong = cli("clear", change_id, "-y", "--ack-sensitive", "report.md", *where)
    assert wrong.returncode == 125 and "--ack-sensitive tests/conftest.py" in wrong.stderr
    assert git(project.root, "rev-parse", "HEAD") == head
    assert not (project.root / "tests" / "conftest.py").exists()

    cleared = cli(
        "clear", change_id, "-y", "--ack-sensitive", "tests/conftest.py",
        "--override-scanners", *where,
    )  # fmt: skip
    assert cleared.returncode == 0, cleared.stderr
    assert "ACKNOWLEDGED (runs code by itself): tests/conftest.py" in cleared.stderr
    assert PAYLOAD.encode() in (project.root / "tests" / "conftest.py").read_bytes()
    assert git(project.root, "rev-parse", "HEAD") != head
    refusals = list(audit.query(AuditFilter(operation="clearance.refused")))
    assert len(refusals) == 4
    assert all(e.allowed is False and "tests/conftest.py" in (e.reason or "") for e in refusals)
    [ack] = audit.query(AuditFilter(operation="clearance.acknowledged"))
    assert ack.metadata["paths"] == ["tests/conftest.py"]
    assert audit.verify().ok
