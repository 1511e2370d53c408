"""Path rules, the symlink-proof work tree and the commit message, without git."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.clearance import ClearanceError
from orchestrator.clearance.paths import check_paths, split
from orchestrator.clearance.store import FileChange
from orchestrator.clearance.summary import Summary, SummaryFile, commit_message
from orchestrator.staging.worktree import UnsafePath, WorkTree

PART = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/"), min_size=0, max_size=8
)


@given(st.lists(PART, min_size=1, max_size=5))
def test_an_accepted_path_stays_inside_and_never_reaches_git(parts):
    path = "/".join(parts)
    try:
        accepted = split(path)
    except ValueError:
        return
    assert "/".join(accepted) == path
    for part in accepted:
        assert part not in ("", ".", "..")
        assert part.rstrip(". ").lower() != ".git"
        assert all(ord(c) >= 0x20 and ord(c) != 0x7F for c in part)


def change(path):
    return FileChange(path, "create", 1, "0" * 64, 0o644)


def test_duplicates_and_file_folder_clashes_are_refused():
    with pytest.raises(ClearanceError, match="listed twice"):
        check_paths("c1", [change("a"), change("a")])
    with pytest.raises(ClearanceError, match="both a file and a folder"):
        check_paths("c1", [change("a"), change("a/b")])
    with pytest.raises(ClearanceError, match="orchestrator's own state"):
        check_paths("c1", [change("state/x")], protected=["state"])
    assert check_paths("c1", [change("a/b"), change("a/c")]) == {
        "a/b": ("a", "b"),
        "a/c": ("a", "c"),
    }


def test_the_work_tree_writes_with_the_mode_and_refuses_links(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    blob = tmp_path / "blob"
    blob.write_bytes(b"data")
    import hashlib

    digest = hashlib.sha256(b"data").hexdigest()
    tree = WorkTree(root)
    tree.write(("a", "b", "x.sh"), blob, digest, 0o755, ".tmp")
    assert (root / "a/b/x.sh").read_bytes() == b"data"
    assert (root / "a/b/x.sh").stat().st_mode & 0o777 == 0o755
    assert tree.entry(("a", "b", "x.sh")).holds(digest, 0o755)
    assert not tree.entry(("a", "b", "x.sh")).holds(digest, 0o644)
    os.symlink(tmp_path, root / "link")
    with pytest.raises(UnsafePath, match="symlink"):
        tree.write(("link", "x"), blob, digest, 0o644, ".tmp")
    with pytest.raises(UnsafePath, match="symlink"):
        tree.entry(("link", "x"))
    with pytest.raises(UnsafePath, match="changed"):
        tree.write(("c",), blob, "f" * 64, 0o644, ".tmp")
    assert not (root / "c").exists()
    assert not (root / ".tmp").exists()
    tree.delete(("a", "b", "x.sh"))
    assert not (root / "a").exists()


def test_the_trailers_are_always_the_last_paragraph():
    message = commit_message(
        "abc123", "Title\r\n\r\nStaged-Id: other\x07\n\n", {"Worker": "w", "Trust": "full"}
    )
    assert message == "Title\n\nStaged-Id: other\n\nStaged-Id: abc123\nWorker: w\nTrust: full\n"
    assert commit_message("abc123", "  \n", {"Worker": "w"}).startswith("Changes from worker w\n")


def test_the_summary_renders_without_control_characters(tmp_path):
    summary = Summary(
        change_id="abc",
        worker="w",
        run_id="r",
        trust="full",
        message="hi\x1b[2J",
        repo=tmp_path,
        branch="main",
        new_branch=False,
        work_tree=True,
        files=(SummaryFile("a.md", "create", 1234, 0o644), SummaryFile("b.md", "delete", 0, None)),
        scans=("secrets: a.md: token\x1b]0;x",),
        blocking=(),
        override_scanners=False,
        push=True,
        remote="origin",
        credential="forge",
    )
    text = summary.render()
    assert "\x1b" not in text
    assert "1,234 B" in text
    assert "push main to 'origin' with credential 'forge'" in text
