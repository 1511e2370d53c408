"""Writable folders an adapter adds to a worker's plan: size-capped tmpfs mounts.

The worker's root filesystem is read-only; a harness that places files at fixed paths
(Inspect's tool helper under ``/var/tmp``, Harbor's ``/logs``, ``/tests`` and
``/solution``) gets each such folder as a tmpfs of the run's own, counted in its memory
limit and never larger than it. Pure: no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from orchestrator.plan import ContainerSpec, Tmpfs
from orchestrator.prepare import Prepared

__all__ = ["read_only_at", "with_tmpfs", "writable"]


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


def _within(folder: str, place: str) -> bool:
    return folder == place or folder.startswith(place.rstrip("/") + "/")


def writable(spec: ContainerSpec, folder: str) -> bool:
    """Whether the worker can write ``folder`` already: in one of its tmpfs folders or a
    zone it has read-write, or anywhere but a read-only mount on a writable root."""
    if not spec.read_only_rootfs and read_only_at(spec, folder) is None:
        return True
    places = [t.target for t in spec.tmpfs if not t.mask]
    places += [m.target for m in spec.mounts if not m.read_only]
    return any(_within(folder, place) for place in places)


def read_only_at(spec: ContainerSpec, folder: str) -> str | None:
    """The read-only mount (or mask) ``folder`` is in, if any: a tmpfs cannot be added
    there."""
    places = [m.target for m in spec.mounts if m.read_only]
    places += [t.target for t in spec.tmpfs if t.mask]
    return next((place for place in places if _within(folder, place)), None)
