"""Opening a host path that a worker may have tampered with, never following a link.

A zone, its parent folders, the project's own folders and the session folders are all
host paths a worker can write into. A worker that replaces a folder on such a path with a
symbolic link would redirect whatever the orchestrator does with the path next (a bind
mount, a read, an access grant) to a host folder of the worker's choosing. So these paths
are never resolved by the kernel in one go: :func:`open_path` walks from ``/`` one
component at a time, opening each with ``O_NOFOLLOW`` relative to the folder above it,
and refuses the first link it meets. The descriptor it returns is the folder that was
checked; callers act on it (``openat``, ``/proc/self/fd/N``), never on the path again.

``..`` is taken as the kernel takes it (the real parent of the folder reached), which is
the lexical parent as long as no link was followed: and none ever is.

:func:`open_beneath` does the same below a folder already opened (a collected outbox, a
zone's root), for a relative path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from orchestrator.hostfs.entries import special_kind
from orchestrator.hostfs.flags import DIR_FLAGS, FILE_FLAGS

__all__ = ["Identity", "PathRefused", "check_path", "identity", "open_beneath", "open_path"]

_PATH_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC

Identity = tuple[int, int]
"""``(st_dev, st_ino)``: what a folder is, whatever its path says."""


class PathRefused(OSError):
    """Why a path cannot be used: ``component`` is where the walk stopped; ``link`` the
    target when it is a symbolic link; ``missing`` when it does not exist."""

    def __init__(
        self, path: Path, component: Path, reason: str, *, missing: bool = False,
        link: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(errno.ENOENT if missing else errno.ELOOP if link else errno.ENOTDIR,
                         reason)  # fmt: skip
        self.path, self.component, self.reason = path, component, reason
        self.missing, self.link = missing, link

    def __str__(self) -> str:
        return self.reason


def identity(fd: int) -> Identity:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def open_path(path: Path, *, file_ok: bool = False, create: int | None = None) -> int:
    """A descriptor for the absolute ``path``, opened without following any link.

    Every folder on the way must be a real folder; the last component too, or a regular
    file with ``file_ok`` (opened ``O_PATH``: usable for ``fstat`` and ``/proc/self/fd``,
    not for reading). With ``create`` (a mode), missing folders are made, each in the
    folder descriptor above it (``mkdirat``), so never through a link either. Raises
    :class:`PathRefused` naming the component that is a link, is not a folder, or is
    missing (``missing``). The caller closes the descriptor.
    """
    if not path.is_absolute():
        raise ValueError(f"{path} is not absolute")
    fd = os.open("/", DIR_FLAGS)
    here = Path("/")
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    try:
        for index, name in enumerate(parts):
            last = index == len(parts) - 1
            here = here.parent if name == ".." else here / name
            try:
                child = _open_folder(fd, name, create)
            except OSError as exc:
                child = _refuse(fd, name, here, path, exc, file_ok=file_ok and last)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_path(path: Path, *, file_ok: bool = False) -> None:
    """Refuse ``path`` (:class:`PathRefused`) if a link or a non-folder is on it; a path
    whose end does not exist yet is fine as long as what exists of it is real folders."""
    try:
        os.close(open_path(path, file_ok=file_ok))
    except PathRefused as refused:
        if not refused.missing:
            raise


def _open_folder(fd: int, name: str, create: int | None) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if create is None or name == "..":
            raise
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, create, dir_fd=fd)
    return os.open(name, DIR_FLAGS, dir_fd=fd)


def _refuse(fd: int, name: str, here: Path, path: Path, exc: OSError, *, file_ok: bool) -> int:
    """The descriptor for ``name`` when it is an acceptable regular file, else the refusal."""
    if exc.errno == errno.ENOENT:
        raise PathRefused(path, here, f"{here} does not exist", missing=True) from None
    try:
        info = os.lstat(name, dir_fd=fd)
    except OSError:
        raise PathRefused(path, here, f"{here}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(name, dir_fd=fd)
        except OSError:
            target = "?"
        raise PathRefused(
            path, here, f"{here} is a symbolic link (to {target})", link=target
        ) from None
    if file_ok and stat.S_ISREG(info.st_mode):
        child = os.open(name, _PATH_FLAGS, dir_fd=fd)
        if stat.S_ISREG(os.fstat(child).st_mode):
            return child
        os.close(child)
    raise PathRefused(path, here, f"{here} is not a folder") from None


def open_beneath(root_fd: int, path: str, *, folder: bool = False) -> int:
    """Open ``path`` (``a/b/c``) under ``root_fd`` without following any link.

    Raises ``OSError``: ``ELOOP`` when a component is a symlink, ``ENOTDIR`` when a
    parent is not a folder, ``EINVAL`` when the final entry is not a regular file (or a
    folder, with ``folder=True``), ``ENOENT`` when something is missing.
    """
    parts = path.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        if not folder:  # never open a device or FIFO, even without blocking
            kind = special_kind(os.lstat(parts[-1], dir_fd=fd).st_mode)
            if kind is not None:
                code = errno.ELOOP if kind == "symbolic link" else errno.EINVAL
                raise OSError(code, f"a {kind}", path)
        final = os.open(parts[-1], DIR_FLAGS if folder else FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    mode = os.fstat(final).st_mode
    if not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        os.close(final)
        raise OSError(errno.EINVAL, f"not a {'folder' if folder else 'regular file'}", path)
    return final
