"""Blob folders: untrusted content copied into private files named by their SHA-256.

Content is hashed while it is written to ``.part-N`` and then renamed to its digest, so
the folder only ever holds finished blobs (and, for a moment, parts). Copying is done by
worker threads, which overlap hashing and file I/O with the walk or the tar parser (both
release the GIL): :meth:`BlobSink.store_file` for files already opened on disk (a pool),
:class:`BlobStream` for tar members, which arrive one after another (one thread, fed
through a bounded queue). Nothing is ever read past a cap: a file job reads at most its
expected size plus one byte.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from orchestrator.staging.errors import CollectionError

__all__ = ["CHUNK", "BlobSink", "BlobStream", "Reader", "SourceFailed", "Stored"]

#: Bytes read and written at a time.
CHUNK = 1 << 20
#: Worker threads copying files, and files opened ahead of them.
WORKERS = max(2, min(4, os.cpu_count() or 1))
IN_FLIGHT = 32
Reader = Callable[[int], bytes]
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SourceFailed(Exception):
    """Reading the untrusted source failed (a cut stream, an I/O error): not our fault."""


@dataclass(frozen=True)
class Stored:
    """The outcome of one file job: a blob, an unchanged file, or why nothing was kept."""

    sha256: str | None
    size: int
    base_sha256: str | None = None
    unchanged: bool = False
    problem: str | None = None


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(read: Reader, cap: int, fd: int | None) -> tuple[str, int] | None:
    """Hash (and write to ``fd``) what ``read`` gives; None once past ``cap`` bytes."""
    digest = hashlib.sha256()
    size = 0
    while True:
        try:
            data = read(min(CHUNK, cap + 1 - size))
        except Exception as exc:
            raise SourceFailed(str(exc) or type(exc).__name__) from exc
        if not data:
            return digest.hexdigest(), size
        size += len(data)
        if size > cap:
            return None
        digest.update(data)
        if fd is not None:
            _write_all(fd, data)


class BlobSink:
    """A private temporary folder of blobs named by SHA-256."""

    def __init__(self, tmp_dir: Path | None = None, *, workers: int = WORKERS) -> None:
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
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(IN_FLIGHT)

    def path(self, sha256: str) -> Path:
        return self.folder / sha256

    def _failure(self, exc: OSError) -> CollectionError:
        return CollectionError(
            f"cannot write a blob in {self.folder}: {exc.strerror}; check that filesystem "
            "(free space, permissions) or collect into another tmp_dir"
        )

    def create_part(self) -> tuple[str, int]:
        name = f".part-{next(self._parts)}"
        try:
            return name, os.open(name, _CREATE, 0o600, dir_fd=self._fd)
        except OSError as exc:
            raise self._failure(exc) from None

    def finish_part(self, name: str, sha256: str | None) -> None:
        """Name a written part by its digest (the same content twice is the same blob)."""
        try:
            if sha256 is None:
                os.unlink(name, dir_fd=self._fd)
            else:
                os.rename(name, sha256, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError as exc:
            raise self._failure(exc) from None

    def write(self, read: Reader, cap: int) -> tuple[str, int] | None:
        """Store what ``read`` gives as a blob; None (nothing kept) past ``cap`` bytes."""
        name, fd = self.create_part()
        result = None
        try:
            try:
                result = _pump(read, cap, fd)
            except OSError as exc:
                raise self._failure(exc) from None
            finally:
                os.close(fd)
        finally:
            self.finish_part(name, result[0] if result else None)
        return result

    def digest(self, read: Reader, cap: int) -> tuple[str, int] | None:
        """Hash what ``read`` gives, without keeping it; None past ``cap`` bytes."""
        return _pump(read, cap, None)

    @staticmethod
    def digest_fd(fd: int) -> str:
        """Hash everything ``fd`` holds from its current offset (trusted input only)."""
        digest = hashlib.sha256()
        while data := os.read(fd, CHUNK):
            digest.update(data)
        return digest.hexdigest()

    def store_file(
        self,
        fd: int,
        size: int,
        *,
        base: Callable[[], str | None] | None = None,
        compare: bool = False,
    ) -> Future[Stored]:
        """Copy the open file ``fd`` (now owned by the job, which closes it) into a blob.

        The file must hold exactly ``size`` bytes: more or fewer means it changed while
        being collected, and nothing is kept. ``base`` gives the digest of the content it
        replaces; with ``compare``, a file equal to it is reported unchanged, not stored.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="blobs")
        self._slots.acquire()
        try:
            future = self._pool.submit(self._file_job, fd, size, base, compare)
        except BaseException:
            self._slots.release()
            os.close(fd)
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def _file_job(
        self, fd: int, size: int, base: Callable[[], str | None] | None, compare: bool
    ) -> Stored:
        read: Reader = lambda n: os.read(fd, n)  # noqa: E731 - the job's own reader
        try:
            base_sha256 = base() if base is not None else None
            if compare and base_sha256 is not None:
                same = _pump(read, size, None)
                if same is not None and same == (base_sha256, size):
                    return Stored(base_sha256, size, base_sha256, unchanged=True)
                os.lseek(fd, 0, os.SEEK_SET)
            result = self.write(read, size)
        except SourceFailed as exc:
            return Stored(None, size, problem=f"cannot read: {exc}")
        finally:
            os.close(fd)
        if result is None or result[1] != size:
            return Stored(None, size, problem="changed while being collected")
        return Stored(result[0], size, base_sha256)

    def stream(self) -> BlobStream:
        """A writer thread for files fed chunk by chunk (tar members)."""
        return BlobStream(self)

    def prune(self, keep: set[str]) -> None:
        """Delete blobs no accepted file refers to (left by a later-refused duplicate)."""
        for entry in os.scandir(self.folder):
            if entry.name not in keep:
                os.unlink(entry.path)

    def close(self) -> None:
        """Wait for running jobs and stop the workers (the folder stays)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class BlobStream:
    """Files fed chunk by chunk to one writer thread, in order, through a bounded queue."""

    def __init__(self, sink: BlobSink) -> None:
        self._sink = sink
        self._queue: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._run, name="blob-stream", daemon=True)
        self._thread.start()

    def begin(self) -> Future[Stored]:
        future: Future[Stored] = Future()
        self._queue.put(("begin", future))
        return future

    def feed(self, data: bytes) -> None:
        self._queue.put(("data", data))

    def end(self) -> None:
        self._queue.put(("end", None))

    def abort(self) -> None:
        self._queue.put(("abort", None))

    def copy(self, read: Reader, size: int) -> Future[Stored] | None:
        """Feed one file of exactly ``size`` bytes from ``read``; None when it is not that.

        Never reads more than ``size + 1`` bytes. A failing ``read`` aborts the file and
        raises :class:`SourceFailed`.
        """
        future = self.begin()
        count = 0
        try:
            while True:
                try:
                    data = read(min(CHUNK, size + 1 - count))
                except Exception as exc:
                    raise SourceFailed(str(exc) or type(exc).__name__) from exc
                if not data:
                    break
                count += len(data)
                if count > size:
                    break
                self.feed(data)
        except BaseException:
            self.abort()
            raise
        if count != size:
            self.abort()
            return None
        self.end()
        return future

    def close(self) -> None:
        self._queue.put(("stop", None))
        self._thread.join()

    def _run(self) -> None:
        future: Future[Stored] | None = None
        name, fd, digest, size = "", -1, hashlib.sha256(), 0
        failure: CollectionError | None = None
        while True:
            kind, item = self._queue.get()
            if kind == "stop":
                return
            if kind == "begin":
                assert isinstance(item, Future)
                future, digest, size, failure = item, hashlib.sha256(), 0, None
                try:
                    name, fd = self._sink.create_part()
                except CollectionError as exc:
                    failure, fd = exc, -1
                continue
            if future is None:
                continue
            try:
                if kind == "data" and failure is None:
                    assert isinstance(item, bytes)
                    digest.update(item)
                    size += len(item)
                    _write_all(fd, item)
                elif kind in ("end", "abort"):
                    if fd >= 0:
                        os.close(fd)
                        fd = -1
                        sha256 = digest.hexdigest() if kind == "end" and not failure else None
                        self._sink.finish_part(name, sha256)
                    if failure is not None:
                        future.set_exception(failure)
                    else:
                        sha = digest.hexdigest() if kind == "end" else None
                        future.set_result(Stored(sha, size))
                    future = None
            except OSError as exc:
                failure = self._sink._failure(exc)
            except CollectionError as exc:
                failure = exc
                if future is not None and not future.done():
                    future.set_exception(exc)
                    future = None
