"""The host-side copy of a session folder for a snapshot or a fork
(:func:`orchestrator.runtime.host_folders.copy_into`): a worker's folder is hostile."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.errors import OrchestratorError
from orchestrator.runtime.host_folders import CopyBudget, copy_into


def test_files_links_and_folders_are_copied_links_never_followed(tmp_path: Path) -> None:
    source, target = tmp_path / "session", tmp_path / "copy"
    (source / "deep" / "er").mkdir(parents=True)
    target.mkdir()
    (source / "deep" / "er" / "f.txt").write_text("kept\n")
    (tmp_path / "secret").write_text("host file\n")
    (source / "link").symlink_to(tmp_path / "secret")
    os.mkfifo(source / "fifo")
    (source / "setuid").write_text("x")
    os.chmod(source / "setuid", 0o4755)
    size = copy_into(source, target, None, CopyBudget(1 << 20))
    assert (target / "deep" / "er" / "f.txt").read_text() == "kept\n"
    assert (target / "link").is_symlink()
    assert os.readlink(target / "link") == str(tmp_path / "secret")
    assert not (target / "fifo").exists()
    assert not stat.S_IMODE((target / "setuid").stat().st_mode) & (stat.S_ISUID | stat.S_ISGID)
    assert size == len("kept\n") + 1


def test_a_sparse_file_beyond_the_budget_stops_the_copy(tmp_path: Path) -> None:
    source, target = tmp_path / "session", tmp_path / "copy"
    source.mkdir()
    target.mkdir()
    with open(source / "sparse", "wb") as handle:
        handle.truncate(1 << 40)  # a terabyte that takes no block
    with pytest.raises(OrchestratorError) as refused:
        copy_into(source, target, None, CopyBudget(8 << 20))
    assert "more than a copy may take" in str(refused.value)
    assert (target / "sparse").stat().st_size <= 8 << 20


def test_a_tree_deeper_than_the_budget_stops_the_copy(tmp_path: Path) -> None:
    source, target = tmp_path / "session", tmp_path / "copy"
    deep = source
    for _ in range(12):
        deep = deep / "d"
    deep.mkdir(parents=True)
    target.mkdir()
    with pytest.raises(OrchestratorError) as refused:
        copy_into(source, target, None, CopyBudget(1 << 20, depth=5))
    assert "folders deep" in str(refused.value) and "\n" not in str(refused.value)
