"""The work tree, touched without ever following a symlink.

A container may have written into the repository's folders (trust ``full`` mounts
``/repo`` read-write), so any folder on the way to a target may have become a symlink
pointing anywhere on the host. Every operation here walks from the work tree's root one
part at a time with ``O_NOFOLLOW | O_DIRECTORY`` descriptors and acts relative to the last
one (``openat``/``renameat``/``unlinkat``), so a link is refused where it is met, even if it
appeared after an earlier check. Files are written to a temporary name in the same folder,
given the manifest's mode, synced, and renamed over the target.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.hostfs.flags import DIR_FLAGS
from orchestrator.hostfs.paths import PathRefused, open_path

__all__ = ["Entry", "UnsafePath", "WorkTree", "temp_name"]

_CHUNK = 1 << 20

Kind = Literal["absent", "file", "symlink", "dir", "other"]


class UnsafePath(Exception):
    """A path cannot be used safely; the message says which part and why."""


@dataclass(frozen=True)
class Entry:
    """What is at a path in the work tree now (a file's sha256 and exec bit included)."""

    kind: Kind
    sha256: str | None = None
    executable: bool = False

    def holds(self, sha256: str | None, mode: int | None) -> bool:
        """True when this is exactly the given content (None: nothing at all)."""
        if sha256 is None:
            return self.kind == "absent"
        return (
            self.kind == "file"
            and self.sha256 == sha256
            and self.executable == bool((mode or 0) & 0o100)
        )


def temp_name(change_id: str, path: str) -> str:
    """The temporary name used while writing ``path`` (fixed, so a re-run can remove it)."""
    digest = hashlib.sha256(f"{change_id}\0{path}".encode()).hexdigest()[:16]
    return f".clearance-{digest}.tmp"


class WorkTree:
    """Symlink-proof file operations below one folder (the repository's work tree)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def _folder(self, parts: tuple[str, ...], *, create: bool) -> Iterator[list[int]]:
        """Descriptors of the root and each folder of ``parts[:-1]`` (the last is the parent).

        Raises FileNotFoundError when a folder is missing and ``create`` is False.
        """
        try:
            fds = [open_path(self.root)]  # no link on the way to the root either
        except PathRefused as refused:
            raise UnsafePath(
                f"{self.root}: {refused.reason}; clearance never follows links on the way "
                "to its target (a worker may have planted it): remove it"
            ) from None
        try:
            for index, name in enumerate(parts[:-1]):
                where = "/".join(parts[: index + 1])
                try:
                    fds.append(os.open(name, DIR_FLAGS, dir_fd=fds[-1]))
                    continue
                except FileNotFoundError:
                    if not create:
                        raise
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafePath(
                            f"{where} is a symlink or not a folder; clearance never follows "
                            "links in the work tree"
                        ) from None
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fds[-1])  # the umask applies, as for git
                try:
                    fds.append(os.open(name, DIR_FLAGS, dir_fd=fds[-1]))
                except OSError:
                    raise UnsafePath(f"{where} changed while it was being created") from None
            yield fds
        finally:
            for fd in reversed(fds):
                os.close(fd)

    def entry(self, parts: tuple[str, ...]) -> Entry:
        """What is at ``parts`` now; a symlinked folder on the way raises UnsafePath."""
        try:
            with self._folder(parts, create=False) as fds:
                return _entry_at(fds[-1], parts[-1])
        except FileNotFoundError:
            return Entry("absent")

    def write(self, parts: tuple[str, ...], source: Path, sha256: str, mode: int, tmp: str) -> None:
        """Replace ``parts`` with the content of ``source`` (checked against ``sha256``)."""
        with self._folder(parts, create=True) as fds:
            parent, name = fds[-1], parts[-1]
            current = _entry_at(parent, name)
            if current.kind in ("symlink", "dir", "other"):
                raise UnsafePath(f"{'/'.join(parts)} is a {current.kind}; it is never replaced")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=parent,
            )
            try:
                digest = hashlib.sha256()
                with source.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view) :]
                if digest.hexdigest() != sha256:
                    raise UnsafePath(f"the stored content for {'/'.join(parts)} changed")
                os.fchmod(fd, mode)
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise
            os.close(fd)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            os.fsync(parent)

    def delete(self, parts: tuple[str, ...]) -> None:
        """Remove the file (or symlink) at ``parts``, then folders this left empty."""
        try:
            with self._folder(parts, create=False) as fds:
                current = _entry_at(fds[-1], parts[-1])
                if current.kind in ("dir", "other"):
                    raise UnsafePath(f"{'/'.join(parts)} is a {current.kind}; it is never removed")
                if current.kind != "absent":
                    os.unlink(parts[-1], dir_fd=fds[-1])
                    os.fsync(fds[-1])
                for depth in range(len(parts) - 1, 0, -1):
                    try:
                        os.rmdir(parts[depth - 1], dir_fd=fds[depth - 1])
                    except OSError:
                        break
        except FileNotFoundError:
            return

    def remove_temp(self, parts: tuple[str, ...], tmp: str) -> None:
        """Remove a temporary file a killed run may have left next to ``parts``."""
        try:
            with self._folder(parts, create=False) as fds:
                os.unlink(tmp, dir_fd=fds[-1])
        except (FileNotFoundError, UnsafePath):
            return


def _entry_at(parent: int, name: str) -> Entry:
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return Entry("absent")
    if stat.S_ISLNK(info.st_mode):
        return Entry("symlink")
    if stat.S_ISDIR(info.st_mode):
        return Entry("dir")
    if not stat.S_ISREG(info.st_mode):
        return Entry("other")
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
            return Entry("other")
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        executable = bool(os.fstat(fd).st_mode & 0o100)
    finally:
        os.close(fd)
    return Entry("file", digest.hexdigest(), executable)
