"""A run's own folder (``<sandbox root>/runs/<id>/``), and ``gc`` of those dead runs left.

A run's folder holds its inputs, its ``ask`` copies, its broker socket (and a swarm run's
results); :meth:`orchestrator.runtime.run.Run.close` removes it. A SIGKILLed orchestrator
cannot, so the folder records its owner process when it is made (:func:`claim`: ``owner.json``,
the labels its containers carry), and ``orchestrator gc`` removes the folders of owners that
are gone (:func:`sweep`), each audited as ``gc.run_folder_removed``. Left alone:

- a folder whose owner is alive (or, without ``--all``, in another pid namespace), or whose
  owner is not recorded (being made now, or made before owners were recorded);
- a folder holding an access record (``access.json``): it still lists what the run opened up
  for its worker, and the access sweep (:func:`orchestrator.runtime.access.sweep`) removes it
  once that is put back;
- a mount point, or a folder with one inside (another device than ``runs/``, or listed in
  ``/proc/self/mountinfo``): never entered, reported;
- anything but a folder (a link is never followed).

Removal walks by directory descriptors opened ``O_NOFOLLOW`` and checks the device of each
folder it enters again, so neither a link nor a mount made meanwhile leads it elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import labels
from orchestrator.audit import AuditLog
from orchestrator.hostfs.flags import DIR_FLAGS
from orchestrator.runtime.access_record import RECORD

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"


@dataclass
class FolderSweep:
    """What :func:`sweep` did: run ids removed, and those left with the reason."""

    removed: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    in_use: int = 0


def claim(run_dir: Path, run_labels: dict[str, str]) -> None:
    """Make the run's folder (0700) and record in it, before anything else goes there, the
    process that owns it: this one (its pid, start time and pid namespace), with
    ``run_labels`` (the run id and worker its containers carry)."""
    run_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_dir.mkdir(mode=0o700, exist_ok=True)
    owner = {**run_labels, **labels.current_owner().labels()}
    folder = os.open(run_dir, DIR_FLAGS)
    try:
        temporary = f"{OWNER_FILE}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, 0o600, dir_fd=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(owner, handle)
        os.replace(temporary, OWNER_FILE, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)


def sweep(
    sandbox_root: Path, *, everything: bool = False, audit: AuditLog | None = None
) -> FolderSweep:
    """Remove the run folders of dead owners (see the module's docstring)."""
    done = FolderSweep()
    runs = sandbox_root / "runs"
    try:
        top = os.open(runs, DIR_FLAGS)
    except OSError:
        return done  # none, or not a folder: nothing of ours to walk
    try:
        base = os.path.realpath(runs)
        device = os.fstat(top).st_dev
        mounts = mount_points()
        for name in sorted(os.listdir(top)):
            where = f"{base}/{name}"
            why = _why_kept(top, name, where, device, mounts, everything)
            if why in ("alive", "gone"):
                done.in_use += why == "alive"
                continue
            if why:
                done.left.append((name, why))
                continue
            found: list[str] = []
            _remove(top, name, where, device, mounts, found)
            if found:  # a mount appeared meanwhile: never entered
                done.left.append((name, f"a mount point inside, not entered: {found[0]}"))
                continue
            if name in os.listdir(top):
                done.left.append((name, "could not remove it all"))
                continue
            done.removed.append(name)
            if audit is not None:
                audit.record("gc.run_folder_removed", run_id=name, path=where)
    finally:
        os.close(top)
    return done


def _why_kept(
    top: int, name: str, where: str, device: int, mounts: set[str], everything: bool
) -> str:
    """Why ``runs/name`` stays ('' if it goes; ``alive`` when its owner is, ``gone`` when
    the folder is)."""
    try:
        info = os.stat(name, dir_fd=top, follow_symlinks=False)
    except OSError:
        return "gone"
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder"
    inside = _mounts_within(top, name, where, device, mounts)
    if inside:
        return f"a mount point, not entered: {inside[0]}"
    owner = _owner(top, name)
    if owner is None:
        return "no owner recorded"
    state = labels.owner_state(owner)
    if state == "alive":
        return "alive"
    if state == "foreign" and not everything:
        return "its owner is in another pid namespace (gc --all removes it)"
    if _exists(top, f"{name}/{RECORD}"):
        return f"{RECORD} still lists access to put back (see gc's access sweep)"
    return ""


def _owner(top: int, name: str) -> dict[str, str] | None:
    """The owner labels of ``runs/name``: its owner file, else its access record's."""
    for file, key in ((OWNER_FILE, None), (RECORD, "process")):
        try:
            folder = os.open(name, DIR_FLAGS, dir_fd=top)
        except OSError:
            return None
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except OSError:
            continue
        finally:
            os.close(folder)
        try:
            with os.fdopen(fd, encoding="utf-8") as handle:
                data = json.load(handle)
            found = data[key] if key else data
            return {str(k): str(v) for k, v in found.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the unreadable %s of run folder %s: %s", file, name, exc)
    return None


def _exists(top: int, relative: str) -> bool:
    try:
        os.stat(relative, dir_fd=top, follow_symlinks=False)
    except OSError:
        return False
    return True


def _mounts_within(top: int, name: str, where: str, device: int, mounts: set[str]) -> list[str]:
    """The mount points at or under ``runs/name`` (walked by descriptors, links not followed)."""
    if where in mounts:
        return [where]
    found = [m for m in mounts if m.startswith(where + "/")]
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=top)
    except OSError:
        return found
    try:
        if os.fstat(fd).st_dev != device:
            return [where]
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                found += _mounts_within(fd, entry.name, f"{where}/{entry.name}", device, mounts)
    finally:
        os.close(fd)
    return found


def _remove(
    parent: int, name: str, where: str, device: int, mounts: set[str], found: list[str]
) -> None:
    """Remove ``name`` under the folder ``parent``: never through a link, never into a
    mount point (another device, or a listed mount point: added to ``found``)."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:  # not a folder (or a link to one): the entry itself goes
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=parent)
        return
    try:
        if os.fstat(fd).st_dev != device or where in mounts:
            found.append(where)
            return
        for entry in list(os.scandir(fd)):
            _remove(fd, entry.name, f"{where}/{entry.name}", device, mounts, found)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):  # left non-empty when something could not go
        os.rmdir(name, dir_fd=parent)


def mount_points() -> set[str]:
    """The mount points of this process's mount namespace (``/proc/self/mountinfo``)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            found.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
    return found
