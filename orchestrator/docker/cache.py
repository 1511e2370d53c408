"""The user's cache folder for what the Docker adapter keeps across processes.

``$XDG_CACHE_HOME/orchestrator/NAME`` (default ``~/.cache/orchestrator/NAME``): made 0700
when missing, and used only when it is a folder of this user that no one else may write
(anything else: None, and the caller does without a cache).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["user_cache"]


def user_cache(name: str) -> Path | None:
    """This user's cache folder ``name``, or None when it cannot be one safely."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(root) / "orchestrator" / name
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(folder)
    except OSError:
        return None
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        return None
    return folder
