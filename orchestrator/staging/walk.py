"""Collecting a host folder an untrusted worker could write, without following anything.

The folder is walked through directory descriptors: each entry is looked at with
``lstat`` relative to its parent's descriptor, and only regular files and folders are
opened, one component at a time, with ``O_NOFOLLOW | O_NONBLOCK``. What was opened is
checked again with ``fstat`` (same inode, still regular, one link), so an entry swapped for
a symlink, FIFO or device between the look and the open is refused rather than followed
or waited on. Symlinks, FIFOs, sockets and devices are never opened at all.

Hard links: a regular file with more than one link is refused. Its content may be shared
with a file outside the folder (planted before the run, or a host file hard-linked into a
shared filesystem), and reading it would leak that file; a copy of a zone handed to a
worker must therefore be a real copy (or a reflink), never ``cp -l``.

With ``base`` (the content the folder started from), only differences are collected:
``create`` for new paths, ``update`` for other content or another mode, ``delete`` for base
files that are gone. A base file is never deleted when its path, or a folder above it,
was refused in the folder, or when the walk stopped early (too many entries).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.models import OutboxLimits
from orchestrator.hostfs.entries import special_kind
from orchestrator.hostfs.flags import DIR_FLAGS, FILE_FLAGS
from orchestrator.hostfs.paths import open_beneath
from orchestrator.staging.blobs import BlobSink
from orchestrator.staging.collected import Collected, CollectedFile, Intake, Operation
from orchestrator.staging.errors import CollectionError
from orchestrator.staging.names import MAX_DEPTH, UnsafeName, normal_mode, printable, safe_path

__all__ = ["collect_dir"]


@dataclass(frozen=True)
class _BaseFile:
    size: int
    mode: int


def _open_root(root: Path, what: str) -> int:
    try:
        return os.open(root, DIR_FLAGS)
    except OSError as exc:
        raise CollectionError(
            f"cannot collect {what} {root}: {exc.strerror}; it must be an existing folder "
            "(not a symbolic link)"
        ) from None


def _listing(fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(fd) as entries:
        return sorted(entries, key=lambda entry: entry.name)


def _index(fd: int, prefix: str, depth: int, found: dict[str, _BaseFile]) -> None:
    """Regular files under ``fd`` with safe names (the base is trusted but not followed)."""
    for entry in _listing(fd):
        rel = prefix + entry.name
        try:
            safe_path(rel)
            st = entry.stat(follow_symlinks=False)
        except (UnsafeName, OSError):
            continue
        if stat.S_ISREG(st.st_mode):
            found[rel] = _BaseFile(st.st_size, normal_mode(st.st_mode))
        elif stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
            with contextlib.suppress(OSError):
                child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                try:
                    _index(child, rel + "/", depth + 1, found)
                finally:
                    os.close(child)


class _Walker:
    def __init__(self, intake: Intake, base_fd: int | None, base: dict[str, _BaseFile]) -> None:
        self.intake = intake
        self.base_fd = base_fd
        self.base = base
        self.present: set[str] = set()  # every non-folder name met in the folder
        self.skipped: set[str] = set()  # folders not walked (refused or unreadable)

    def walk(self, fd: int, prefix: str, depth: int) -> None:
        intake = self.intake
        try:
            entries = _listing(fd)
        except OSError as exc:
            intake.reject(printable(prefix or "."), f"cannot list this folder: {exc.strerror}")
            self.skipped.add(prefix.rstrip("/"))
            return
        for entry in entries:
            if intake.stopped:
                return
            rel = prefix + entry.name
            shown = printable(rel)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                intake.reject(shown, f"cannot examine: {exc.strerror}")
                self.present.add(rel)
                continue
            if stat.S_ISDIR(st.st_mode):
                self.folder(fd, entry.name, rel, shown, st, depth)
            else:
                self.present.add(rel)
                if intake.count(shown):
                    self.entry(fd, entry.name, rel, shown, st)

    def folder(
        self, fd: int, name: str, rel: str, shown: str, st: os.stat_result, depth: int
    ) -> None:
        intake = self.intake
        if not intake.count(shown, folder=True):
            return
        self.skipped.add(rel)  # until it is walked
        if intake.name(rel, shown, suffix=False) is None:
            return
        if depth + 1 >= MAX_DEPTH:
            intake.reject(shown, f"nested more than {MAX_DEPTH} folders deep")
            return
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            intake.reject(shown, _open_failure(exc))
            return
        try:
            seen = os.fstat(child)
            if (seen.st_dev, seen.st_ino) != (st.st_dev, st.st_ino):
                intake.reject(shown, "replaced while being collected")
                return
            self.skipped.discard(rel)
            self.walk(child, rel + "/", depth + 1)
        finally:
            os.close(child)

    def entry(self, fd: int, name: str, rel: str, shown: str, st: os.stat_result) -> None:
        intake = self.intake
        kind = special_kind(st.st_mode)
        if kind is not None:
            intake.reject(shown, f"{kind}: only regular files are collected")
            return
        if st.st_nlink > 1:
            intake.reject(shown, f"hard link ({st.st_nlink} names share this file); not collected")
            return
        path = intake.name(rel, shown)
        if path is None or not intake.place(path, shown):
            return
        reason = intake.over(st.st_size)
        if reason:
            intake.reject(shown, reason)
            return
        try:
            file_fd = os.open(name, FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            intake.reject(shown, _open_failure(exc))
            return
        try:
            self.copy(file_fd, path, shown, st)
        finally:
            os.close(file_fd)

    def copy(self, fd: int, path: str, shown: str, st: os.stat_result) -> None:
        """Check the opened file again, then copy exactly the size it has now."""
        intake = self.intake
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            intake.reject(shown, "replaced while being collected")
            return
        if now.st_nlink > 1:
            intake.reject(shown, f"hard link ({now.st_nlink} names share this file); not collected")
            return
        reason = intake.over(now.st_size)  # the size read must be exactly this one
        if reason:
            intake.reject(shown, reason)
            return
        mode = normal_mode(now.st_mode)
        base = self.base.get(path)
        operation: Operation = "create" if base is None else "update"
        stored = intake.sink.store_fd(
            fd,
            now.st_size,
            base=None if base is None else functools.partial(self.base_digest, path),
            compare=base is not None and (base.size, base.mode) == (now.st_size, mode),
        )
        intake.take(path, shown, operation, mode, stored)

    def base_digest(self, path: str) -> str | None:
        if self.base_fd is None:
            return None
        try:
            fd = open_beneath(self.base_fd, path)
        except OSError:
            return None
        try:
            return BlobSink.digest_fd(fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def deletions(self) -> None:
        """Base files gone from the folder (not merely replaced by something refused)."""
        kept = set(self.intake.files) | self.intake.unchanged
        refused = self.skipped | (self.present - kept)  # what replaced them was refused
        for path in sorted(self.base):
            if path in self.present or path in self.intake.files:
                continue
            parts = path.split("/")
            if any("/".join(parts[:n]) in refused for n in range(1, len(parts) + 1)):
                continue
            digest = self.base_digest(path)
            self.intake.accept(CollectedFile(path, "delete", 0, None, None, None, digest))


def _open_failure(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "became a symbolic link while being collected"
    if exc.errno in (errno.ENOTDIR, errno.ENXIO, errno.ENODEV):
        return "replaced while being collected"
    return f"cannot open: {exc.strerror}"


def collect_dir(
    root: Path,
    *,
    base: Path | None = None,
    limits: OutboxLimits,
    suffixes: list[str] | tuple[str, ...] | None = None,
    tmp_dir: Path | None = None,
) -> Collected:
    """Collect the regular files under ``root`` (compared with ``base`` when given).

    Rejected (and recorded, the rest still collected): symlinks, hard links, FIFOs,
    sockets, devices, unsafe names, names outside ``suffixes``, entries past
    ``limits.max_files``, files over ``limits.max_file_size`` (at most cap + 1 bytes are
    read) or bringing the total over ``limits.size``. ``root`` itself must be a real
    folder. ``tmp_dir`` is where the blob folder is made (see :meth:`ChangeStore.scratch`).
    """
    base_fd = _open_root(base, "base folder") if base is not None else None
    sink: BlobSink | None = None
    try:
        found: dict[str, _BaseFile] = {}
        if base_fd is not None:
            _index(base_fd, "", 0, found)
        root_fd = _open_root(root, "folder")
        try:
            sink = BlobSink(tmp_dir)
            walker = _Walker(Intake(limits, suffixes, sink), base_fd, found)
            walker.walk(root_fd, "", 0)
        finally:
            os.close(root_fd)
        if base_fd is not None and not walker.intake.stopped:
            walker.deletions()
        return walker.intake.finish()
    except BaseException:
        if sink is not None:
            sink.discard()
        raise
    finally:
        if base_fd is not None:
            os.close(base_fd)
