"""Host files and folders a harness uploads into a sandbox, never through a link out of them.

Harbor uploads a task's own folders (``environment/``, ``tests/``, ``solution/``) into the
sandbox, and a task is often a download: git stores symbolic links, so ``tests`` or
``tests/data.txt`` can lead to ``~victim/.ssh``. Inside the task's folder no link is ever
followed: the path is opened from ``/`` one component at a time with ``O_NOFOLLOW``
(:func:`~orchestrator.hostfs.paths.open_path`), and a link on the way, or as the file
uploaded, is refused naming it. A folder's contents are walked by descriptor
(:func:`~orchestrator.hostfs.walk.walk`): a link inside it goes into the sandbox as the
link itself (what ``docker cp`` does), never as what it points at; FIFOs, sockets and
devices are refused. What a harness uploads from elsewhere (its own files, an agent's
settings) is the host's: the links on its path are followed as the host's own, its
contents walked the same way.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from pathlib import Path

from orchestrator.hostfs.entries import special_kind
from orchestrator.hostfs.files import read_limited
from orchestrator.hostfs.flags import FILE_FLAGS
from orchestrator.hostfs.paths import PathRefused, open_path
from orchestrator.hostfs.walk import Entry, walk

__all__ = ["UploadRefused", "pack_folder", "read_file"]


class UploadRefused(OSError):
    """Why a file or folder is not uploaded, in one line naming it."""

    def __str__(self) -> str:
        return str(self.strerror)


def read_file(path: Path, task: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``, else refused)."""
    real = _real(path, task)
    try:
        folder = open_path(real.parent)
    except PathRefused as refused:
        raise _refused(path, refused) from None
    try:
        fd = os.open(real.name, FILE_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            target = os.readlink(real.name, dir_fd=folder)
            raise _link(path, real, target) from None
        raise
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UploadRefused(errno.EINVAL, f"{path}: not a regular file; refusing to upload it")
        if info.st_size > limit:
            raise UploadRefused(errno.EFBIG, f"{path}: over {limit >> 20} MiB, too large to upload")
        return read_limited(fd, limit)
    finally:
        os.close(fd)


def pack_folder(folder: Path, task: Path, limit: int) -> bytes:
    """``folder``'s contents as a tar stream (links as links), at most ``limit`` bytes."""
    real = _real(folder, task)
    buffer = io.BytesIO()
    total = 0

    def add(entry: Entry) -> bool:
        nonlocal total
        if not entry.path:
            if not stat.S_ISDIR(entry.info.st_mode):
                raise UploadRefused(errno.ENOTDIR, f"{folder}: not a folder")
            return True
        info = tarfile.TarInfo(entry.path)
        info.mode, info.mtime = stat.S_IMODE(entry.info.st_mode), int(entry.info.st_mtime)
        kind = special_kind(entry.info.st_mode)
        if stat.S_ISLNK(entry.info.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(entry.name, dir_fd=entry.folder)
            tar.addfile(info)
        elif stat.S_ISDIR(entry.info.st_mode):
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        elif kind is None:
            fd = entry.open()
            if fd is None:
                raise UploadRefused(
                    errno.ESTALE, f"{real / entry.path} changed while it was packed"
                )
            with os.fdopen(fd, "rb") as data:
                info.size = os.fstat(fd).st_size
                total += info.size
                if total > limit:
                    raise UploadRefused(errno.EFBIG, f"{folder}: over {limit >> 20} MiB, too large")
                tar.addfile(info, data)
        else:
            raise UploadRefused(
                errno.EINVAL, f"{real / entry.path}: a {kind}; refusing to upload it"
            )
        return True

    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        try:
            walk(real, add)
        except PathRefused as refused:
            raise _refused(folder, refused) from None
    return buffer.getvalue()


def _real(path: Path, task: Path) -> Path:
    """``path`` with the host's links above ``task`` resolved, and none inside it: a path in
    the task's folder is that folder's real path and the rest as given (walked later
    without following a link); any other path is resolved as the host's."""
    given = Path(os.path.abspath(path))
    for top in dict.fromkeys((Path(os.path.abspath(task)), Path(os.path.realpath(task)))):
        if given.is_relative_to(top):
            return Path(os.path.realpath(task)) / given.relative_to(top)
    return Path(os.path.realpath(given))


def _refused(path: Path, refused: PathRefused) -> UploadRefused:
    if refused.link is not None:
        return _link(path, refused.component, refused.link)
    return UploadRefused(refused.errno, f"{path}: {refused.reason}")


def _link(path: Path, link: Path, target: str) -> UploadRefused:
    return UploadRefused(
        errno.ELOOP,
        f"{path}: {link} is a symbolic link (to {target}) in the task's folder; links there "
        "are never followed out of it: replace it with the file itself",
    )
