"""Opening, creating and removing beneath a zone's root descriptor, never through a link.

The worker may change its zones while the host works in them. So nothing here opens a path
by name from ``/``: each component is opened relative to the descriptor of the folder above
it, with ``O_NOFOLLOW`` (a folder with ``O_DIRECTORY`` too), and what was opened is checked
with ``fstat``. A component swapped for a symlink between a check and an open makes the
open fail instead of leading out of the zone; files are opened ``O_NONBLOCK`` so a FIFO is
never waited on, and FIFOs, sockets and devices are refused before and after opening.

Writes replace a file atomically: the new content goes to a fresh temporary name in the
same folder (``O_CREAT | O_EXCL | O_NOFOLLOW``), then ``rename`` through the folder's
descriptor puts it in place. ``rename`` never follows the name it replaces (a link planted
there is replaced, not written through), readers in the container see the old or the new
file and never half of it, and a file with several hard links is never written into.
Appends open the existing file ``O_APPEND | O_NOFOLLOW | O_NONBLOCK`` and refuse anything
but a regular file with one link. Neither is ``fsync``\\ed: atomic for concurrent readers,
not durable across a host crash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from orchestrator.hostfs.entries import Kind, lookup, special_kind
from orchestrator.hostfs.flags import DIR_FLAGS, FILE_FLAGS
from orchestrator.staging.names import MAX_DEPTH

Owner = tuple[int, int] | None
"""The uid:gid that created files and folders are given (None: leave them as created)."""

_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_ADVICE = "links are never followed from the host; use the path it stands for"
#: Why a name over the file system's limit (``ENAMETOOLONG``) is refused.
TOO_LONG = "a name in it is too long (at most 255 bytes per name); use a shorter one"


class WalkError(Exception):
    """A refusal from the file system, as a phrase: "/session/d is a symbolic link; ..."."""

    def __init__(self, detail: str, *, missing: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.missing = missing


def describe(shown: str, mode: int) -> str:
    """Why the entry at ``shown`` is refused (it is not a regular file or folder)."""
    kind = special_kind(mode) or "file"
    if stat.S_ISLNK(mode):
        return f"{shown} is a symbolic link; {_LINK_ADVICE}"
    return f"{shown} is a {kind}; only regular files and folders are used"


def chown(fd: int, owner: Owner) -> None:
    if owner is not None:
        os.fchown(fd, *owner)


def open_folder(root_fd: int, parts: list[str], base: str, *, create: bool, owner: Owner) -> int:
    """A new descriptor for the folder ``root/parts...``; with ``create``, missing folders
    are made (mode 0755, given to ``owner``). ``base`` names the root in messages."""
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts):
            shown = f"{base}/{'/'.join(parts[: index + 1])}"
            child = _open_child(fd, part, shown, create=create, owner=owner)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child(fd: int, part: str, shown: str, *, create: bool, owner: Owner) -> int:
    for _ in range(8):  # a worker racing mkdir/rmdir gets a few tries, not a loop forever
        try:
            return os.open(part, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise WalkError(f"{shown} does not exist", missing=True) from None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise WalkError(TOO_LONG) from None
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise WalkError(f"{shown} cannot be opened: {exc.strerror}") from None
            found = lookup(fd, part)
            if found is None:
                continue
            if stat.S_ISREG(found.st_mode):
                raise WalkError(f"{shown} is a file, not a folder") from None
            raise WalkError(describe(shown, found.st_mode)) from None
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            continue
        try:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:  # removed again meanwhile: another try
            continue
        except OSError as exc:  # swapped meanwhile: ELOOP/ENOTDIR
            raise WalkError(f"{shown} changed while being created ({exc.strerror})") from None
        try:
            os.fchmod(child, 0o755)
            chown(child, owner)
        except BaseException:
            os.close(child)
            raise
        return child
    raise WalkError(f"{shown} keeps changing; try again")


def open_regular(dir_fd: int, name: str, shown: str) -> tuple[int, os.stat_result]:
    """Open the regular file ``name`` for reading: never a link, FIFO, socket or device."""
    found = lookup(dir_fd, name)
    if found is None:
        raise WalkError(f"{shown} does not exist", missing=True)
    if stat.S_ISDIR(found.st_mode):
        raise WalkError(f"{shown} is a folder; list it instead")
    if not stat.S_ISREG(found.st_mode):
        raise WalkError(describe(shown, found.st_mode))
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise WalkError(f"{shown} does not exist", missing=True) from None
    except OSError as exc:
        raise WalkError(f"{shown} changed while being opened ({exc.strerror})") from None
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise WalkError(describe(shown, opened.st_mode))
    return fd, opened


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_file(dir_fd: int, name: str, data: bytes, shown: str, owner: Owner) -> bool:
    """Put ``data`` at ``name`` atomically; True when the file did not exist before."""
    found = lookup(dir_fd, name)
    mode = 0o644
    if found is not None:
        if stat.S_ISDIR(found.st_mode):
            raise WalkError(f"{shown} is a folder; write to a file inside it")
        if not stat.S_ISREG(found.st_mode):
            raise WalkError(describe(shown, found.st_mode))
        mode = stat.S_IMODE(found.st_mode) & 0o777
    temp = f".orchestrator-{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:  # the folder was removed meanwhile (ENOENT), or is full
        raise WalkError(f"{shown} could not be written ({exc.strerror})") from None
    try:
        try:
            _write_all(fd, data)
            os.fchmod(fd, mode)
            chown(fd, owner)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        if isinstance(exc, IsADirectoryError | NotADirectoryError):
            raise WalkError(f"{shown} became a folder while being written") from None
        if isinstance(exc, OSError):  # e.g. the folder was removed meanwhile (ENOENT)
            raise WalkError(f"{shown} changed while being written ({exc.strerror})") from None
        raise
    return found is None


def append_file(
    dir_fd: int, name: str, data: bytes, shown: str, owner: Owner, cap: int | None
) -> tuple[int, bool]:
    """Append ``data`` to ``name`` (created if missing); the new size, and whether created.
    ``cap`` is the zone's per-file limit, checked against the size the file has now."""
    found = lookup(dir_fd, name)
    if found is not None and not stat.S_ISREG(found.st_mode):
        if stat.S_ISDIR(found.st_mode):
            raise WalkError(f"{shown} is a folder; write to a file inside it")
        raise WalkError(describe(shown, found.st_mode))
    created = False
    try:
        fd = os.open(name, _APPEND_FLAGS | os.O_NOCTTY, dir_fd=dir_fd)
    except FileNotFoundError:
        try:
            fd = os.open(name, _CREATE_FLAGS | os.O_APPEND, 0o644, dir_fd=dir_fd)
        except OSError as exc:  # created (EEXIST) or its folder removed (ENOENT) meanwhile
            raise WalkError(f"{shown} changed while being opened ({exc.strerror})") from None
        created = True
    except OSError as exc:  # ELOOP: became a link; ENXIO: a FIFO without a reader
        raise WalkError(f"{shown} changed while being opened ({exc.strerror})") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise WalkError(describe(shown, opened.st_mode))
        if opened.st_nlink > 1:
            raise WalkError(
                f"{shown} has {opened.st_nlink} hard links; appending would change the "
                "other names too. Write the whole file instead"
            )
        if cap is not None and opened.st_size + len(data) > cap:
            raise WalkError(
                f"appending {len(data)} bytes makes {opened.st_size + len(data)} bytes, over "
                f"the per-file cap of {cap}"
            )
        if created:
            os.fchmod(fd, 0o644)
            chown(fd, owner)
        _write_all(fd, data)
        return os.fstat(fd).st_size, created
    finally:
        os.close(fd)


def remove(dir_fd: int, name: str, shown: str) -> tuple[Kind, int]:
    """Remove the file or folder ``name`` (a folder with everything in it); what it was,
    and how many entries went. Links, FIFOs and the like inside a folder are unlinked,
    never followed or opened."""
    found = lookup(dir_fd, name)
    if found is None:
        raise WalkError(f"{shown} does not exist", missing=True)
    if stat.S_ISREG(found.st_mode):
        try:
            os.unlink(name, dir_fd=dir_fd)  # a link swapped in meanwhile is unlinked, not followed
        except OSError as exc:  # removed (ENOENT) or swapped for a folder (EISDIR) meanwhile
            raise WalkError(f"{shown} changed while being removed ({exc.strerror})") from None
        return "file", 1
    if not stat.S_ISDIR(found.st_mode):
        raise WalkError(describe(shown, found.st_mode))
    try:
        return "folder", _remove_folder(dir_fd, name, 0)
    except OSError as exc:
        raise WalkError(f"{shown} could not be removed entirely ({exc.strerror})") from None


def _remove_folder(parent: int, name: str, depth: int) -> int:
    if depth >= MAX_DEPTH:
        raise OSError(errno.ELOOP, f"nested more than {MAX_DEPTH} folders deep")
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    removed = 0
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for child in names:
            found = lookup(fd, child)
            if found is None:
                continue
            if stat.S_ISDIR(found.st_mode):
                try:
                    removed += _remove_folder(fd, child, depth + 1)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
            os.unlink(child, dir_fd=fd)  # never follows: a link itself is removed
            removed += 1
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
    return removed + 1
