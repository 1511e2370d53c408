"""The audit log: :class:`AuditLog` appends, queries, exports, verifies and prunes.

Appending is safe from many threads and processes at once. Each append takes the
exclusive lock (:mod:`orchestrator.audit.files`), reads the chain head from the log's
tail, writes one whole line with a single ``os.write`` on an ``O_APPEND`` descriptor and
``fsync``\\s it before returning. Descriptors stay open between appends; the log is
reopened when another process replaced it (a prune) or after a fork.

The log's folder is opened from ``/`` without following a link, once per process, and the
log and its lock are opened relative to that descriptor with ``O_NOFOLLOW``: a link
planted at either name (or on the folder's path) is refused, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TextIO

from orchestrator.audit.chain import VerifyResult, verify_file
from orchestrator.audit.entry import PRUNE_OPERATION, AuditEntry, encode_line, new_id
from orchestrator.audit.files import (
    audit_error,
    chain_head,
    ends_with_newline,
    iter_chunks,
    iter_chunks_reverse,
    lock_path_for,
    open_snapshot,
)
from orchestrator.audit.filters import AuditFilter, LineMatcher
from orchestrator.audit.prune import PruneResult, prune_locked
from orchestrator.audit.redact import TextRedactor
from orchestrator.audit.timeutil import format_timestamp, utc_now
from orchestrator.errors import AuditError
from orchestrator.hostfs.paths import open_path

__all__ = ["AuditLog"]

_LOG_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _Handles:
    """The descriptors one process keeps open on a log, and what it last saw there."""

    def __init__(self) -> None:
        self.pid = 0
        self.dir_fd = -1
        self.lock_fd = -1
        self.log_fd = -1
        self.identity: tuple[int, int] | None = None
        # (size, hash) after this process's last append: a tail read is skipped while
        # the log still has that size.
        self.tail: tuple[int, str] | None = None

    def close_log(self) -> None:
        if self.log_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.log_fd)
        self.log_fd = -1
        self.identity = None
        self.tail = None

    def close(self) -> None:
        self.close_log()
        if self.pid == os.getpid():
            for fd in (self.lock_fd, self.dir_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        self.lock_fd = self.dir_fd = -1


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class AuditLog:
    """An append-only, hash-chained JSON-lines log of what the orchestrator did.

    ``redact`` holds secret values that must never be written (see :meth:`add_secret`).
    Nothing is created until the first :meth:`record`; reading a missing log finds no
    entries. Failures to read or write raise :class:`~orchestrator.errors.AuditError`.
    """

    def __init__(
        self, path: Path, *, redact: Iterable[str] = (), folder: int | None = None
    ) -> None:
        """Use the log at ``path``, redacting every value of ``redact``.

        ``folder``, a descriptor of the log's folder (checked by the caller), is then the
        log's own (closed when the log is collected): everything is read and written
        through it, never through the names of ``path``'s folders, which may be swapped
        after the check."""
        self.path = Path(path)
        self.lock_path = lock_path_for(self.path)
        self._redactor = TextRedactor(redact)
        self._mutex = threading.Lock()
        self._handles = _Handles()
        self._finalizer = weakref.finalize(self, self._handles.close)
        self._folder = folder
        if folder is not None:
            weakref.finalize(self, _close_quietly, folder)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """Errors name the log's path, not the descriptor link it is reached through."""
        try:
            yield
        except AuditError as exc:
            if self._folder is None:
                raise
            raise AuditError(str(exc).replace(str(self._at), str(self.path))) from None

    @property
    def _at(self) -> Path:
        """Where reads go: ``path``, or the same name through the held folder."""
        if self._folder is None:
            return self.path
        return Path(f"/proc/{os.getpid()}/fd/{self._folder}", self.path.name)

    def __repr__(self) -> str:
        """Name the log's path."""
        return f"AuditLog({str(self.path)!r})"

    def __enter__(self) -> Self:
        """Return the log; :meth:`close` runs on exit."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the descriptors."""
        self.close()

    def close(self) -> None:
        """Close the descriptors kept open between appends (the log reopens on demand)."""
        with self._mutex:
            self._handles.close()

    def add_secret(self, value: str) -> None:
        """Redact ``value`` from every later entry.

        Values shorter than 4 characters are ignored: redacting them would mangle every
        entry while protecting nothing.
        """
        self._redactor.add(value)

    # -- writing -------------------------------------------------------------------

    def ready(self) -> None:
        """Open the log and its lock now, raising :class:`~orchestrator.errors.AuditError`
        when either cannot be.

        Called before an operation that changes something, so a log that cannot take the
        operation's entry refuses the change rather than letting it go unrecorded.
        """
        with self._locked() as handles:
            try:
                self._reopen_if_replaced(handles)
            except OSError as exc:
                handles.tail = None
                raise audit_error(self.path, "write", exc) from None

    def record(
        self,
        operation: str,
        *,
        allowed: bool = True,
        reason: str | None = None,
        worker: str | None = None,
        run_id: str | None = None,
        session_id: str | None = None,
        trust_level: str | None = None,
        zone: str | None = None,
        path: str | os.PathLike[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AuditEntry:
        """Append one entry, durably, and return it as written (secrets redacted)."""
        if not isinstance(operation, str) or not operation.strip():
            raise ValueError("operation must be a non-empty string such as 'run.started'")
        if operation == PRUNE_OPERATION:
            raise ValueError(f"operation '{PRUNE_OPERATION}' is reserved for prune()")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
        clean = self._redactor
        fields: dict[str, Any] = {
            "operation": clean.redact_text(operation),
            "allowed": bool(allowed),
            "reason": clean.clean_text(reason),
            "worker": clean.clean_text(worker),
            "run_id": clean.clean_text(run_id),
            "session_id": clean.clean_text(session_id),
            "trust_level": clean.clean_text(trust_level),
            "zone": clean.clean_text(zone),
            "path": clean.clean_text(path),
            "metadata": clean.clean(metadata or {}),
        }
        with self._locked() as handles:
            # Taken under the lock, so timestamps never go backwards down the file.
            now = utc_now()
            body = {"id": new_id(), "timestamp": format_timestamp(now), **fields}
            try:
                self._reopen_if_replaced(handles)
                size = os.fstat(handles.log_fd).st_size
                if handles.tail is not None and handles.tail[0] == size:
                    body["prev"], needs_newline = handles.tail[1], False
                else:
                    body["prev"] = chain_head(handles.log_fd, size)
                    needs_newline = not ends_with_newline(handles.log_fd, size)
                line, digest = encode_line(body)
                if needs_newline:
                    line = b"\n" + line  # end a torn line; the entry gets a line of its own
                written = os.write(handles.log_fd, line)
                while written < len(line):  # only on a short write (a full disk)
                    written += os.write(handles.log_fd, line[written:])
                os.fsync(handles.log_fd)
            except OSError as exc:
                handles.tail = None
                raise audit_error(self.path, "write", exc) from None
            handles.tail = (size + len(line), digest)
        return AuditEntry(
            id=body["id"],
            timestamp=now,
            operation=fields["operation"],
            allowed=fields["allowed"],
            reason=fields["reason"],
            worker=fields["worker"],
            run_id=fields["run_id"],
            session_id=fields["session_id"],
            trust_level=fields["trust_level"],
            zone=fields["zone"],
            path=fields["path"],
            metadata=fields["metadata"],
            prev=body["prev"],
            hash=digest,
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[_Handles]:
        """Hold the exclusive lock (and this object's mutex), opening files as needed."""
        with self._mutex:
            handles = self._open_handles()
            try:
                fcntl.flock(handles.lock_fd, fcntl.LOCK_EX)
            except OSError as exc:
                raise audit_error(self.lock_path, "lock", exc, "audit lock file") from None
            try:
                yield handles
            finally:
                fcntl.flock(handles.lock_fd, fcntl.LOCK_UN)

    def _open_handles(self) -> _Handles:
        handles = self._handles
        if handles.pid != os.getpid():
            # A fork shares our open file descriptions, and with them the flock: the
            # child must have its own. Its inherited copies are closed, not unlocked.
            for fd in (handles.lock_fd, handles.log_fd, handles.dir_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            handles.lock_fd = handles.log_fd = handles.dir_fd = -1
            handles.identity = handles.tail = None
            handles.pid = os.getpid()
        if handles.dir_fd < 0 and self._folder is not None:
            handles.dir_fd = os.dup(self._folder)
        if handles.dir_fd < 0:
            try:  # each missing folder made in the one above it, none through a link
                handles.dir_fd = open_path(self.path.parent.absolute(), create=0o700)
            except OSError as exc:
                raise audit_error(self.path, "create the folder of", exc) from None
        if handles.lock_fd < 0:
            try:
                handles.lock_fd = os.open(
                    self.lock_path.name, _LOCK_FLAGS, 0o600, dir_fd=handles.dir_fd
                )
                if not stat.S_ISREG(os.fstat(handles.lock_fd).st_mode):
                    os.close(handles.lock_fd)
                    handles.lock_fd = -1
                    raise IsADirectoryError(errno.EISDIR, "not a regular file")
            except OSError as exc:
                raise audit_error(self.lock_path, "open", exc, "audit lock file") from None
        return handles

    def _reopen_if_replaced(self, handles: _Handles) -> None:
        """Make ``handles.log_fd`` refer to the file now at the log's path (lock held)."""
        name, folder = self.path.name, handles.dir_fd
        if handles.log_fd >= 0:
            try:
                status = os.stat(name, dir_fd=folder, follow_symlinks=False)
                current: tuple[int, int] | None = (status.st_dev, status.st_ino)
            except FileNotFoundError:
                current = None
            if current == handles.identity:
                return
            handles.close_log()
        try:
            fd = os.open(name, _LOG_FLAGS | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder)
            created = True
        except FileExistsError:
            fd = os.open(name, _LOG_FLAGS, dir_fd=folder)  # ELOOP for a link
            created = False
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, "not a regular file")
        handles.log_fd = fd
        handles.identity = (status.st_dev, status.st_ino)
        handles.tail = None
        if created:
            os.fsync(folder)

    # -- reading -------------------------------------------------------------------

    def iter_query(self, flt: AuditFilter | None = None) -> Iterator[AuditEntry]:
        """Yield the entries ``flt`` selects, oldest first; damaged lines are skipped.

        With a ``limit`` the log is read backwards from its end and stops once it has
        the most recent N matches.
        """
        flt = flt or AuditFilter()
        if flt.limit == 0:
            return
        with self._named():
            snapshot = open_snapshot(self._at)
        if snapshot is None:
            return
        handle, size = snapshot
        matcher = LineMatcher(flt)
        with handle:
            try:
                if flt.limit is None:
                    for chunk in iter_chunks(handle, size):
                        for raw in matcher.candidates(chunk):
                            entry = matcher.match(raw)
                            if entry is not None:
                                yield entry
                    return
                found: list[AuditEntry] = []
                for chunk in iter_chunks_reverse(handle.fileno(), size):
                    for raw in matcher.candidates(chunk, reverse=True):
                        entry = matcher.match(raw)
                        if entry is not None:
                            found.append(entry)
                            if len(found) >= flt.limit:
                                break
                    if len(found) >= flt.limit:
                        break
            except OSError as exc:
                raise audit_error(self.path, "read", exc) from None
        yield from reversed(found)

    def query(self, flt: AuditFilter | None = None) -> list[AuditEntry]:
        """Return the entries ``flt`` selects, oldest first (see :meth:`iter_query`)."""
        return list(self.iter_query(flt))

    def violations(self, limit: int = 50) -> list[AuditEntry]:
        """Return the ``limit`` most recent denials, oldest first."""
        return self.query(AuditFilter(denied_only=True, limit=limit))

    def export(self, flt: AuditFilter | None, out: TextIO) -> int:
        """Write the entries ``flt`` selects to ``out`` as a JSON array; return how many."""
        entries = self.iter_query(flt)
        first = next(entries, None)  # the log is opened (or fails) before anything is written
        if first is None:
            out.write("[]\n")
            return 0
        out.write("[\n  " + json.dumps(first.to_dict(), ensure_ascii=False))
        count = 1
        for entry in entries:
            out.write(",\n  " + json.dumps(entry.to_dict(), ensure_ascii=False))
            count += 1
        out.write("\n]\n")
        return count

    # -- maintenance ---------------------------------------------------------------

    def verify(self) -> VerifyResult:
        """Check the whole chain; see :mod:`orchestrator.audit.chain` for the rules."""
        with self._named():
            return verify_file(self._at)

    def prune(self, older_than: timedelta) -> PruneResult:
        """Drop the entries older than ``older_than`` and head the log with an anchor.

        Runs under the exclusive lock and replaces the log atomically; see
        :mod:`orchestrator.audit.prune`.
        """
        if older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative, not {older_than}")
        if not self._at.exists() and not self._at.is_symlink():
            return PruneResult(dropped=0, kept=0)
        with self._locked():
            now = utc_now()
            with self._named():
                return prune_locked(self._at, now - older_than, now)
