"""Host-side file operations over the paths a worker sees (``/input/a.pdf``, ``/session/x``).

:class:`SandboxFiles` answers for one grant. Each call first asks the policy
(:class:`~orchestrator.policy.ZoneView`: zone, mode, mask, suffix, size), then works through
descriptors opened from the zone's root without following anything
(:mod:`orchestrator.sandbox.nofollow`), because the worker may be changing the same folders
at the same moment. Every call, allowed or refused, can be written to the audit log.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from orchestrator.audit import AuditLog
from orchestrator.errors import OrchestratorError, PolicyError
from orchestrator.hostfs.entries import kind_of, lookup
from orchestrator.hostfs.paths import Identity
from orchestrator.policy import Grant, ZoneGrant, ZoneView
from orchestrator.sandbox import nofollow
from orchestrator.sandbox.content import ReadCaps, read_content
from orchestrator.sandbox.context import security_context, virtual_children
from orchestrator.sandbox.errors import SandboxError, SandboxNotFound
from orchestrator.sandbox.nofollow import Owner, WalkError
from orchestrator.sandbox.results import (
    DeleteResult,
    Entry,
    FileStat,
    Listing,
    ReadResult,
    Resolved,
    WriteResult,
)
from orchestrator.sandbox.roots import Parts, ZoneRoots, fail, os_refusal

T = TypeVar("T")
MAX_ENTRIES = 1000
#: Operations that change the zone: their audit log is checked before they run.
_CHANGES = frozenset({"write", "delete"})


def _check_path(op: str, path: object) -> None:
    """Refuse a path that is not a string (a programming error, not a refusal to audit)."""
    if not isinstance(path, str):
        raise TypeError(
            f"Cannot {op}: the path must be a string such as '/input/a.txt', "
            f"not {type(path).__name__}"
        )


def _check_lines(path: str, **counts: object) -> None:
    """Refuse an ``offset`` or ``limit`` that is not a whole number (None: the default)."""
    for name, value in counts.items():
        if value is not None and (type(value) is not int):
            raise TypeError(
                f"Cannot read '{path}': {name} must be a whole number of lines (or None), "
                f"not {type(value).__name__}"
            )


class OutboxWriter(Protocol):
    """The hook for writes to the outbox (``/staged``): it is a tmpfs inside the container,
    not a host folder, so a session supplies this to stage files (``relative`` is the path
    inside the outbox). Without it, host-side writes to the outbox are refused."""

    def stage_write(self, relative: str, data: bytes, *, append: bool) -> WriteResult: ...


class SandboxFiles:
    """read, write, delete, list, stat, exists, resolve, can_read, can_write and
    security_context over one grant's virtual paths.

    ``owner`` (uid, gid) is given to files and folders this creates when the orchestrator
    runs as root, so the worker (never root) can still change them; pass the prepared run's
    ``uid, gid``. Zone roots are opened once, on first use, and kept until :meth:`close`.
    For an ``approval.write: ask`` zone the grant's ``host_path`` already is the run's
    private copy, so writing there is exactly what the worker's own writes do: the change
    reaches the zone only when its change set is approved.
    """

    def __init__(
        self,
        grant: Grant,
        *,
        owner: tuple[int, int] | None = None,
        audit: AuditLog | None = None,
        session_id: str | None = None,
        worker: str | None = None,
        outbox: OutboxWriter | None = None,
        caps: ReadCaps | None = None,
        identities: Mapping[str, Identity] | None = None,
    ) -> None:
        """``identities``: the folders the container mounts, by host path (a run's
        :attr:`~orchestrator.runtime.run.Run.sources`); a zone whose path leads elsewhere
        is refused. Without them, each zone must stay the folder first opened."""
        self.grant = grant
        self.view = ZoneView(grant)
        self.audit = audit
        self.session_id = session_id
        self.worker = worker
        self.outbox = outbox
        self.caps = caps or ReadCaps()
        self._owner: Owner = owner if owner is not None and os.geteuid() == 0 else None
        self._roots = ZoneRoots(self._owner, identities)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        self._roots.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- operations -----------------------------------------------------------------------

    def read(self, path: str, offset: int | None = None, limit: int | None = None) -> ReadResult:
        """A text window (``offset``: first line, 1-based; ``limit``: lines, default
        ``caps.lines``), an image, or a note that the file is binary."""

        _check_path("read", path)
        _check_lines(path, offset=offset, limit=limit)

        def run() -> ReadResult:
            if (offset is not None and offset < 1) or (limit is not None and limit < 1):
                raise SandboxError(f"Cannot read '{path}': offset and limit count lines from 1")
            zone, parts = self._zone("read", path)
            with self._roots.parent("read", path, zone, parts) as (folder, name):
                if not name:  # a zone's root: a folder, or a zone that is a single file
                    info = os.fstat(folder)
                    if not stat.S_ISREG(info.st_mode):
                        raise SandboxError(f"Cannot read '{path}': it is a folder; list it instead")
                    fd = os.dup(folder)
                else:
                    try:
                        fd, info = nofollow.open_regular(folder, name, path)
                    except WalkError as exc:
                        raise fail("read", path, exc) from None
            try:
                return read_content(fd, info.st_size, path, self.caps, offset or 1, limit)
            finally:
                os.close(fd)

        return self._audited("read", path, run)

    def read_bytes(self, path: str, limit: int) -> bytes:
        """A regular file's raw bytes (for copying out), refused when larger than ``limit``;
        resolved and audited like :meth:`read`."""

        def run() -> bytes:
            zone, parts = self._zone("read", path)
            with self._roots.parent("read", path, zone, parts) as (folder, name):
                if not name:
                    if not stat.S_ISREG(os.fstat(folder).st_mode):
                        raise SandboxError(f"Cannot read '{path}': it is a folder; list it instead")
                    fd = os.dup(folder)
                else:
                    try:
                        fd, _info = nofollow.open_regular(folder, name, path)
                    except WalkError as exc:
                        raise fail("read", path, exc) from None
            try:
                size = os.fstat(fd).st_size
                if size > limit:
                    raise SandboxError(
                        f"Cannot read '{path}': it is {size} bytes, more than the {limit} "
                        "bytes one copy may carry"
                    )
                chunks = []
                total = 0
                while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > limit:  # grew while being read
                        raise SandboxError(
                            f"Cannot read '{path}': it grew past the {limit} bytes one copy "
                            "may carry while being read"
                        )
                return b"".join(chunks)
            finally:
                os.close(fd)

        return self._audited("read", path, run, raw=True, limit=limit)

    def write(self, path: str, content: str | bytes, append: bool = False) -> WriteResult:
        """Write (or append) ``content``, creating missing folders. Replacing is atomic.

        Text is written as UTF-8; a lone surrogate standing for an undecodable byte
        (``os.fsdecode``'s ``\\udcff``) is written as that byte."""
        _check_path("write", path)
        try:
            data = _content_bytes(path, content)
        except SandboxError as exc:
            self._record("write", path, False, str(exc), {})
            raise

        def run() -> WriteResult:
            zone, parts = self._zone("write", path, outbox_ok=True)
            if zone.outbox:
                return self._stage(path, parts, data, append)
            zone = self.view.write_zone(path, None if append else len(data))
            if not parts:
                raise SandboxError(f"Cannot write '{path}': it is a folder; name a file in it")
            with self._roots.parent("write", path, zone, parts, create=True) as (folder, name):
                try:
                    if append:
                        size, created = nofollow.append_file(
                            folder, name, data, path, self._owner, zone.max_file_size
                        )
                    else:
                        created = nofollow.replace_file(folder, name, data, path, self._owner)
                        size = len(data)
                except WalkError as exc:
                    raise fail("write", path, exc) from None
            review = zone.ask_base is not None
            return WriteResult(path, size, len(data), created, append, zone.target, review)

        return self._audited("write", path, run, size=len(data), append=append)

    def delete(self, path: str) -> DeleteResult:
        """Remove a file, or a folder with everything in it (links inside are unlinked,
        never followed). A zone's root, read-only zones and blocked deletes are refused."""

        def run() -> DeleteResult:
            zone, parts = self._zone("delete", path)
            if zone.read_only:
                raise PolicyError(
                    [f"Cannot delete '{path}': {zone.target} is read-only. Writable: "
                     f"{self.view.writable()}"]
                )  # fmt: skip
            if zone.delete == "blocked":
                raise PolicyError([f"Cannot delete '{path}': deletes in {zone.target} are blocked"])
            if not parts:
                raise SandboxError(f"Cannot delete '{path}': it is the root of {zone.target}")
            with self._roots.parent("delete", path, zone, parts) as (folder, name):
                try:
                    kind, removed = nofollow.remove(folder, name, path)
                except WalkError as exc:
                    raise fail("delete", path, exc) from None
            return DeleteResult(path, kind, removed, zone.target, zone.ask_base is not None)

        return self._audited("delete", path, run)

    def list(self, path: str = "/") -> Listing:
        """The entries of a folder, links and other special entries shown as what they are
        (never followed). ``/`` lists the granted zones as plain folders."""

        def run() -> Listing:
            virtual = self._virtual(path)
            if virtual is not None:
                names = virtual_children(self.grant, virtual)
                entries = [Entry(n, posixpath.join(virtual, n), "folder") for n in names]
                return Listing(virtual, tuple(entries))
            zone, parts = self._zone("list", path)
            clean = posixpath.join(zone.target, *parts)
            with self._roots.parent("list", path, zone, parts, whole=True) as (folder, _):
                return self._listing(folder, clean)

        return self._audited("list", path, run)

    def stat(self, path: str) -> FileStat:
        """What is at ``path``, without following it if it is a link."""

        def run() -> FileStat:
            virtual = self._virtual(path)
            if virtual is not None:
                return FileStat(virtual, "folder", None, None, None, None)
            zone, parts = self._zone("stat", path)
            clean = posixpath.join(zone.target, *parts)
            with self._roots.parent("stat", path, zone, parts) as (folder, name):
                info = os.fstat(folder) if not name else lookup(folder, name)
            if info is None:
                raise SandboxNotFound(f"Cannot stat '{path}': {clean} does not exist")
            kind = kind_of(info.st_mode)
            size = info.st_size if kind == "file" else None
            mode = stat.S_IMODE(info.st_mode)
            return FileStat(clean, kind, size, mode, info.st_mtime, zone.target)

        return self._audited("stat", path, run)

    def exists(self, path: str) -> bool:
        """Whether anything the worker could see is at ``path`` (False when refused)."""
        try:
            self.stat(path)
        except OrchestratorError:
            return False
        return True

    def resolve(self, path: str) -> Resolved:
        """The zone and host location behind ``path``; every existing folder on the way is
        checked to be a real folder (no link)."""

        def run() -> Resolved:
            zone, parts = self._zone("resolve", path)
            found = self._roots.probe("resolve", path, zone, parts, missing_ok=True)
            kind = None if found is None else kind_of(found.st_mode)
            relative = "/".join(parts)
            host = str(zone.host_path / relative) if relative else str(zone.host_path)
            return Resolved(
                posixpath.join(zone.target, *parts), zone.target, relative, host,
                found is not None, kind,
            )  # fmt: skip

        return self._audited("resolve", path, run)

    def can_read(self, path: str) -> bool:
        """Whether ``read`` (a file) or ``list`` (a folder) would be allowed now."""
        try:
            if self._virtual(path) is not None:
                return True
            zone, parts = self._zone("read", path)
            found = self._roots.probe("read", path, zone, parts)
        except OrchestratorError:
            return False
        return found is not None and kind_of(found.st_mode) in ("file", "folder")

    def can_write(self, path: str, size: int | None = None) -> bool:
        """Whether ``write`` of ``size`` bytes (when given) would be allowed now."""
        try:
            zone, parts = self._zone("write", path, outbox_ok=True)
            if zone.outbox:
                return self.outbox is not None and bool(parts)
            self.view.write_zone(path, size)
            found = self._roots.probe("write", path, zone, parts, missing_ok=True)
        except OrchestratorError:
            return False
        return bool(parts) and (found is None or stat.S_ISREG(found.st_mode))

    def security_context(self) -> dict[str, Any]:
        """Trust, zones (read/write/list/delete and approvals), network and limits."""
        return security_context(self.grant, self.caps, staging=self.outbox is not None)

    # -- internals ------------------------------------------------------------------------

    def _audited(self, op: str, path: str, run: Callable[[], T], **meta: Any) -> T:
        """Run one operation and audit it, allowed or refused.

        An operation that changes something first makes sure the log can take its entry,
        so a log that cannot be written refuses the change instead of missing it. An
        ``OSError`` the checks did not foresee (a name over 255 bytes, a folder the worker
        removed mid-walk) is refused like the rest, as a :class:`SandboxError`.
        """
        _check_path(op, path)
        if op in _CHANGES and self.audit is not None:
            self.audit.ready()
        try:
            try:
                result = run()
            except OSError as exc:
                if isinstance(exc, OrchestratorError):
                    raise
                raise os_refusal(op, path, exc) from None
        except OrchestratorError as exc:
            self._record(op, path, False, str(exc), meta)
            raise
        except Exception as exc:  # a bug: audited, then raised as it is
            self._record(op, path, False, f"Cannot {op} '{path}': {exc!r}", meta)
            raise
        self._record(op, path, True, None, meta)
        return result

    def _record(
        self, op: str, path: str, allowed: bool, reason: str | None, meta: dict[str, Any]
    ) -> None:
        if self.audit is None:
            return
        located = self._zone_name(path)
        self.audit.record(
            f"sandbox.{op}",
            allowed=allowed,
            reason=reason,
            worker=self.worker,
            session_id=self.session_id,
            trust_level=self.grant.trust,
            zone=located,
            path=path,
            metadata=meta or None,
        )

    def _zone_name(self, path: str) -> str | None:
        try:
            return self.view.locate("use", path)[0].name
        except PolicyError:
            return None

    def _virtual(self, path: str) -> str | None:
        """``path`` cleaned when it is ``/`` or a folder above some zone, else None."""
        if not path.startswith("/") or ".." in path.split("/") or "\0" in path:
            return None
        clean = posixpath.normpath(path)
        if clean == "/" or virtual_children(self.grant, clean):
            inside = any(clean == z.target or clean.startswith(z.target + "/")
                         for z in self.grant.zones)  # fmt: skip
            return None if inside else clean
        return None

    def _zone(self, verb: str, path: str, *, outbox_ok: bool = False) -> tuple[ZoneGrant, Parts]:
        zone, relative = self.view.locate(verb, path)
        if zone.outbox and not outbox_ok:
            raise PolicyError([f"Cannot {verb} '{path}': {zone.target} is the run's write-only "
                               "outbox; what is staged there is seen at review"])  # fmt: skip
        return zone, [part for part in relative.split("/") if part]

    def _stage(self, path: str, parts: Parts, data: bytes, append: bool) -> WriteResult:
        if not parts:
            raise SandboxError(f"Cannot write '{path}': it is a folder; name a file in it")
        if self.outbox is None:
            raise PolicyError(
                [f"Cannot write '{path}': /staged is the container's outbox, not a host folder, "
                 "and this sandbox offers no host-side staging; write it from inside the "
                 f"sandbox. Writable here: {self._host_writable()}"]
            )  # fmt: skip
        return self.outbox.stage_write("/".join(parts), data, append=append)

    def _host_writable(self) -> str:
        names = sorted({z.target for z in self.grant.zones if not z.read_only and not z.outbox})
        return ", ".join(names) or "nothing"

    def _listing(self, folder: int, clean: str) -> Listing:
        masks = set(self.grant.masks)
        entries: dict[str, Entry] = {}
        truncated = False
        with os.scandir(folder) as found:
            for item in found:
                child = posixpath.join(clean, item.name)
                if child in masks:
                    continue
                if len(entries) >= MAX_ENTRIES:
                    truncated = True
                    break
                try:
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                kind = kind_of(info.st_mode)
                size = info.st_size if kind == "file" else None
                entries[item.name] = Entry(item.name, child, kind, size)
        for name in virtual_children(self.grant, clean):  # zones mounted inside this one
            entries.setdefault(name, Entry(name, posixpath.join(clean, name), "folder"))
        return Listing(clean, tuple(entries[n] for n in sorted(entries)), truncated)


def _content_bytes(path: str, content: object) -> bytes:
    """``content`` as the bytes to write: text as UTF-8, bytes-like as they are."""
    if isinstance(content, str):
        try:
            return content.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            raise SandboxError(
                f"Cannot write '{path}': the text holds {content[exc.start]!a}, which is "
                "not a character UTF-8 can carry; pass the content as bytes"
            ) from None
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    raise TypeError(
        f"Cannot write '{path}': content must be text (str) or bytes, not {type(content).__name__}"
    )
