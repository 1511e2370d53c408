"""The open zone roots of one sandbox, and folders opened beneath them for one call.

Each zone's root is opened per call, its host path walked from ``/`` without following a
link, and checked to be the folder the container's bind mount holds (see
:class:`ZoneRoots`). Everything below a root is opened per call through
:mod:`orchestrator.sandbox.nofollow`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Mapping

from orchestrator.hostfs.entries import lookup
from orchestrator.hostfs.flags import FILE_FLAGS
from orchestrator.hostfs.paths import Identity, PathRefused, identity, open_path
from orchestrator.policy import ZoneGrant
from orchestrator.sandbox import nofollow
from orchestrator.sandbox.errors import SandboxError, SandboxNotFound
from orchestrator.sandbox.nofollow import Owner, WalkError

Parts = list[str]  # a path's components inside its zone


def fail(verb: str, path: str, exc: WalkError) -> SandboxError:
    error = SandboxNotFound if exc.missing else SandboxError
    return error(f"Cannot {verb} '{path}': {exc.detail}")


#: What an ``OSError`` the walk did not foresee means for the person who asked.
_OS_REASONS = {
    errno.ENAMETOOLONG: nofollow.TOO_LONG,
    errno.ENOENT: "a folder on the way was removed while it was being used; try again",
}


def os_refusal(verb: str, path: str, exc: OSError) -> SandboxError:
    """An ``OSError`` from the file system (a name over 255 bytes, a folder the worker
    removed mid-walk, ...) as the file API's own refusal."""
    error = SandboxNotFound if isinstance(exc, FileNotFoundError) else SandboxError
    reason = _OS_REASONS.get(exc.errno or 0) or exc.strerror or str(exc)
    return error(f"Cannot {verb} '{path}': {reason}")


class ZoneRoots:
    """Opens zone roots for one call each; ``owner`` gets the folders made on the way.

    A root is opened on every call by walking its host path from ``/`` without following
    any link (:func:`orchestrator.hostfs.paths.open_path`), and must be the folder the sandbox
    holds: ``identities`` (the run's mount sources, by host path), or else the folder
    first opened. A root whose path now leads through a link, or to another folder, is
    refused: a worker racing a swap of a folder on the path gains nothing.
    """

    def __init__(self, owner: Owner, identities: Mapping[str, Identity] | None = None) -> None:
        self.owner = owner
        self._known: dict[str, Identity] = dict(identities or {})
        self._lock = threading.Lock()

    def close(self) -> None:
        """Nothing is held between calls (kept for the callers' ``with`` blocks)."""

    def root(self, verb: str, path: str, zone: ZoneGrant) -> tuple[int, bool]:
        """A new descriptor for the zone's root (the caller closes it), and whether it is a
        folder (a guard zone may bind a single file, such as the project file, read-only
        inside a writable zone)."""
        host = zone.host_path
        try:
            fd = open_path(host, file_ok=True)
        except PathRefused as refused:
            error = SandboxNotFound if refused.missing else SandboxError
            why = (
                "it appears when the sandbox is prepared"
                if refused.missing
                else "refusing: a worker may have planted a link on the path"
            )
            raise error(f"Cannot {verb} '{path}': {zone.target} is not available on the "
                        f"host ({refused.reason}); {why}") from None  # fmt: skip
        try:
            with self._lock:
                known = self._known.setdefault(str(host), identity(fd))
            if identity(fd) != known:
                raise SandboxError(
                    f"Cannot {verb} '{path}': {host} is no longer the folder mounted at "
                    f"{zone.target} (it was replaced while the sandbox is open); refusing"
                )
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                return fd, True
            # A single file: readable through the very inode that was checked.
            readable = os.open(f"/proc/self/fd/{fd}", FILE_FLAGS & ~os.O_NOFOLLOW)
            os.close(fd)
            return readable, False
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise

    def parent(
        self,
        verb: str,
        path: str,
        zone: ZoneGrant,
        parts: Parts,
        *,
        create: bool = False,
        whole: bool = False,
    ) -> Opened:
        """The open folder holding the last part, and that part's name; with ``whole``
        (or for a zone's root) the folder of the path itself and ``""``. A zone that is a
        single file gives its own descriptor (a copy) for its root, and nothing below it."""
        root, folder = self.root(verb, path, zone)
        try:
            if not folder and (parts or whole):
                raise SandboxError(f"Cannot {verb} '{path}': {zone.target} is a file, not a folder")
            folder_parts, name = (parts, "") if whole or not parts else (parts[:-1], parts[-1])
            try:
                fd = nofollow.open_folder(root, folder_parts, zone.target, create=create,
                                          owner=self.owner)  # fmt: skip
            except WalkError as exc:
                raise fail(verb, path, exc) from None
            except OSError as exc:  # a name over 255 bytes, a folder removed mid-walk
                raise os_refusal(verb, path, exc) from None
        finally:
            os.close(root)
        return Opened(fd, name)

    def probe(
        self, verb: str, path: str, zone: ZoneGrant, parts: Parts, *, missing_ok: bool = False
    ) -> os.stat_result | None:
        """``lstat`` of the path through real folders only; None when it does not exist."""
        try:
            with self.parent(verb, path, zone, parts) as (folder, name):
                try:
                    return os.fstat(folder) if not name else lookup(folder, name)
                except OSError as exc:  # ENAMETOOLONG
                    raise os_refusal(verb, path, exc) from None
        except SandboxNotFound:
            if missing_ok:
                return None
            raise


class Opened:
    """A folder descriptor opened for one call, closed when the ``with`` block ends."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name

    def __enter__(self) -> tuple[int, str]:
        return self.fd, self.name

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
