"""``orchestrator clear`` end to end: a real project, the real staging store and scanners."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.clearance import ClearanceDeclined, ClearanceError
from orchestrator.cli import clear as clear_module
from orchestrator.cli.clear import clear as clear_command
from orchestrator.errors import CredentialError
from orchestrator.staging import ChangeStore
from tests.unit.test_clearance_fakes import git, isolate_git, make_repo, stage_real

PROJECT = """\
zones: {}
repo: .
credentials:
  forge: {source: env, env: FORGE_TOKEN}
clearance:
  remote: origin
  credential: forge
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    isolate_git(monkeypatch, tmp_path / "home")
    root = make_repo(tmp_path / "project", {"README.md": "v1\n"})
    (root / "orchestrator.yaml").write_text(PROJECT)
    git(root, "add", "orchestrator.yaml")
    git(root, "commit", "-q", "-m", "project file")
    (root / ".git" / "info" / "exclude").write_text(".sandbox/\n")
    store = ChangeStore(root / ".sandbox" / "changes")

    def stage(new, base=None):
        return stage_real(store.root, tmp_path / "work", new=new, base=base)

    return root, store, stage


def invoke(*args, input=None):
    return CliRunner().invoke(clear_command, list(args), input=input, catch_exceptions=True)


def test_clear_with_yes_commits_and_prints_the_summary(project):
    root, store, stage = project
    change_id = stage({"README.md": b"v2\n", "notes/new.md": b"new\n"}, base={"README.md": b"v1\n"})
    result = invoke(change_id[:6], "--yes", "--project", str(root))
    assert result.exit_code == 0, result.output
    assert "notes/new.md" in result.output
    assert "update" in result.output
    assert f"change set {change_id}: committed as" in result.output
    assert store.get(change_id).status == "committed"
    assert git(root, "log", "-1", "--format=%(trailers:key=Staged-Id,valueonly)") == change_id
    audit = AuditLog(root / ".sandbox" / "audit.jsonl")
    assert [e.operation for e in audit.query(AuditFilter(operation="clearance.*"))] == [
        "clearance.committed"
    ]
    again = invoke(change_id, "--yes", "--project", str(root))
    assert again.exit_code == 0
    assert "already committed" in again.output


def test_the_prompt_decides(project, monkeypatch):
    root, store, stage = project
    monkeypatch.setattr(clear_module, "_interactive", lambda: True)
    change_id = stage({"a.md": b"a\n"})
    declined = invoke(change_id, "--project", str(root), input="n\n")
    assert isinstance(declined.exception, ClearanceDeclined)
    assert declined.exception.exit_code == 1
    assert store.get(change_id).status == "pending"
    accepted = invoke(change_id, "--project", str(root), input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert store.get(change_id).status == "committed"


def test_without_a_terminal_yes_is_required(project):
    root, _, stage = project
    change_id = stage({"a.md": b"a\n"})
    result = invoke(change_id, "--project", str(root))
    assert isinstance(result.exception, ClearanceError)
    assert "pass --yes" in str(result.exception)
    assert result.exception.exit_code == 125


def test_real_scanners_block_and_the_override_is_audited(project):
    root, store, stage = project
    change_id = stage({"config.txt": b"aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"})
    blocked = invoke(change_id, "--yes", "--project", str(root))
    assert isinstance(blocked.exception, ClearanceError)
    assert "scanners block it: secrets: config.txt" in str(blocked.exception)
    assert "--override-scanners" in str(blocked.exception)
    assert store.get(change_id).status == "pending"
    forced = invoke(change_id, "--yes", "--override-scanners", "--project", str(root))
    assert forced.exit_code == 0, forced.output
    assert "OVERRIDDEN" in forced.output
    audit = AuditLog(root / ".sandbox" / "audit.jsonl")
    assert audit.query(AuditFilter(operation="clearance.override"))


def test_a_file_that_runs_code_needs_its_own_acknowledgement(project):
    root, store, stage = project
    (root / "orchestrator.yaml").write_text(PROJECT + "  sensitive_paths: [tools/*.py]\n")
    change_id = stage({".github/workflows/ci.yml": b"on: push\n", "tools/gen.py": b"x = 1\n"})
    for extra in ((), ("--override-scanners",), ("--ack-sensitive", "tools/gen.py")):
        blocked = invoke(change_id, "--yes", *extra, "--project", str(root))
        assert isinstance(blocked.exception, ClearanceError), blocked.output
        assert blocked.exception.exit_code == 125
        assert "--ack-sensitive .github/workflows/ci.yml" in str(blocked.exception)
    assert store.get(change_id).status == "pending"
    flags = ["--ack-sensitive", ".github/workflows/ci.yml", "--ack-sensitive", "tools/gen.py"]
    done = invoke(change_id, "--yes", *flags, "--project", str(root))
    assert done.exit_code == 0, done.output
    assert "ACKNOWLEDGED (runs code by itself): .github/workflows/ci.yml" in done.output
    audit = AuditLog(root / ".sandbox" / "audit.jsonl")
    [ack] = audit.query(AuditFilter(operation="clearance.acknowledged"))
    assert sorted(ack.metadata["paths"]) == [".github/workflows/ci.yml", "tools/gen.py"]
    assert not audit.query(AuditFilter(operation="clearance.override"))
    assert len(audit.query(AuditFilter(operation="clearance.refused"))) == 3


def test_push_with_the_configured_credential_and_branch(project, monkeypatch, tmp_path):
    root, _, stage = project
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(root, "remote", "add", "origin", str(remote))
    monkeypatch.setenv("FORGE_TOKEN", "not-used-for-a-local-remote")
    change_id = stage({"a.md": b"a\n"})
    result = invoke(change_id, "--yes", "--push", "--branch", "results", "--project", str(root))
    assert result.exit_code == 0, result.output
    assert "pushed to 'origin'" in result.output
    assert git(remote, "rev-parse", "refs/heads/results") == git(root, "rev-parse", "results")
    assert git(root, "symbolic-ref", "HEAD") == "refs/heads/main"


def test_a_missing_credential_value_is_a_clear_error(project, monkeypatch):
    root, store, stage = project
    monkeypatch.delenv("FORGE_TOKEN", raising=False)
    change_id = stage({"a.md": b"a\n"})
    result = invoke(change_id, "--yes", "--push", "--project", str(root))
    assert isinstance(result.exception, CredentialError)
    assert "FORGE_TOKEN is not set" in str(result.exception)
    assert store.get(change_id).status == "pending"


def test_an_unknown_id_names_the_store(project):
    root, _, _ = project
    result = invoke("abcdef", "--yes", "--project", str(root))
    assert isinstance(result.exception, ClearanceError)
    assert "does not exist" in str(result.exception)
