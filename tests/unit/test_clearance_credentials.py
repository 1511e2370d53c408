"""Named credentials: read from env, file or command; never shown, never pickled, redacted."""

from __future__ import annotations

import pickle
import sys

import pytest

from orchestrator.audit import AuditLog
from orchestrator.clearance import Credential, CredentialError, resolve
from orchestrator.clearance.push import ASKPASS, PASSWORD_VAR
from orchestrator.config.models import CredentialConfig

SECRET = "s3cr3t-value-0123456789"


def test_from_the_environment(monkeypatch):
    monkeypatch.setenv("FORGE_TOKEN", SECRET + "\nsecond line")
    credential = resolve("forge", CredentialConfig(source="env", env="FORGE_TOKEN"))
    assert credential.reveal() == SECRET
    assert credential.explicit
    assert credential.username == "x-access-token"


def test_from_a_file_first_line_stripped_relative_to_the_base(tmp_path):
    (tmp_path / "token").write_text(f"  {SECRET}  \nignored\n")
    config = CredentialConfig(source="file", path="token")
    assert resolve("forge", config, base=tmp_path).reveal() == SECRET


def test_from_a_command(tmp_path):
    config = CredentialConfig(
        source="command", command=[sys.executable, "-c", f"print({SECRET!r}); print('x')"]
    )
    assert resolve("forge", config).reveal() == SECRET


def test_a_failing_command_never_shows_its_output():
    config = CredentialConfig(
        source="command",
        command=[sys.executable, "-c", f"import sys; print({SECRET!r}); sys.exit(3)"],
    )
    with pytest.raises(CredentialError, match="exited with code 3") as failed:
        resolve("forge", config)
    assert SECRET not in str(failed.value)


def test_a_slow_command_is_stopped():
    config = CredentialConfig(
        source="command", command=[sys.executable, "-c", "import time; time.sleep(30)"]
    )
    with pytest.raises(CredentialError, match="did not finish within 0.5 s"):
        resolve("forge", config, timeout=0.5)


def test_missing_sources_are_explained(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE", raising=False)
    with pytest.raises(CredentialError, match="NOPE is not set"):
        resolve("forge", CredentialConfig(source="env", env="NOPE"))
    with pytest.raises(CredentialError, match="cannot read"):
        resolve("forge", CredentialConfig(source="file", path=str(tmp_path / "absent")))
    with pytest.raises(CredentialError, match="cannot run"):
        resolve("forge", CredentialConfig(source="command", command=[str(tmp_path / "absent")]))


def test_too_short_to_redact_is_refused(monkeypatch):
    monkeypatch.setenv("FORGE_TOKEN", "abc")
    with pytest.raises(CredentialError, match="too short"):
        resolve("forge", CredentialConfig(source="env", env="FORGE_TOKEN"))


def test_the_value_is_never_shown_or_pickled(monkeypatch):
    monkeypatch.setenv("FORGE_TOKEN", SECRET)
    credential = resolve("forge", CredentialConfig(source="env", env="FORGE_TOKEN"))
    assert SECRET not in repr(credential)
    assert SECRET not in str(credential)
    assert SECRET not in f"{credential}"
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(credential)
    assert not hasattr(credential, "__dict__")


def test_the_value_is_registered_for_redaction_before_use(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_TOKEN", SECRET)
    log = AuditLog(tmp_path / "audit.jsonl")
    resolve("forge", CredentialConfig(source="env", env="FORGE_TOKEN"), audit=log)
    entry = log.record("test.leak", reason=f"oops {SECRET}", metadata={"v": SECRET})
    assert SECRET not in (entry.reason or "")
    assert SECRET.encode() not in (tmp_path / "audit.jsonl").read_bytes()


def test_inherit_reads_nothing(monkeypatch):
    monkeypatch.delenv("FORGE_TOKEN", raising=False)
    credential = resolve("forge", CredentialConfig(source="env", env="FORGE_TOKEN", mode="inherit"))
    assert isinstance(credential, Credential)
    assert not credential.explicit
    with pytest.raises(CredentialError, match="holds no value"):
        credential.reveal()


def test_the_askpass_helper_holds_no_value_and_prints_with_a_builtin():
    assert SECRET not in ASKPASS
    assert f"printf '%s\\n' \"${PASSWORD_VAR}\"" in ASKPASS


def test_an_explicit_credential_refuses_a_configured_extra_header(tmp_path, monkeypatch):
    from orchestrator.clearance import ClearanceError
    from orchestrator.clearance.gitrepo import GitRepo
    from orchestrator.clearance.push import plan_push
    from orchestrator.credentials import Credential
    from tests.unit.test_clearance_fakes import git, isolate_git, make_repo

    isolate_git(monkeypatch, tmp_path / "home")
    repo = make_repo(tmp_path / "repo", {"a.md": "a\n"})
    url = "https://forge.invalid/team/repo.git"
    git(repo, "remote", "add", "origin", url)
    token = Credential("forge", mode="explicit", username="x-access-token", value="tok-12345678")
    assert plan_push(GitRepo(repo, change_id="c1"), "origin", token).inject
    git(repo, "config", f"http.{url}.extraheader", "AUTHORIZATION: basic bGVmdG92ZXI=")
    with pytest.raises(ClearanceError, match="http.extraHeader"):
        plan_push(GitRepo(repo, change_id="c1"), "origin", token)
