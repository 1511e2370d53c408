"""Writable folders an adapter adds to a worker's plan: size-capped tmpfs mounts.

The worker's root filesystem is read-only; a harness that places files at fixed paths
(Inspect's tool helper under ``/var/tmp``, Harbor's ``/logs``, ``/tests`` and
``/solution``) gets each such folder as a tmpfs of the run's own, counted in its memory
limit and never larger than it. Pure: no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from orchestrator.plan import Tmpfs
from orchestrator.prepare import Prepared

__all__ = ["with_tmpfs"]


def with_tmpfs(
    prepared: Prepared, folders: Sequence[tuple[str, int]], *, owned: bool = False
) -> Prepared:
    """``prepared`` with a tmpfs at each ``(target, size)`` it does not have yet; each
    at most the memory limit (its pages count there anyway). ``owned``: its root folder
    belongs to the worker (mode 0755) instead of being sticky and world-writable."""
    spec = prepared.spec
    added = [
        Tmpfs(target, size=min(size, spec.limits.memory), mode=0o755, uid=spec.uid, gid=spec.gid)
        if owned
        else Tmpfs(target, size=min(size, spec.limits.memory), mode=0o1777)
        for target, size in folders
        if spec.tmpfs_at(target) is None
    ]
    if not added:
        return prepared
    return replace(prepared, spec=replace(spec, tmpfs=[*spec.tmpfs, *added]))
