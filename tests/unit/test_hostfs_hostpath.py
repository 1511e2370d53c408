"""Host paths for ``session cp``: links in the project, its zones and sandbox root are never
followed; the host's own links elsewhere are, with ``..`` resolved as the kernel does."""

from __future__ import annotations

import os

import pytest

from orchestrator.hostfs.hostpath import HostPathError, open_parent


def where(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "project" / "zone" / "sub").mkdir(parents=True)
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    return tmp_path


def test_a_link_inside_a_guarded_folder_is_refused_at_any_depth(tree):
    zone = tree / "project" / "zone"
    (zone / "planted").symlink_to(tree / "elsewhere")
    (zone / "sub" / "up").symlink_to("../../../elsewhere")
    for path in (zone / "planted" / "x.txt", zone / "sub" / "up" / "deep" / "x.txt"):
        with pytest.raises(HostPathError, match="is a symbolic link in a folder a worker"):
            open_parent(path, [tree / "project"], follow_last=False)
    with pytest.raises(HostPathError, match="symbolic link"):
        open_parent(zone / "planted", [tree / "project"], follow_last=True)
    fd, name = open_parent(zone / "planted", [tree / "project"], follow_last=False)
    assert (where(fd), name) == (str(zone), "planted")  # the caller refuses it by O_NOFOLLOW


def test_host_links_outside_are_followed_and_dotdot_is_real(tree):
    (tree / "alias").symlink_to("elsewhere/deep")
    (tree / "abs").symlink_to(tree / "project" / "zone")
    fd, name = open_parent(tree / "alias" / "f.txt", [tree / "project"], follow_last=True)
    assert (where(fd), name) == (str(tree / "elsewhere" / "deep"), "f.txt")
    fd, name = open_parent(tree / "abs" / "sub" / "f.txt", [tree / "project"], follow_last=False)
    assert (where(fd), name) == (str(tree / "project" / "zone" / "sub"), "f.txt")
    # the kernel's "..": the real parent of where the link led, not a lexical step back
    fd, name = open_parent(tree / "alias" / ".." / "f.txt", [], follow_last=True)
    assert where(fd) == str(tree / "elsewhere")


def test_loops_files_and_missing_folders_are_one_line_refusals(tree):
    (tree / "loop").symlink_to("loop")
    (tree / "file").write_text("x")
    with pytest.raises(HostPathError, match="too many levels"):
        open_parent(tree / "loop" / "x", [], follow_last=True)
    with pytest.raises(HostPathError, match="is not a folder"):
        open_parent(tree / "file" / "x", [], follow_last=True)
    with pytest.raises(HostPathError, match="No such file"):
        open_parent(tree / "none" / "x", [], follow_last=True)
