"""*Clear and push* on the review console's change-set page: the code path of
``orchestrator clear --push``, against git's own http-backend served on loopback by the
test (tests/integration/test_clearance_push.py), with the project's token credential.

The token reaches the push and nothing else: not the page, not the audit log, no file.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from tests.integration import test_review_browser as browsing
from tests.integration.test_clearance_push import GitHTTPServer, files_holding, needs_http_backend
from tests.integration.test_review_browser import (
    assert_nothing_ran,
    base_of,
    login,
    shot,
    submit,
)
from tests.unit.test_clearance_fakes import git, make_repo
from tests.unit.test_review_console import audit_ops, client, make_project

# The browser step's fixtures: a project, the console on it, Chromium and a canary server.
project = browsing.project
console = browsing.console
browser = browsing.browser
canary = browsing.canary

PROJECT_FILE = """zones: {}
repo: .
credentials:
  forge: {source: env, env: FORGE_TOKEN}
clearance: {credential: forge}
"""


@pytest.fixture
def pushing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A project whose clearance pushes with the token credential 'forge', a bare
    repository to serve, and when the test started (for files_holding)."""
    started = time.time()
    root, store, stage = make_project(tmp_path, monkeypatch)
    (root / "orchestrator.yaml").write_text(PROJECT_FILE)
    git(root, "commit", "-q", "-am", "push with forge")
    served = tmp_path / "served"
    served.mkdir()
    git(served, "init", "-q", "--bare", "project.git")
    git(served / "project.git", "config", "http.receivepack", "true")
    return root, store, stage, served, started


def served_main(served: Path) -> str:
    return git(
        served / "project.git", "rev-parse", "--verify", "-q", "refs/heads/main", check=False
    )


@needs_http_backend
def test_clear_and_push_from_the_page_with_the_projects_token(pushing, monkeypatch) -> None:
    root, store, stage, served, started = pushing
    token = "tok-" + secrets.token_hex(16)
    monkeypatch.setenv("FORGE_TOKEN", token)
    change_id = stage({"report.md": b"findings\n"})
    with GitHTTPServer(served, token) as server:
        git(root, "remote", "add", "origin", server.url("project.git"))
        web = client(root)
        page = web.get(f"/changes/{change_id}").text
        assert 'value="push">Clear and push to origin</button>' in page
        assert "the credential forge" in page
        done = web.post(
            f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf, "action": "push"}
        )
        assert any(authorised for _, _, authorised in server.seen)
    assert done.status_code == 200, done.text
    commit = git(root, "rev-parse", "HEAD")
    assert f"committed as {commit} on main, pushed to &#39;origin&#39; as refs/heads/main" in (
        done.text
    )
    assert served_main(served) == commit
    assert store.get(change_id).status == "committed"
    assert f"Staged-Id: {change_id}" in git(root, "log", "-1", "--format=%B")
    # Once committed, the page offers the push alone, and no clearing.
    page = web.get(f"/changes/{change_id}").text
    assert "Push its commit to origin" in page and "Clear and push" not in page
    assert audit_ops(root, "clearance.*") == ["clearance.committed", "clearance.pushed"]
    [used] = AuditLog(root / ".sandbox" / "audit.jsonl").query(
        AuditFilter(operation="credential.used")
    )
    assert used.metadata["credential"] == "forge"
    for html in (page, done.text):
        assert token not in html
    monkeypatch.delenv("FORGE_TOKEN")
    roots = [root / ".sandbox", root / ".git", root.parent, tempfile.gettempdir()]
    assert files_holding(token.encode(), roots, started) == []


@needs_http_backend
def test_a_failed_push_is_one_line_on_the_page_and_pushing_again_only_pushes(
    pushing, monkeypatch
) -> None:
    root, store, stage, served, started = pushing
    token, wrong = "tok-" + secrets.token_hex(16), "bad-" + secrets.token_hex(16)
    change_id = stage({"report.md": b"findings\n"})
    with GitHTTPServer(served, token) as server:
        git(root, "remote", "add", "origin", server.url("project.git"))
        web = client(root)
        monkeypatch.setenv("FORGE_TOKEN", wrong)
        failed = web.post(
            f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf, "action": "push"}
        )
        assert failed.status_code == 502
        commit = git(root, "rev-parse", "HEAD")
        [message] = [
            line for line in failed.text.splitlines() if "but the push to &#39;origin&#39;" in line
        ]
        assert f"committed as {commit[:12]} on main" in message and "the commit is safe" in message
        assert wrong not in failed.text
        assert 'value="push">Push again</button>' in failed.text
        assert store.get(change_id).status == "committed" and served_main(served) == ""

        monkeypatch.setenv("FORGE_TOKEN", token)
        again = web.post(
            f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf, "action": "push"}
        )
    assert again.status_code == 200, again.text
    assert f"commit {commit} pushed to &#39;origin&#39; as refs/heads/main" in again.text
    assert served_main(served) == commit
    assert git(root, "rev-list", "--count", "HEAD") == "4"  # one more commit, made once
    assert audit_ops(root, "clearance.*") == [
        "clearance.committed",
        "clearance.push_failed",
        "clearance.pushed",
    ]
    audit = (root / ".sandbox" / "audit.jsonl").read_text()
    assert wrong not in audit and token not in audit
    monkeypatch.delenv("FORGE_TOKEN")
    roots = [root / ".sandbox", root / ".git", root.parent, tempfile.gettempdir()]
    for secret in (token, wrong):
        assert files_holding(secret.encode(), roots, started) == []


def test_without_the_remote_no_push_is_offered_and_a_forged_one_changes_nothing(
    project_without_credential,
) -> None:
    root, store, stage = project_without_credential
    change_id = stage({"report.md": b"findings\n"})
    web = client(root)
    page = web.get(f"/changes/{change_id}").text
    assert "Clear: commit into the repository" in page
    assert "Clear and push" not in page and "Push its commit" not in page
    head = git(root, "rev-parse", "HEAD")
    refused = web.post(
        f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf, "action": "push"}
    )
    assert refused.status_code == 409
    assert "no remote named &#39;origin&#39;" in refused.text
    assert git(root, "rev-parse", "HEAD") == head and store.get(change_id).status == "pending"


def test_a_push_error_naming_hostile_paths_is_shown_as_text(
    project_without_credential, tmp_path: Path
) -> None:
    root, store, stage = project_without_credential
    # A remote (no credential: git's own) whose main moved on, at a path holding markup:
    # git's one-line refusal names it.
    remote = tmp_path / '"><img src=x onerror="window.__pwned=1">.git'
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(root, "push", "-q", str(remote), "HEAD:refs/heads/main")
    other = make_repo(tmp_path / "other", {"other.md": "x\n"})
    git(other, "push", "-q", "--force", str(remote), "HEAD:refs/heads/main")
    git(root, "remote", "add", "origin", f"file://{remote}")
    git(root, "config", "advice.pushUpdateRejected", "false")
    change_id = stage({"report.md": b"findings\n"})
    web = client(root)
    page = web.get(f"/changes/{change_id}").text
    assert "Clear and push to origin" in page and "git's own credentials" in page
    failed = web.post(f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf, "action": "push"})
    assert failed.status_code == 502
    assert "<img" not in failed.text
    assert "&lt;img src=x onerror=&#34;window.__pwned=1&#34;&gt;.git" in failed.text
    assert store.get(change_id).status == "committed"


@pytest.fixture
def project_without_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return make_project(tmp_path, monkeypatch)


def test_clear_and_push_in_the_browser(console, browser, canary, project, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    root, store, stage = project
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(root, "remote", "add", "origin", f"file://{remote}")
    change_id = stage({"report.md": b"findings\n"}, run_id="run-push")
    login(browser, console)
    browser.get(f"{base_of(console)}/changes/{change_id}")
    button = browser.find_element(By.CSS_SELECTOR, 'button[value="push"]')
    assert button.text == "Clear and push to origin"
    browser.execute_script("arguments[0].scrollIntoView()", button)
    shot(browser, "change-push")
    submit(browser, button)
    done = browser.find_element(By.CSS_SELECTOR, "p.done").text
    commit = git(root, "rev-parse", "HEAD")
    assert done == f"committed as {commit} on main, pushed to 'origin' as refs/heads/main"
    assert git(remote, "rev-parse", "refs/heads/main") == commit
    assert store.get(change_id).status == "committed"
    assert_nothing_ran(browser, canary)
