"""Paths and glob patterns expanded without following a link (a batch's inputs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.hostfs.expand import MAX_DEPTH, TooDeep, expand, files_in
from orchestrator.hostfs.paths import PathRefused
from tests.conftest import deep_tree


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for rel in ("a/1.txt", "a/2.md", "a/sub/3.txt", "b/4.txt", "a-c.txt", ".hidden/5.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    return tmp_path


def rel(root: Path, paths: list[Path]) -> list[str]:
    return [str(p.relative_to(root)) for p in paths]


def test_patterns_match_as_glob_does_in_name_order(tree):
    assert rel(tree, expand(tree / "*" / "*.txt")) == ["a/1.txt", "b/4.txt"]
    assert rel(tree, expand(tree / "**" / "*.txt")) == [
        "a/1.txt", "a/sub/3.txt", "a-c.txt", "b/4.txt",
    ]  # fmt: skip
    assert rel(tree, expand(tree / ".*" / "*")) == [".hidden/5.txt"]
    # a folder stands for every file under it, hidden ones too, each folder in name order
    assert rel(tree, files_in(tree)) == [
        ".hidden/5.txt", "a/1.txt", "a/2.md", "a/sub/3.txt", "a-c.txt", "b/4.txt",
    ]  # fmt: skip
    assert expand(tree / "nothing*") == []


@pytest.mark.parametrize(
    "pattern", ["*/*", "*/*.txt", "**/*.txt", "zz-evil/*", "*", "**", "zz-*/id_*"]
)
def test_a_link_anywhere_on_a_path_that_could_match_is_refused(tree, tmp_path_factory, pattern):
    victim = tmp_path_factory.mktemp("victim")
    (victim / "id_rsa").write_text("PRIVATE KEY")
    (victim / "id_rsa.txt").write_text("PRIVATE KEY")
    os.symlink(victim, tree / "zz-evil")
    with pytest.raises(PathRefused) as refused:
        expand(tree / pattern)
    assert refused.value.link == str(victim)
    assert str(tree / "zz-evil") in str(refused.value)


def test_a_link_in_the_folders_above_is_refused_too(tree, tmp_path):
    os.symlink(tree / "a", tmp_path / "linked")
    for path in (tmp_path / "linked" / "1.txt", tmp_path / "linked" / "*.txt"):
        with pytest.raises(PathRefused, match="linked is a symbolic link"):
            expand(path)


def test_a_link_a_pattern_does_not_reach_is_left_alone(tree):
    os.symlink("/etc/passwd", tree / "a" / "passwd")
    assert rel(tree, expand(tree / "a" / "*.txt")) == ["a/1.txt"]
    with pytest.raises(PathRefused, match="passwd is a symbolic link"):
        expand(tree / "**" / "4.txt")  # '**' could cross it: it could be a folder
    (tree / "a" / "passwd").unlink()
    os.symlink("/etc", tree / ".dotlink")  # '**' never crosses a hidden name
    assert rel(tree, expand(tree / "**" / "4.txt")) == ["b/4.txt"]


def test_fifos_are_refused_not_opened(tree):
    os.mkfifo(tree / "a" / "pipe.txt")
    with pytest.raises(PathRefused, match="pipe.txt is a FIFO"):
        expand(tree / "a" / "*.txt")


def test_a_tree_deeper_than_the_cap_is_refused_without_recursion(tmp_path):
    # deeper than the recursion limit, and than PATH_MAX allows as one path
    with deep_tree(tmp_path / "deep", 1500) as deep:
        for walk in (lambda: files_in(deep), lambda: expand(deep / "**" / "*.txt")):
            with pytest.raises(TooDeep, match=f"more than {MAX_DEPTH} levels deep"):
                walk()
