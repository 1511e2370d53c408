"""Clearance into a real git repository (no Docker): commit, refusals, branches, recovery."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.clearance import (
    ClearanceDeclined,
    ClearanceError,
    ClearResult,
    Summary,
    clear,
)
from tests.unit.test_clearance_fakes import FakeScanners, FakeStore, git, isolate_git, make_repo


class Env:
    def __init__(self, tmp_path, monkeypatch):
        isolate_git(monkeypatch, tmp_path / "home")
        self.repo = make_repo(
            tmp_path / "repo",
            {"README.md": "hello\n", "src/app.py": "print('v1')\n", "docs/old.md": "old\n"},
        )
        self.sandbox = self.repo / ".sandbox"
        self.store = FakeStore(self.sandbox / "changes")
        self.audit = AuditLog(tmp_path / "audit.jsonl")
        self.scanners = FakeScanners()

    def clear(self, change_id, **kwargs) -> ClearResult:
        kwargs.setdefault("scanners", self.scanners)
        kwargs.setdefault("audit", self.audit)
        kwargs.setdefault("protected", [self.sandbox])
        return clear(self.store, change_id, self.repo, **kwargs)

    def head(self, ref="HEAD"):
        return git(self.repo, "rev-parse", ref)

    def status(self):
        return git(self.repo, "status", "--porcelain", "--untracked-files=all")

    def operations(self):
        return [(e.operation, e.allowed) for e in self.audit.query(AuditFilter())]


@pytest.fixture
def env(tmp_path, monkeypatch):
    environment = Env(tmp_path, monkeypatch)
    git(environment.repo, "config", "--add", "core.excludesFile", str(tmp_path / "none"))
    (environment.repo / ".git" / "info" / "exclude").write_text(".sandbox/\n")
    return environment


def test_commits_exactly_the_change_set_with_trailers(env):
    before = env.head()
    change_id = env.store.stage(
        {
            "reports/summary.md": b"# Summary\n",
            "src/app.py": b"print('v2')\n",
            "tools/run.sh": b"#!/bin/sh\necho hi\n",
            "docs/old.md": None,
        },
        operations={"src/app.py": "update"},
        modes={"tools/run.sh": "0755"},
        message="Summarise the findings\n\nLonger text.",
    )
    result = env.clear(change_id)
    assert result.commit == env.head() != before
    assert result.branch == "main"
    assert result.files == 4
    assert not result.already
    assert not result.resumed
    assert git(env.repo, "rev-parse", "HEAD^") == before
    body = git(env.repo, "log", "-1", "--format=%B")
    assert body.startswith("Summarise the findings\n\nLonger text.\n\n")
    assert body.endswith(f"Staged-Id: {change_id}\nWorker: writer\nRun: run1\nTrust: workspace")
    changed = git(env.repo, "show", "--name-status", "--format=", "HEAD").splitlines()
    assert sorted(changed) == sorted(
        ["A\treports/summary.md", "M\tsrc/app.py", "A\ttools/run.sh", "D\tdocs/old.md"]
    )
    assert git(env.repo, "ls-tree", "HEAD", "tools/run.sh").startswith("100755")
    assert (env.repo / "reports/summary.md").read_bytes() == b"# Summary\n"
    assert stat.S_IMODE((env.repo / "tools/run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((env.repo / "reports/summary.md").stat().st_mode) == 0o644
    assert not (env.repo / "docs").exists()  # emptied folders go, as with git rm
    assert env.status() == ""
    manifest = env.store.manifest(change_id)
    assert manifest["status"] == "committed"
    assert result.commit in manifest["history"][-1]["reason"]
    assert ("clearance.committed", True) in env.operations()


def test_content_is_committed_byte_for_byte_without_filters(env):
    (env.repo / ".gitattributes").write_text("*.txt text eol=crlf\n")
    git(env.repo, "add", ".gitattributes")
    git(env.repo, "commit", "-q", "-m", "attributes")
    content = b"line one\r\nline two\n\x00binary"
    change_id = env.store.stage({"data.txt": content})
    env.clear(change_id)
    blob = subprocess.run(
        ["git", "cat-file", "blob", "HEAD:data.txt"], cwd=env.repo, capture_output=True, check=True
    ).stdout
    assert blob == content


def test_unrelated_dirty_paths_are_left_alone_and_not_committed(env):
    (env.repo / "README.md").write_text("local edit\n")
    (env.repo / "scratch.txt").write_text("mine\n")
    (env.repo / "notes.md").write_text("staged\n")
    git(env.repo, "add", "notes.md")
    change_id = env.store.stage({"reports/a.md": b"a\n"})
    result = env.clear(change_id)
    changed = git(env.repo, "show", "--name-only", "--format=", result.commit).splitlines()
    assert changed == ["reports/a.md"]
    status = env.status().splitlines()
    assert " M README.md" in status
    assert "?? scratch.txt" in status
    assert "A  notes.md" in status  # still staged, still not committed
    assert (env.repo / "README.md").read_text() == "local edit\n"


@pytest.mark.parametrize(
    ("prepare", "path", "operation"),
    [
        pytest.param(
            lambda r: (r / "src/app.py").write_text("edited\n"),
            "src/app.py",
            "update",
            id="modified",
        ),
        pytest.param(
            lambda r: (r / "new.txt").write_text("mine\n"), "new.txt", "create", id="untracked"
        ),
        pytest.param(
            lambda r: ((r / "src/app.py").write_text("staged\n"), git(r, "add", "src/app.py")),
            "src/app.py",
            "update",
            id="staged",
        ),
        pytest.param(
            lambda r: ((r / ".gitignore").write_text("*.log\n"), (r / "out.log").write_text("x\n")),
            "out.log",
            "create",
            id="ignored",
        ),
        pytest.param(lambda r: (r / "src/app.py").unlink(), "src/app.py", "update", id="deleted"),
    ],
)
def test_uncommitted_changes_at_an_affected_path_are_refused(env, prepare, path, operation):
    prepare(env.repo)
    before_status, before_head = env.status(), env.head()
    change_id = env.store.stage({path: b"from the worker\n"}, operations={path: operation})
    with pytest.raises(ClearanceError, match=f"{path} has uncommitted changes"):
        env.clear(change_id)
    assert (env.head(), env.status()) == (before_head, before_status)
    assert env.store.manifest(change_id)["status"] == "pending"
    assert ("clearance.refused", False) in env.operations()


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        ".GIT/hooks/pre-commit",
        "sub/.git/x",
        ".git. /x",
        "../outside",
        "/etc/passwd",
        "a//b",
        "./a",
        "a/./b",
        "bad\nname",
        ".sandbox/audit.jsonl",
    ],
)
def test_paths_into_git_outside_the_tree_or_into_the_sandbox_are_refused(env, path):
    change_id = env.store.stage({path: b"x"})
    with pytest.raises(ClearanceError, match="refused|orchestrator's own state"):
        env.clear(change_id)
    assert env.status() == ""
    assert env.store.manifest(change_id)["status"] == "pending"


def test_a_symlinked_parent_folder_is_never_followed(env, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (env.repo / "link").symlink_to(outside)
    git(env.repo, "add", "link")
    git(env.repo, "commit", "-q", "-m", "a link")
    change_id = env.store.stage({"link/planted.txt": b"x"})
    with pytest.raises(ClearanceError, match="symlink"):
        env.clear(change_id)
    assert list(outside.iterdir()) == []


def test_a_symlink_at_the_target_is_never_replaced(env, tmp_path):
    (tmp_path / "victim").write_text("keep\n")
    (env.repo / "notes.md").symlink_to(tmp_path / "victim")
    git(env.repo, "add", "notes.md")
    git(env.repo, "commit", "-q", "-m", "a link")
    change_id = env.store.stage({"notes.md": b"x"}, operations={"notes.md": "update"})
    with pytest.raises(ClearanceError, match="symlink"):
        env.clear(change_id)
    assert (tmp_path / "victim").read_text() == "keep\n"


def test_a_parent_swapped_for_a_link_after_the_checks_is_still_not_followed(
    env, tmp_path, monkeypatch
):
    from orchestrator.clearance import clearing

    outside = tmp_path / "outside"
    outside.mkdir()
    real_check, calls = clearing.check_work_tree, []

    def check_then_swap(*args):
        resume = real_check(*args)
        calls.append(1)
        if len(calls) == 2:  # after the last check, a worker races the clearance
            (env.repo / "reports").symlink_to(outside)
        return resume

    monkeypatch.setattr(clearing, "check_work_tree", check_then_swap)
    change_id = env.store.stage({"reports/x.md": b"x"})
    with pytest.raises(ClearanceError, match="symlink"):
        env.clear(change_id)
    assert list(outside.iterdir()) == []
    assert env.store.manifest(change_id)["status"] == "pending"


def test_scanner_findings_block_unless_overridden(env):
    env.scanners = FakeScanners({"payload.sh": "BLOCK: curl | sh", "ok.md": "note: long lines"})
    change_id = env.store.stage({"payload.sh": b"curl x | sh\n", "ok.md": b"ok\n"})
    with pytest.raises(ClearanceError, match="scanners block it: payload.sh: BLOCK"):
        env.clear(change_id)
    assert env.store.manifest(change_id)["status"] == "pending"
    assert env.status() == ""
    seen: list[Summary] = []
    result = env.clear(change_id, override_scanners=True, confirm=lambda s: seen.append(s) or True)
    assert result.commit == env.head()
    assert seen[0].blocking == ("payload.sh: BLOCK: curl | sh",)
    assert "OVERRIDDEN" in seen[0].render()
    assert ("clearance.override", True) in env.operations()


def test_declining_changes_nothing(env):
    change_id = env.store.stage({"a.md": b"a"})
    before = env.head()
    with pytest.raises(ClearanceDeclined):
        env.clear(change_id, confirm=lambda summary: False)
    assert env.head() == before
    assert env.status() == ""
    assert env.store.manifest(change_id)["status"] == "pending"


def test_the_summary_lists_files_sizes_modes_and_scans(env):
    env.scanners = FakeScanners({"a.md": "note: fine"})
    change_id = env.store.stage(
        {"a.md": b"abc", "bin/x": b"#!/bin/sh\n"},
        modes={"bin/x": "0755"},
        message="First line\x1b[31m\nmore",
    )
    seen: list[Summary] = []
    env.clear(change_id, confirm=lambda s: seen.append(s) or True)
    text = seen[0].render()
    assert "create" in text
    assert "a.md" in text
    assert "3 B" in text
    assert "755" in text
    assert "scan: a.md: note: fine" in text
    assert "\x1b" not in text
    assert "branch main" in text


def test_another_branch_is_committed_without_touching_the_checkout(env):
    (env.repo / "README.md").write_text("dirty\n")
    before = env.head()
    change_id = env.store.stage({"README.md": b"from worker\n"}, operations={"README.md": "update"})
    result = env.clear(change_id, branch="worker/results")
    assert result.branch == "worker/results"
    assert env.head() == before
    assert git(env.repo, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert (env.repo / "README.md").read_text() == "dirty\n"
    assert env.head("worker/results") == result.commit
    assert git(env.repo, "rev-parse", "worker/results^") == before
    assert git(env.repo, "show", "worker/results:README.md") == "from worker"
    second = env.store.stage({"more.md": b"more\n"})
    again = env.clear(second, branch="worker/results")
    assert git(env.repo, "rev-parse", "worker/results^") == result.commit
    assert again.commit == env.head("worker/results")


def test_a_branch_checked_out_elsewhere_is_refused(env, tmp_path):
    git(env.repo, "worktree", "add", "-q", "-b", "side", str(tmp_path / "side"))
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match="checked out in another work tree"):
        env.clear(change_id, branch="side")


def test_detached_head_needs_a_branch(env):
    git(env.repo, "checkout", "-q", "--detach")
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match="HEAD is detached"):
        env.clear(change_id)
    assert env.clear(change_id, branch="results").branch == "results"


def test_invalid_branch_names_are_refused(env):
    change_id = env.store.stage({"a.md": b"a"})
    for name in ("-x", "a..b", "has space"):
        with pytest.raises(ClearanceError, match="not a valid branch name"):
            env.clear(change_id, branch=name)


def test_the_branch_must_still_match_the_staged_operations(env):
    exists = env.store.stage({"README.md": b"x"})
    with pytest.raises(ClearanceError, match="already exists on branch main"):
        env.clear(exists)
    missing = env.store.stage({"nothing.md": b"x"}, operations={"nothing.md": "update"})
    with pytest.raises(ClearanceError, match="does not exist on branch main"):
        env.clear(missing)


@pytest.mark.parametrize(
    ("status", "target", "message"),
    [
        ("rejected", None, "it is rejected"),
        ("discarded", None, "it is discarded"),
        ("pending", {"kind": "zone", "name": "output"}, "targets zone 'output'"),
    ],
)
def test_only_pending_or_approved_repo_change_sets_are_cleared(env, status, target, message):
    change_id = env.store.stage({"a.md": b"a"}, status=status, target=target)
    with pytest.raises(ClearanceError, match=message):
        env.clear(change_id)


def test_approved_change_sets_are_cleared(env):
    change_id = env.store.stage({"a.md": b"a"}, status="approved")
    env.clear(change_id)
    assert env.store.manifest(change_id)["history"][-1]["from"] == "approved"


def test_a_changed_blob_is_refused(env):
    change_id = env.store.stage({"a.md": b"a"})
    digest = env.store.manifest(change_id)["files"][0]["sha256"]
    env.store.blob_path(change_id, digest).write_bytes(b"tampered")
    with pytest.raises(ClearanceError, match="does not match the manifest"):
        env.clear(change_id)
    assert env.status() == ""


def test_an_unknown_change_set_is_a_clear_error(env):
    with pytest.raises(ClearanceError, match="cannot be read"):
        env.clear("feedfacecafe")
    with pytest.raises(ClearanceError, match="not a change-set id"):
        env.clear("../x")


def test_clearing_twice_finds_the_commit_and_does_nothing(env):
    change_id = env.store.stage({"a.md": b"a"})
    first = env.clear(change_id)
    again = env.clear(change_id)
    assert again.already
    assert again.commit == first.commit == env.head()


def test_a_forged_trailer_in_a_message_does_not_mark_another_change_set(env):
    victim = env.store.stage({"victim.md": b"v"})
    forger = env.store.stage(
        {"forger.md": b"f"}, message=f"Innocent\n\nStaged-Id: {victim}\nWorker: writer"
    )
    env.clear(forger)
    result = env.clear(victim)
    assert not result.already
    assert git(env.repo, "show", "HEAD:victim.md") == "v"


def test_trailer_values_with_newlines_are_refused(env):
    change_id = env.store.stage({"a.md": b"a"}, worker="w\nStaged-Id: other")
    with pytest.raises(ClearanceError, match="cannot be written as a commit trailer"):
        env.clear(change_id)


def test_an_empty_repository_gets_its_first_commit(tmp_path, monkeypatch):
    isolate_git(monkeypatch, tmp_path / "home")
    repo = tmp_path / "empty"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "T")
    git(repo, "config", "user.email", "t@example.invalid")
    store = FakeStore(tmp_path / "changes")
    change_id = store.stage({"first.md": b"first\n"})
    result = clear(store, change_id, repo, scanners=FakeScanners())
    assert git(repo, "rev-list", "--count", "HEAD") == "1"
    assert result.commit == git(repo, "rev-parse", "HEAD")


def test_a_missing_identity_is_explained(env):
    git(env.repo, "config", "--unset", "user.name")
    git(env.repo, "config", "--unset", "user.email")
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match=r"user\.name and user\.email"):
        env.clear(change_id, confirm=lambda s: True)
    assert env.status() == ""


def test_not_a_repository_or_not_its_top_is_refused(env, tmp_path):
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match="not the top of a git work tree"):
        clear(env.store, change_id, tmp_path, scanners=env.scanners)
    with pytest.raises(ClearanceError, match="not the top of a git work tree"):
        clear(env.store, change_id, env.repo / "src", scanners=env.scanners)


def test_config_read_from_the_work_tree_is_refused(env):
    (env.repo / "shared.gitconfig").write_text("[core]\n\tpager = touch pwned\n")
    git(env.repo, "config", "include.path", "../shared.gitconfig")
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match="a file in the work tree"):
        env.clear(change_id)


def test_configured_hook_commands_are_refused(env):
    git(env.repo, "config", "hook.lint.command", "touch pwned")
    git(env.repo, "config", "hook.lint.event", "pre-commit")
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match="hook.lint.command"):
        env.clear(change_id)


def test_redirecting_git_variables_are_refused(env, monkeypatch, tmp_path):
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match="GIT_DIR is set"):
        env.clear(change_id)


def test_every_refusal_is_audited_with_the_change_set(env):
    change_id = env.store.stage({".git/hooks/post-commit": b"x"})
    with pytest.raises(ClearanceError):
        env.clear(change_id)
    entry = env.audit.query(AuditFilter(operation="clearance.refused"))[-1]
    assert entry.allowed is False
    assert entry.metadata["change_id"] == change_id
    assert entry.worker == "writer"
    assert entry.run_id == "run1"
    assert change_id in (entry.reason or "")


def test_manifest_json_is_what_staging_writes(env):
    change_id = env.store.stage({"a.md": b"a"})
    data = json.loads((env.store.root / change_id / "manifest.json").read_text())
    assert set(data) >= {
        "id",
        "worker",
        "run_id",
        "session_id",
        "trust",
        "target",
        "message",
        "created_at",
        "status",
        "files",
        "rejected",
        "scans",
        "history",
    }
    assert os.path.isfile(env.store.blob_path(change_id, data["files"][0]["sha256"]))


def test_a_file_changed_since_staging_is_refused_in_the_work_tree(env):
    (env.repo / "src/app.py").write_text("print('v1b')\n")
    git(env.repo, "commit", "-q", "-am", "the user's newer edit")
    change_id = env.store.stage(
        {"src/app.py": b"print('v2')\n"},
        operations={"src/app.py": "update"},
        bases={"src/app.py": b"print('v1')\n"},
    )
    with pytest.raises(ClearanceError, match="changed in the work tree since the change set"):
        env.clear(change_id)
    assert (env.repo / "src/app.py").read_text() == "print('v1b')\n"


def test_a_file_changed_since_staging_is_refused_on_another_branch(env):
    git(env.repo, "checkout", "-q", "-b", "results")
    (env.repo / "src/app.py").write_text("print('v1b')\n")
    git(env.repo, "commit", "-q", "-am", "newer on results")
    git(env.repo, "checkout", "-q", "main")
    change_id = env.store.stage(
        {"src/app.py": b"print('v2')\n", "docs/old.md": None},
        operations={"src/app.py": "update"},
        bases={"src/app.py": b"print('v1')\n", "docs/old.md": b"old\n"},
    )
    with pytest.raises(ClearanceError, match="changed on branch results since"):
        env.clear(change_id, branch="results")
    fresh = env.store.stage(
        {"src/app.py": b"print('v2')\n", "docs/old.md": None},
        operations={"src/app.py": "update"},
        bases={"src/app.py": b"print('v1b')\n", "docs/old.md": b"old\n"},
    )
    result = env.clear(fresh, branch="results")
    assert git(env.repo, "show", f"{result.commit}:src/app.py") == "print('v2')"


def test_an_unchanged_base_is_accepted(env):
    change_id = env.store.stage(
        {"src/app.py": b"print('v2')\n", "docs/old.md": None},
        operations={"src/app.py": "update"},
        bases={"src/app.py": b"print('v1')\n", "docs/old.md": b"old\n"},
    )
    assert env.clear(change_id).commit == env.head()


def test_commit_signing_as_configured_is_applied(env, tmp_path):
    signer = tmp_path / "fake-gpg"
    signer.write_text("#!/bin/sh\necho signing-refused >&2\nexit 1\n")
    signer.chmod(0o755)
    git(env.repo, "config", "commit.gpgSign", "true")
    git(env.repo, "config", "gpg.program", str(signer))
    change_id = env.store.stage({"a.md": b"a"})
    with pytest.raises(ClearanceError, match="could not write the commit"):
        env.clear(change_id)
    assert env.store.manifest(change_id)["status"] == "pending"
    assert env.status() == ""  # the commit is written first: the work tree is untouched


def test_an_edit_made_while_the_prompt_waits_is_not_overwritten(env):
    change_id = env.store.stage(
        {"src/app.py": b"print('v2')\n"}, operations={"src/app.py": "update"}
    )

    def edit_then_confirm(summary):
        (env.repo / "src/app.py").write_text("the user's edit\n")
        return True

    with pytest.raises(ClearanceError, match="src/app.py has uncommitted changes"):
        env.clear(change_id, confirm=edit_then_confirm)
    assert (env.repo / "src/app.py").read_text() == "the user's edit\n"
    assert env.store.manifest(change_id)["status"] == "pending"


@pytest.mark.parametrize("branch", [None, "worker/out"])
def test_a_file_where_the_change_set_needs_a_folder_is_never_dropped(env, branch):
    before = env.head()
    change_id = env.store.stage({"README.md/notes.txt": b"sneaky\n"})
    with pytest.raises(ClearanceError):
        env.clear(change_id, branch=branch)
    assert env.head() == before
    assert git(env.repo, "show", "HEAD:README.md") == "hello"
    if branch:
        assert git(
            env.repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False
        ) in ("", before)


def test_a_change_set_rejected_while_clearing_does_not_move_the_branch(env):
    before = env.head()
    change_id = env.store.stage({"reports/late.md": b"late\n"})

    def reject_meanwhile(summary):
        env.store.set_status(change_id, "rejected", reason="changed my mind")
        return True

    with pytest.raises(ClearanceError, match="became rejected while clearing"):
        env.clear(change_id, confirm=reject_meanwhile)
    assert env.head() == before


class Runs:
    """Scanners like the staging package's: results with a name, ``ok`` and findings."""

    def __init__(self, sensitive: tuple[str, ...], other: tuple[str, ...] = ()) -> None:
        self.sensitive, self.other = sensitive, other

    def run(self, changeset, store):  # type: ignore[no-untyped-def]
        from orchestrator.staging import Finding, ScanResult

        def result(name: str, paths: tuple[str, ...]) -> ScanResult:
            found = tuple(Finding(f.path, "seen") for f in changeset.files if f.path in paths)
            return ScanResult(name, not found, found)

        return [result("sensitive-paths", self.sensitive), result("binary", self.other)]

    def blocking(self, results):  # type: ignore[no-untyped-def]
        return [r for r in results if not r.ok]


def test_files_that_run_code_need_each_path_acknowledged(env):
    env.scanners = Runs(("tests/conftest.py", "Makefile"))
    change_id = env.store.stage(
        {"tests/conftest.py": b"import os\n", "Makefile": b"all:\n", "a.md": b"a\n"}
    )
    before = env.head()
    both = "then pass --ack-sensitive tests/conftest.py --ack-sensitive Makefile"
    for kwargs, flags in (
        ({}, both),
        ({"override_scanners": True}, both),
        ({"acknowledged": ["Makefile"]}, "then pass --ack-sensitive tests/conftest.py"),
    ):
        with pytest.raises(ClearanceError) as refused:
            env.clear(change_id, **kwargs)
        assert "run code by themselves at the next build, test or CI run" in str(refused.value)
        assert str(refused.value).endswith(flags)
    with pytest.raises(ClearanceError, match="--ack-sensitive a.md names no file of it"):
        env.clear(change_id, acknowledged=["tests/conftest.py", "Makefile", "a.md"])
    assert env.head() == before and env.status() == ""
    assert env.store.manifest(change_id)["status"] == "pending"
    seen: list[Summary] = []
    result = env.clear(
        change_id,
        acknowledged=["Makefile", "tests/conftest.py"],
        confirm=lambda s: seen.append(s) or True,
    )
    assert result.commit == env.head() != before
    assert "ACKNOWLEDGED (runs code by itself): tests/conftest.py" in seen[0].render()
    entries = list(env.audit.query(AuditFilter()))
    refusals = [e for e in entries if e.operation == "clearance.refused"]
    assert len(refusals) == 4 and all(e.allowed is False for e in refusals)
    [ack] = [e for e in entries if e.operation == "clearance.acknowledged"]
    assert sorted(ack.metadata["paths"]) == ["Makefile", "tests/conftest.py"]
    assert "clearance.override" not in [e.operation for e in entries]


def test_an_acknowledgement_does_not_override_other_scanners(env):
    env.scanners = Runs(("conftest.py",), other=("conftest.py",))
    change_id = env.store.stage({"conftest.py": b"x\n"})
    with pytest.raises(ClearanceError, match="scanners block it: binary: conftest.py: seen"):
        env.clear(change_id, acknowledged=["conftest.py"])
    result = env.clear(change_id, acknowledged=["conftest.py"], override_scanners=True)
    assert result.commit == env.head()
    operations = [op for op, _ in env.operations()]
    assert "clearance.acknowledged" in operations and "clearance.override" in operations


def test_a_crashed_sensitive_paths_scanner_blocks_like_any_other(env):
    from orchestrator.staging import Finding, ScanResult

    class Crashed(Runs):
        def run(self, changeset, store):  # type: ignore[no-untyped-def]
            return [ScanResult("sensitive-paths", False, (Finding("", "scanner failed: boom"),))]

    env.scanners = Crashed(())
    change_id = env.store.stage({"Makefile": b"all:\n"})
    with pytest.raises(ClearanceError, match="scanners block it: sensitive-paths: scanner failed"):
        env.clear(change_id)
    assert env.clear(change_id, override_scanners=True).commit == env.head()
