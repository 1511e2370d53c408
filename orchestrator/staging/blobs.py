"""Blob folders: untrusted content copied into private files named by their SHA-256.

Content is hashed while it is written to ``.part-N`` and then renamed to its digest, so
the folder only ever holds finished blobs (and, for a moment, one part). Nothing is ever
read past a cap: every copy reads at most ``cap + 1`` bytes, into one reused buffer.

Copying is single-threaded on purpose: on small machines, worker threads made it slower
(the walk and the copies fight over the GIL), and the walk must decide caps in order.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.staging.errors import CollectionError

__all__ = ["CHUNK", "BlobSink", "ReadInto", "SourceFailed", "Stored", "fd_reader"]

#: Bytes read and written at a time.
CHUNK = 1 << 20
#: Fills the buffer it is given (a memoryview) and returns how many bytes it put there.
ReadInto = Callable[[memoryview], int]
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SourceFailed(Exception):
    """Reading the untrusted source failed (a cut stream, an I/O error): not our fault."""


@dataclass(frozen=True)
class Stored:
    """The outcome of copying one file: a blob, an unchanged file, or why nothing was kept."""

    sha256: str | None
    size: int
    base_sha256: str | None = None
    unchanged: bool = False
    problem: str | None = None


def fd_reader(fd: int) -> ReadInto:
    """Read from a file descriptor's current offset."""
    return lambda view: os.readv(fd, [view])


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


class BlobSink:
    """A private temporary folder of blobs named by SHA-256."""

    def __init__(self, tmp_dir: Path | None = None) -> None:
        try:
            self.folder = Path(tempfile.mkdtemp(prefix="orchestrator-blobs-", dir=tmp_dir))
            self._fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            where = tmp_dir or tempfile.gettempdir()
            raise CollectionError(
                f"cannot create a blob folder in {where}: {exc.strerror}; "
                "make it writable or pass another tmp_dir"
            ) from None
        self._parts = itertools.count()
        self._buffer = memoryview(bytearray(CHUNK))

    def path(self, sha256: str) -> Path:
        return self.folder / sha256

    def _failure(self, exc: OSError) -> CollectionError:
        return CollectionError(
            f"cannot write a blob in {self.folder}: {exc.strerror}; check that filesystem "
            "(free space, permissions) or collect into another tmp_dir"
        )

    def _pump(self, read: ReadInto, cap: int, fd: int | None) -> tuple[str, int] | None:
        """Hash (and write to ``fd``) what ``read`` gives; None once past ``cap`` bytes."""
        digest = hashlib.sha256()
        size = 0
        while True:
            view = self._buffer[: min(CHUNK, cap + 1 - size)]
            try:
                count = read(view)
            except Exception as exc:
                raise SourceFailed(str(exc) or type(exc).__name__) from exc
            if not count:
                return digest.hexdigest(), size
            size += count
            if size > cap:
                return None
            digest.update(view[:count])
            if fd is not None:
                try:
                    _write_all(fd, view[:count])
                except OSError as exc:
                    raise self._failure(exc) from None

    def digest(self, read: ReadInto, cap: int) -> tuple[str, int] | None:
        """Hash what ``read`` gives, without keeping it; None past ``cap`` bytes."""
        return self._pump(read, cap, None)

    def write(self, read: ReadInto, cap: int) -> tuple[str, int] | None:
        """Store what ``read`` gives as a blob; None (nothing kept) past ``cap`` bytes."""
        name = f".part-{next(self._parts)}"
        result = None
        try:
            fd = os.open(name, _CREATE, 0o600, dir_fd=self._fd)
            try:
                result = self._pump(read, cap, fd)
            finally:
                os.close(fd)
            if result is None:
                os.unlink(name, dir_fd=self._fd)
            else:  # the same content twice is the same blob
                os.rename(name, result[0], src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError as exc:
            raise self._failure(exc) from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._fd)
            raise
        return result

    def store_fd(
        self,
        fd: int,
        size: int,
        *,
        base: Callable[[], str | None] | None = None,
        compare: bool = False,
    ) -> Stored:
        """Copy the open file ``fd`` (from its start) into a blob.

        The file must hold exactly ``size`` bytes: more or fewer means it changed while
        being collected, and nothing is kept (at most ``size + 1`` bytes are read). ``base``
        gives the digest of the content it replaces; with ``compare``, a file equal to it
        is reported unchanged and not stored.
        """
        read = fd_reader(fd)
        try:
            base_sha256 = base() if base is not None else None
            if compare and base_sha256 is not None:
                same = self._pump(read, size, None)
                if same == (base_sha256, size):
                    return Stored(base_sha256, size, base_sha256, unchanged=True)
                os.lseek(fd, 0, os.SEEK_SET)
            result = self.write(read, size)
        except SourceFailed as exc:
            return Stored(None, size, problem=f"cannot read: {exc}")
        if result is None or result[1] != size:
            return Stored(None, size, problem="changed while being collected")
        return Stored(result[0], size, base_sha256)

    @staticmethod
    def digest_fd(fd: int) -> str:
        """Hash everything ``fd`` holds from its current offset (trusted input only)."""
        digest = hashlib.sha256()
        while data := os.read(fd, CHUNK):
            digest.update(data)
        return digest.hexdigest()

    def prune(self, keep: set[str]) -> None:
        """Delete blobs no accepted file refers to (left by a later-refused duplicate)."""
        for entry in os.scandir(self.folder):
            if entry.name not in keep:
                os.unlink(entry.path)

    def close(self) -> None:
        """Close the folder's descriptor (the folder stays)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)
