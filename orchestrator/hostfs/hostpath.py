"""Host paths a person names (``session cp``, ``run --input``), never through a worker's link.

A worker can make symbolic links wherever it can write, and its zones and session folders
are host folders. A host path named for a copy may pass through one of them: after the
worker ran ``ln -s /some/host/folder /out/reports``, ``<project>/out/reports/keep.txt``
leads to ``/some/host/folder/keep.txt``, outside every zone. So the path is walked from
``/`` one component at a time, each folder opened ``O_NOFOLLOW`` relative to the one above
it: a link in a folder outside the guarded folders (the project, its zones, its sandbox
root) is the host's own (``/home`` to ``/usr/home``) and is followed, one inside them is
refused. ``..`` goes to the real parent of the folder reached, as the kernel would.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from orchestrator.hostfs.entries import lookup
from orchestrator.hostfs.flags import DIR_FLAGS

__all__ = ["HostPathError", "guarded_by", "open_parent", "real_parent"]

#: Links followed in one walk before giving up, as the kernel's own limit.
MAX_LINKS = 40


class HostPathError(Exception):
    """Why a host path is refused, as a phrase: "/p/out/reports is a symbolic link ..."."""


def guarded_by(folder: Path, guarded: Sequence[Path]) -> bool:
    """True when the real folder ``folder`` is one of ``guarded`` or inside one."""
    return any(folder == root or root in folder.parents for root in guarded)


def open_parent(path: Path, guarded: Sequence[Path], *, follow_last: bool) -> tuple[int, str]:
    """A descriptor for the real folder holding ``path``, and the name to open in it.

    Links in guarded folders are refused; others are followed, the last component's only
    with ``follow_last`` (a link left as the name is the caller's to refuse, with
    ``O_NOFOLLOW``). The name is ``""`` when ``path`` is ``/``.
    """
    fd, name, _ = _walk(path, guarded, follow_last=follow_last)
    return fd, name


def real_parent(path: Path, guarded: Sequence[Path]) -> Path:
    """``path`` with its folders resolved as :func:`open_parent` walks them (the last
    component kept as it is, even a link): for a check now and an open by path later
    that compares the inode it checked."""
    fd, name, here = _walk(path, guarded, follow_last=False)
    os.close(fd)
    return here / name if name not in ("", "..") else (here.parent if name else here)


def _walk(path: Path, guarded: Sequence[Path], *, follow_last: bool) -> tuple[int, str, Path]:
    parts = list((path if path.is_absolute() else Path.cwd() / path).parts[1:])
    here, fd = Path("/"), os.open("/", DIR_FLAGS)
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == ".":
                continue
            last = not parts
            found = lookup(fd, name) if name != ".." else None
            if found is not None and stat.S_ISLNK(found.st_mode) and (follow_last or not last):
                if guarded_by(here, guarded):
                    raise HostPathError(
                        f"{here / name} is a symbolic link in a folder a worker can write; "
                        "links there are never followed, name the real path"
                    )
                links += 1
                if links > MAX_LINKS:
                    raise HostPathError(f"{path} has too many levels of symbolic links")
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    here, fd = Path("/"), os.open("/", DIR_FLAGS)
                parts = [*Path(target).parts[1 if target.startswith("/") else 0 :], *parts]
                continue
            if last:
                return fd, name, here
            fd, here = _descend(fd, here, name), here.parent if name == ".." else here / name
        return fd, "", here
    except BaseException:
        os.close(fd)
        raise


def _descend(fd: int, here: Path, name: str) -> int:
    """The folder ``name`` (never a link) under ``fd``, which is closed."""
    try:
        child = os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        shown = here.parent if name == ".." else here / name
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a file, or a link swapped in just now
            raise HostPathError(f"{shown} is not a folder") from None
        raise HostPathError(f"{shown}: {exc.strerror}") from None
    os.close(fd)
    return child
