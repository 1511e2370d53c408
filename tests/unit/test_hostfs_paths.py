"""The link-free walk every host path derived from a project goes through."""

from __future__ import annotations

import os

import pytest

from orchestrator.hostfs.paths import PathRefused, check_path, identity, open_path


def test_a_real_path_opens_the_folder_itself(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    fd = open_path(tmp_path / "a" / "b")
    try:
        assert identity(fd) == (os.stat(tmp_path / "a" / "b").st_dev,
                                os.stat(tmp_path / "a" / "b").st_ino)  # fmt: skip
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["middle", "last"])
def test_a_link_anywhere_is_refused_naming_it_and_its_target(tmp_path, where):
    (tmp_path / "real" / "b").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    path = tmp_path / "link" / "b" if where == "middle" else tmp_path / "link"
    with pytest.raises(PathRefused) as refused:
        os.close(open_path(path))
    assert refused.value.component == tmp_path / "link"
    assert refused.value.link == str(tmp_path / "real")
    assert str(refused.value) == f"{tmp_path / 'link'} is a symbolic link (to {tmp_path / 'real'})"


def test_dot_dot_is_the_real_parent_and_a_link_before_it_is_still_refused(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "l").symlink_to(tmp_path / "a" / "b")
    fd = open_path(tmp_path / "a" / "b" / "..")
    try:
        assert identity(fd)[1] == os.stat(tmp_path / "a").st_ino
    finally:
        os.close(fd)
    with pytest.raises(PathRefused):
        open_path(tmp_path / "l" / "..")  # the kernel would land in a/, lexically it is tmp


def test_missing_files_and_creation(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(PathRefused) as missing:
        open_path(tmp_path / "nope" / "deeper")
    assert missing.value.missing and missing.value.component == tmp_path / "nope"
    check_path(tmp_path / "nope" / "deeper")  # what exists is real folders: fine
    with pytest.raises(PathRefused, match="is not a folder"):
        open_path(tmp_path / "f")
    os.close(open_path(tmp_path / "f", file_ok=True))
    with pytest.raises(PathRefused, match="is not a folder"):
        open_path(tmp_path / "f" / "below", file_ok=True)
    os.close(open_path(tmp_path / "new" / "deep", create=0o700))
    assert (tmp_path / "new" / "deep").is_dir()


def test_creation_never_goes_through_a_link(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PathRefused, match="symbolic link"):
        open_path(tmp_path / "l" / "made", create=0o700)
    assert list((tmp_path / "elsewhere").iterdir()) == []
