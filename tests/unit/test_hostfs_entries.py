"""The one table of what an entry is, in each user's words."""

from __future__ import annotations

import stat

import pytest

from orchestrator.hostfs.entries import kind_of, kind_phrase, special_kind

CASES = [
    (stat.S_IFREG, "file", None),
    (stat.S_IFDIR, "folder", None),
    (stat.S_IFLNK, "symlink", "symbolic link"),
    (stat.S_IFIFO, "fifo", "FIFO (named pipe)"),
    (stat.S_IFSOCK, "socket", "socket"),
    (stat.S_IFCHR, "device", "character device"),
    (stat.S_IFBLK, "device", "block device"),
    (0, "other", "unknown file type"),
]


@pytest.mark.parametrize(("fmt", "kind", "special"), CASES)
def test_kind_and_precise_name(fmt: int, kind: str, special: str | None) -> None:
    mode = fmt | 0o644
    assert kind_of(mode) == kind
    assert special_kind(mode) == special


@pytest.mark.parametrize(
    ("fmt", "phrase"),
    [
        (stat.S_IFLNK, "a symbolic link"),
        (stat.S_IFIFO, "a FIFO"),
        (stat.S_IFSOCK, "a socket"),
        (stat.S_IFCHR, "a device file"),
        (stat.S_IFBLK, "a device file"),
        (0, "a special file"),
    ],
)
def test_phrase_for_inputs(fmt: int, phrase: str) -> None:
    assert kind_phrase(fmt | 0o644) == phrase
