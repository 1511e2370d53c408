"""The open zone roots of one sandbox, and folders opened beneath them for one call.

Each zone's root is opened once (``O_DIRECTORY | O_NOFOLLOW``, after checking its host path
has no link in it) and kept until :meth:`ZoneRoots.close`: the container's bind mount holds
the same folder, so later renames of the host path change neither. Everything below a root
is opened per call through :mod:`orchestrator.sandbox.nofollow`.
"""

from __future__ import annotations

import errno
import os
import stat
import threading

from orchestrator.policy import ZoneGrant
from orchestrator.sandbox import nofollow
from orchestrator.sandbox.errors import SandboxError, SandboxNotFound
from orchestrator.sandbox.nofollow import Owner, WalkError
from orchestrator.staging.fsutil import DIR_FLAGS, FILE_FLAGS

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
    """Root descriptors by zone target; ``owner`` gets the folders made on the way."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self._roots: dict[str, tuple[int, bool]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._roots.values():
                os.close(fd)
            self._roots.clear()

    def root(self, verb: str, path: str, zone: ZoneGrant) -> tuple[int, bool]:
        """The zone root's descriptor, and whether it is a folder (a guard zone may bind a
        single file, such as the project file, read-only inside a writable zone)."""
        with self._lock:
            if zone.target in self._roots:
                return self._roots[zone.target]
            host = zone.host_path
            try:
                if os.path.realpath(host) != str(host):
                    raise OSError(0, "its host path is reached through a symbolic link")
                try:
                    fd, folder = os.open(host, DIR_FLAGS), True
                except NotADirectoryError:
                    fd, folder = os.open(host, FILE_FLAGS), False
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        os.close(fd)
                        raise OSError(0, "it is neither a folder nor a regular file") from None
            except OSError as exc:
                missing = isinstance(exc, FileNotFoundError)
                error = SandboxNotFound if missing else SandboxError
                raise error(f"Cannot {verb} '{path}': {zone.target} is not available on the "
                            f"host ({exc.strerror}); it appears when the sandbox is prepared"
                            ) from None  # fmt: skip
            self._roots[zone.target] = (fd, folder)
            return fd, folder

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
        return Opened(fd, name)

    def probe(
        self, verb: str, path: str, zone: ZoneGrant, parts: Parts, *, missing_ok: bool = False
    ) -> os.stat_result | None:
        """``lstat`` of the path through real folders only; None when it does not exist."""
        try:
            with self.parent(verb, path, zone, parts) as (folder, name):
                try:
                    return os.fstat(folder) if not name else nofollow.lookup(folder, name)
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
