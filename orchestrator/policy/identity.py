"""Which host identity a container runs as.

A worker runs as the invoking user's uid:gid so files it writes into a rw zone belong to
that user. It never runs as uid 0: when the orchestrator itself runs as root, the worker
gets the sudo caller's identity, else the project folder's owner, else ``nobody``.
"""

from __future__ import annotations

import os
from pathlib import Path

NOBODY = (65534, 65534)


def worker_identity(project_root: Path) -> tuple[int, int]:
    """Return the uid and gid a worker container runs as (never 0)."""
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        return uid, (gid if gid != 0 else uid)
    sudo_uid, sudo_gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    if sudo_uid.isdigit() and int(sudo_uid) != 0:
        return int(sudo_uid), int(sudo_gid) if sudo_gid.isdigit() else int(sudo_uid)
    try:
        info = project_root.stat()
    except OSError:
        return NOBODY
    if info.st_uid != 0:
        return info.st_uid, info.st_gid if info.st_gid != 0 else info.st_uid
    return NOBODY
