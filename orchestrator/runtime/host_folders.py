"""The host folders a prepared run will mount (:mod:`orchestrator.prepare` checks and
compiles it, touching nothing). :func:`make_host_folders` runs just before the
container is created: it makes the run's own folders, checks every zone can be used by the
worker's uid, and refuses any mount source that leads through a symlink.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.audit import AuditLog
from orchestrator.config import Project
from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.entries import open_entry, permits
from orchestrator.hostfs.flags import DIR_FLAGS
from orchestrator.hostfs.paths import PathRefused, check_path, open_path
from orchestrator.policy.grant import ZoneGrant
from orchestrator.prepare import Prepared
from orchestrator.runtime import run_folders
from orchestrator.runtime.session_folders import touch
from orchestrator.runtime.state_root import checked_state_root, open_state_root

AUDIT_FILE = "audit.jsonl"


def make_host_folders(prepared: Prepared) -> None:
    """Create the run's folders and check every mount source before the container exists."""
    uid, gid, paths = prepared.uid, prepared.gid, prepared.paths
    checked_state_root(prepared.project)
    # As root, folders made for the worker belong to the project folder's owner, and the
    # worker's uid gets its access for the run only (runtime.access, when the run opens).
    owner = (uid, gid) if os.geteuid() != 0 else project_owner(prepared.project.root)
    if uses_run_dir(prepared):  # its owner first, so that gc can tell when it is left over
        run_folders.claim(paths.run_dir, prepared.spec.labels)
    for zone in prepared.grant.zones:
        if zone.outbox:
            continue  # a tmpfs inside the container
        if zone.ask_base is not None:
            check_zone(replace(zone, host_path=zone.ask_base, ask_base=None), uid, gid)
            # As root, the copy holds what the grant lets the worker read: everything.
            whole = os.geteuid() == 0 and zone.ask_base.stat().st_uid != uid
            # Two copies: the worker's, and the snapshot its changes are measured against,
            # so that edits made to the zone meanwhile are conflicts, never silently undone.
            private_copy(zone.ask_base, pristine_of(zone.host_path), uid, gid, whole=whole)
            private_copy(zone.ask_base, zone.host_path, uid, gid, whole=whole)
        ours = zone.standard and zone.name in ("session", "workspace")
        missing_output = not zone.standard and not zone.read_only and not zone.host_path.exists()
        if ours or missing_output:
            owned_folder(zone.host_path, *owner)
        if ours and zone.name == "session":
            touch(zone.host_path)  # used now: `gc --sessions-older-than` counts from here
        check_zone(zone, uid, gid)
    if prepared.grant.children:
        owned_folder(paths.broker_dir, uid, gid)
    if prepared.spec.inputs is not None:
        owned_folder(paths.inputs_dir, uid, gid)  # filled by runtime.inputs.place_inputs


def path_violations(project: Project) -> list[str]:
    """Links on the project's zone paths and its own folders (sandbox root, workers, repo),
    one line each: after a run, what a worker may have planted to redirect later runs."""
    named = [(f"zone '{z.name}'", z.host_path) for z in project.zones.values()]
    named += [
        ("the sandbox root", project.sandbox_root),
        ("the workers folder", project.workers_dir),
        ("the repo", project.repo),
    ]
    found: list[str] = []
    for what, path in named:
        try:
            check_path(path, file_ok=True)
        except PathRefused as refused:
            if refused.link is not None:
                found.append(
                    f"{what}: {refused.component} is now a symbolic link (to {refused.link}); "
                    f"every run refuses this project until a person removes it (`rm "
                    f"{refused.component}`) and checks what it pointed at"
                )
    return found


def uses_run_dir(prepared: Prepared) -> bool:
    """Whether the run keeps something in its own folder: ``ask`` copies, a broker's socket
    inputs, or the CA bundle of egress credentials (a swarm run's results are claimed by
    the swarm; an access record holds its owner itself)."""
    grant = prepared.grant
    asks = any(zone.ask_base is not None for zone in grant.zones)
    own = bool(grant.children) or bool(grant.egress) or prepared.spec.inputs is not None
    return asks or own


def pristine_of(copy: Path) -> Path:
    """The snapshot beside an ``ask`` zone's private copy (``runs/<id>/ask-base/<zone>``)."""
    return copy.parent.parent / "ask-base" / copy.name


def private_copy(source: Path, target: Path, uid: int, gid: int, *, whole: bool = False) -> None:
    """Copy a zone for an ``ask`` run: folders and regular files, links as links.

    Walks with directory descriptors opened ``O_NOFOLLOW`` and opens files ``O_NOFOLLOW |
    O_NONBLOCK``, checking the type on the open descriptor: a folder swapped for a link, or
    a file for a FIFO, while copying is skipped, never followed or waited on. Entries the
    worker's own uid could not read are left out (root copies on its behalf), unless
    ``whole``: root running a worker whose grant reads the zone, whatever its modes say.
    """
    target.mkdir(mode=0o700, parents=True)
    top = open_path(source)
    try:
        _copy_folder(top, target, uid if not whole else -1, gid if not whole else -1)
    finally:
        os.close(top)
    if os.getuid() == 0:
        for folder, dirs, files in os.walk(target):
            for name in (".", *dirs, *files):
                os.chown(Path(folder) / name, uid, gid, follow_symlinks=False)


@dataclass
class CopyBudget:
    """Bounds of one :func:`copy_into`: the bytes it may write (a sparse file counts its
    whole size: the copy is dense) and how deep it may go."""

    bytes: int
    depth: int = 256


def copy_into(source: Path, target: Path, owner: tuple[int, int] | None, budget: CopyBudget) -> int:
    """Copy everything in the folder ``source`` into the existing, empty folder ``target``
    as :func:`private_copy` does (no link followed: links copied as links; FIFOs, sockets
    and devices left out; set-id bits never copied); as root, each copy is then given to
    ``owner``. Past ``budget`` (bytes, depth) it stops with a one-line
    :class:`~orchestrator.errors.OrchestratorError`. The bytes of the regular files copied.
    (A session's snapshot and fork: :mod:`orchestrator.runtime.snapshots`.)"""
    top = open_path(source)
    try:
        _copy_folder(top, target, -1, -1, budget=budget, label=str(source))
    finally:
        os.close(top)
    size = 0
    for folder, dirs, files in os.walk(target):
        for name in files:
            info = os.lstat(Path(folder) / name)
            size += info.st_size if stat.S_ISREG(info.st_mode) else 0
        if os.getuid() == 0 and owner is not None:
            for name in (*dirs, *files):
                os.chown(Path(folder) / name, *owner, follow_symlinks=False)
    return size


def _copy_folder(
    folder: int,
    into: Path,
    uid: int,
    gid: int,
    *,
    budget: CopyBudget | None = None,
    label: str = "",
    depth: int = 0,
) -> None:
    if budget is not None and depth > budget.depth:
        raise OrchestratorError(
            f"{label} is more than {budget.depth} folders deep; a copy stops there"
        )
    with os.scandir(folder) as entries:
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            if uid >= 0 and not permits(info, uid, gid, "r") and not stat.S_ISLNK(info.st_mode):
                continue  # not the worker's to read
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(entry.name, dir_fd=folder), into / entry.name)
                continue
            if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                continue  # FIFOs, sockets, devices: never opened
            opened_entry = open_entry(folder, entry.name, info)
            if opened_entry is None:
                continue  # swapped for a link or something else, or gone
            fd, opened = opened_entry
            try:
                if stat.S_ISDIR(opened.st_mode):
                    if uid < 0 or permits(opened, uid, gid, "rx"):
                        (into / entry.name).mkdir(mode=0o700)
                        _copy_folder(fd, into / entry.name, uid, gid, budget=budget, label=label,
                                     depth=depth + 1)  # fmt: skip
                elif stat.S_ISREG(opened.st_mode):
                    with open(into / entry.name, "xb") as out, os.fdopen(os.dup(fd), "rb") as src:
                        if budget is None:
                            shutil.copyfileobj(src, out, 1 << 20)
                        else:
                            _copy_budgeted(src, out, budget, label)
                    os.chmod(into / entry.name, opened.st_mode & 0o755)
            finally:
                os.close(fd)


def _copy_budgeted(src: Any, out: Any, budget: CopyBudget, label: str) -> None:
    while chunk := src.read(1 << 20):
        budget.bytes -= len(chunk)
        if budget.bytes < 0:
            raise OrchestratorError(
                f"{label} holds more than a copy may take; remove what it need not keep"
            )
        out.write(chunk)


def open_audit(project: Project) -> AuditLog:
    """The project's audit log, in its sandbox root, made and checked first
    (:mod:`~orchestrator.runtime.state_root`), and reached through the checked root's
    descriptor from then on."""
    return AuditLog(project.sandbox_root / AUDIT_FILE, folder=open_state_root(project))


def project_owner(root: Path) -> tuple[int, int]:
    """The project folder's owner: who gets the files a worker made, when root runs it."""
    info = root.stat()
    return info.st_uid, info.st_gid


def owned_folder(folder: Path, uid: int, gid: int) -> None:
    """Create ``folder`` for the worker's uid, each missing folder made in the one above
    it, never through a symlink (a worker may have planted one on the way)."""
    try:
        parent = open_path(folder.parent, create=0o777)  # as mkdir -p: the umask applies
    except PathRefused as refused:
        raise OrchestratorError(
            f"{folder} would be created through {refused.reason}; refusing "
            "(a worker may have planted it)"
        ) from None
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder.name, 0o700, dir_fd=parent)
        fd = os.open(folder.name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise OrchestratorError(f"{folder} cannot be made a folder here: {exc.strerror}") from None
    finally:
        os.close(parent)
    try:
        if os.getuid() == 0 and os.fstat(fd).st_uid != uid:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def check_zone(zone: ZoneGrant, uid: int, gid: int) -> None:
    """Refuse a mount source that is missing, not a folder, reached through a symlink, or
    unusable by the worker's uid: a clear message now instead of a confusing failure inside."""
    path = zone.host_path
    label = f"zone '{zone.name}' ({zone.target})"
    try:
        fd = open_path(path, file_ok=True)
    except PathRefused as refused:
        if refused.missing:
            raise OrchestratorError(
                f"{label}: {path} does not exist; create it or fix the zone's path"
            ) from None
        if refused.link is not None:
            raise OrchestratorError(
                f"{label}: {refused.reason}, on the zone's path; refusing to mount it (a "
                f"worker may have planted it): remove it and check what it pointed at"
            ) from None
        raise OrchestratorError(f"{label}: {refused.reason}; fix the zone's path") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if zone.target == "/repo/.git" or zone.guard:
        return  # a file or folder, mounted read-only; its own permissions apply
    if not stat.S_ISDIR(info.st_mode):
        raise OrchestratorError(f"{label}: {path} is not a folder; fix its path")
    if os.geteuid() == 0:
        return  # root gives the worker's uid what the grant says (runtime.access)
    needed = "rx" if zone.read_only else "rwx"
    if not permits(info, uid, gid, needed):
        raise OrchestratorError(
            f"{label}: {path} is not {'readable' if zone.read_only else 'writable'} by uid "
            f"{uid} (the worker's user); `chown {uid}:{gid} {path}`, or run the orchestrator "
            "as the folder's owner"
        )
