"""Whether another local user could change a file the orchestrator is about to trust.

A project file or a worker file says which host folders a container gets, read-write: who
can write one chooses what the next run may touch. So such a file is trusted only when
nobody but this user (or root, or an owner the caller trusts) could change it, or put
another file in its place: the file and every folder above it (its real path, the host's
own links resolved) belong to root, this user or a trusted owner; the file is writable by
no one else; a folder is writable by no one else either, unless it has the sticky bit
(``/tmp``: others may add names there, never replace ours). A group counts as no one else
when it is a private group of this user alone.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Collection
from pathlib import Path

__all__ = ["others_can_write", "others_may_write"]


def others_can_write(path: Path, *, trusted: Collection[int] = ()) -> str | None:
    """Why another user could change the file at the real path ``path``, as a phrase with
    the fix ("/srv/p/orchestrator.yaml has mode 0664 ...; `chmod g-w,o-w ...`"), or None."""
    euid = os.geteuid()
    owners = {0, euid, *trusted}
    for here in [*reversed(path.parents), path]:
        try:
            info = os.lstat(here)
        except OSError as exc:
            return f"{here}: {exc.strerror}"
        if info.st_uid not in owners:
            return (
                f"{here} belongs to uid {info.st_uid}, who could change what it holds; use "
                "a copy of your own"
            )
        folder = stat.S_ISDIR(info.st_mode)
        if others_may_write(info) and not (folder and info.st_mode & stat.S_ISVTX):
            mode = f"{stat.S_IMODE(info.st_mode):04o}"
            return (
                f"{here} has mode {mode}: other users could change "
                f"{'what it holds' if folder else 'it'}; `chmod g-w,o-w {here}`"
            )
    return None


def others_may_write(info: os.stat_result) -> bool:
    """Whether a user other than the effective one may write what ``info`` describes: it
    is writable by others, or by a group that is not the user's own private group."""
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and not _own_group(info.st_gid, os.geteuid())


def _own_group(gid: int, euid: int) -> bool:
    """Whether group ``gid`` is the private group of user ``euid`` alone: its primary
    group, with no other member and no other user's primary group."""
    try:
        group = grp.getgrgid(gid)
        me = pwd.getpwuid(euid)
    except KeyError:
        return False
    if me.pw_gid != gid or any(member != me.pw_name for member in group.gr_mem):
        return False
    return all(user.pw_uid == euid for user in pwd.getpwall() if user.pw_gid == gid)
