"""Collecting a tar stream written by an untrusted container: every byte of it is hostile.

The stream is what ``tar --sparse -C /staged -cf - .`` printed inside the container. It is parsed
with :mod:`tarfile` in streaming mode (``r|``: no seeking, no compression, nothing
extracted), and only regular files are kept, each copied into a blob while being hashed.
The parser is fenced in:

- the whole stream may be at most twice the outbox cap plus header room
  (:func:`stream_budget`); past that, reading stops;
- each member is skipped by what the stream actually stores for it (for a sparse file,
  its map and written chunks, not its apparent size): a refused member costs what it
  stores, never more; a member storing more than the stream may still hold stops reading
  at once, so a header claiming 10 GB costs nothing; a member over a per-file or total cap
  is refused and its data skipped without being stored;
- GNU long-name and pax headers are capped at :data:`META_MAX` bytes (tarfile reads them
  into memory); sparse maps are never kept (a GNU map chain is skipped block by block);
- a read after the end of the stream raises instead of looping (tarfile skips data by
  reading, even past the end).

A stream that ends early or breaks is not an error: what was fully read and hashed is
kept, and a rejection names the last entry read, after which nothing was.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import BinaryIO, Self, cast

from orchestrator.config.models import OutboxLimits
from orchestrator.staging.blobs import BlobSink, SourceFailed, Stored
from orchestrator.staging.collected import STREAM, Collected, Intake
from orchestrator.staging.names import is_root, normal_mode, printable

__all__ = ["META_MAX", "collect_tar", "stream_budget"]

#: tarfile's read-ahead: it copies what is left of it on every read, so keep it modest.
READ_AHEAD = 64 << 10
#: Largest GNU long-name or pax extended header accepted (they are read into memory).
META_MAX = 256 << 10
_META_TYPES = frozenset(
    {tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
     tarfile.SOLARIS_XHDTYPE}
)  # fmt: skip
#: pax keywords by which tarfile would replace ``size`` with a sparse file's apparent size.
_APPARENT = ("GNU.sparse.size", "GNU.sparse.realsize")
BLOCK = tarfile.BLOCKSIZE
_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO (named pipe)",
}


class _StreamProblem(Exception):
    """The stream went past its budget or was read again after its end."""


def stream_budget(limits: OutboxLimits) -> int:
    """The most bytes :func:`collect_tar` reads from one stream."""
    return 2 * limits.size + 4096 * (2 * limits.max_files + 16)


class _Fenced:
    """A read-only view of the stream that stops at a byte budget and at its end."""

    def __init__(self, stream: BinaryIO, budget: int) -> None:
        self._stream = stream
        self.budget = budget
        self.remaining = budget
        self._ends = 0

    def read(self, size: int = -1) -> bytes:
        if self.remaining <= 0:
            raise _StreamProblem("the stream is longer than the outbox can be")
        want = self.remaining if size < 0 else min(size, self.remaining)
        data = self._stream.read(want)
        if not data:
            self._ends += 1
            if self._ends > 1:
                raise _StreamProblem("the stream ended in the middle of the archive")
            return b""
        self.remaining -= len(data)
        return data

    def write(self, data: bytes, /) -> int:
        raise OSError("read-only stream")

    def tell(self) -> int:
        raise OSError("not seekable")

    def seek(self, pos: int, /) -> int:
        raise OSError("not seekable")

    def close(self) -> None:
        """The caller owns the stream and closes it."""


class _GuardedInfo(tarfile.TarInfo):
    """Member headers with meta headers capped, noting how the archive ended."""

    @classmethod
    def fromtarfile(cls, tarfile: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tarfile)
        except Exception as exc:
            if isinstance(tarfile, _WatchedTar):
                tarfile.ending = type(exc).__name__
            raise

    def _proc_member(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _META_TYPES and self.size > META_MAX:
            raise _StreamProblem(f"an extended header of {self.size} bytes (over {META_MAX})")
        return super()._proc_member(tarfile)  # type: ignore[misc,no-any-return]

    # Sparse members: tarfile keeps their maps in memory without any cap, and sets
    # ``size`` to the apparent size. Here no map is kept, ``size`` stays what the stream
    # stores (map and written chunks), and the apparent size is noted apart: the member
    # is refused and skipped by what it stores. Our own tar writes old GNU sparse members.
    apparent: int | None = None
    """A sparse member's apparent size (None: not sparse, or not stated)."""

    def _proc_sparse(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        _, extended, apparent = self._sparse_structs  # type: ignore[attr-defined]
        del self._sparse_structs  # type: ignore[attr-defined]
        while extended:  # a chain of map blocks: each costs a block of the stream budget
            block = tarfile.fileobj.read(BLOCK)
            if len(block) < BLOCK:
                raise _StreamProblem("the stream ended inside a sparse map")
            extended = bool(block[504])
        self.sparse = []  # type: ignore[assignment]  # marks the member as sparse
        self.apparent = apparent
        self.offset_data = tarfile.fileobj.tell()
        tarfile.offset = self.offset_data + self._block(self.size)  # type: ignore[attr-defined]
        return self

    def _proc_gnusparse_00(self, next: tarfile.TarInfo, *args: object) -> None:
        # pax sparse 0.0 and 0.1 keep the map in the (capped) pax header, 1.0 in front of
        # the stored data: it is skipped with that data, unread.
        next.sparse = []  # type: ignore[assignment]

    _proc_gnusparse_01 = _proc_gnusparse_00
    _proc_gnusparse_10 = _proc_gnusparse_00

    def _apply_pax_info(self, pax_headers: dict[str, str], encoding: str, errors: str) -> None:
        stated = [pax_headers[key] for key in _APPARENT if key in pax_headers]
        kept = {key: value for key, value in pax_headers.items() if key not in _APPARENT}
        super()._apply_pax_info(kept, encoding, errors)  # type: ignore[misc]
        if stated:
            self.apparent = int(stated[-1]) if stated[-1].isdigit() else None


class _WatchedTar(tarfile.TarFile):
    members: list[tarfile.TarInfo]  # set by TarFile (missing from the type stubs)
    ending: str | None = None
    """The exception that ended header reading: ``EOFHeaderError`` means a clean end."""


def collect_tar(
    stream: BinaryIO,
    *,
    limits: OutboxLimits,
    suffixes: list[str] | tuple[str, ...] | None = None,
    tmp_dir: Path | None = None,
) -> Collected:
    """Collect the regular files of a hostile tar ``stream`` into a :class:`Collected`.

    Rejected (and recorded, the rest still collected): links, devices, FIFOs and any other
    non-regular entry, sparse files, unsafe names (see :mod:`.names`), duplicates, entries
    past ``limits.max_files``, files over ``limits.max_file_size`` or bringing the total
    over ``limits.size``, and names outside ``suffixes``. Folders are accepted silently.
    ``tmp_dir`` is where the blob folder is made (put it on the store's filesystem:
    :meth:`ChangeStore.scratch`). The caller closes ``stream`` and stops its producer.
    """
    sink = BlobSink(tmp_dir)
    try:
        intake = Intake(limits, suffixes, sink)
        truncated = _read_members(_Fenced(stream, stream_budget(limits)), intake)
        return intake.finish(truncated=truncated)
    except BaseException:
        sink.discard()
        raise


def _read_members(source: _Fenced, intake: Intake) -> bool:
    """Collect every member; return True when the stream did not end cleanly."""
    try:
        tar = _WatchedTar.open(
            fileobj=source,
            mode="r|",
            bufsize=READ_AHEAD,
            tarinfo=_GuardedInfo,
            encoding="utf-8",
            errors="surrogateescape",
        )
    except Exception as exc:  # noqa: BLE001 - hostile input: any parser failure is "corrupt"
        intake.reject(STREAM, f"not a readable tar stream ({_why(exc)}); nothing was collected")
        return True
    last: str | None = None
    while True:
        try:
            member = tar.next()
        except Exception as exc:  # noqa: BLE001 - as above
            intake.reject(STREAM, f"stream broken ({_why(exc)}); {_unread(last)}")
            return True
        tar.members.clear()  # keep memory flat however many entries arrive
        if member is None:
            if tar.ending == "EOFHeaderError":
                return False
            intake.reject(STREAM, f"stream truncated or corrupt; {_unread(last)}")
            return True
        last = printable(member.name.removeprefix("./"))
        if not _member(tar, member, source, intake):
            return True


def _unread(last: str | None) -> str:
    if last is None:
        return "no entry could be read"
    return f"entries after '{last}' were not read"


#: What a rejection that stops reading adds (it names the entry).
_AFTER = "entries after it were not read"


def _why(exc: BaseException) -> str:
    return printable(str(exc) or type(exc).__name__)[:200]


def _member(tar: _WatchedTar, member: tarfile.TarInfo, source: _Fenced, intake: Intake) -> bool:
    """Handle one member; False when reading must stop here."""
    shown = printable(member.name.removeprefix("./"))  # `tar -C DIR -cf - .` writes ./NAME
    span = max(tar.offset - member.offset_data, 0)  # what tarfile skips: the stored data
    if member.offset_data + span > source.budget:
        intake.reject(shown, f"stores {span} bytes, more than the stream may hold; {_AFTER}")
        return False
    if member.isdir():
        if is_root(member.name):
            return True
        if not intake.count(shown, folder=True):
            return False
        path = intake.name(member.name, shown, suffix=False)
        if path is not None:
            intake.place(path, shown, folder=True)
        return True
    if not intake.count(shown):
        return False
    if not member.isreg():
        kind = _KINDS.get(member.type, f"unsupported entry type {member.type!r}")
        target = f" to '{printable(member.linkname)}'" if member.issym() or member.islnk() else ""
        intake.reject(shown, f"{kind}{target}: only regular files are collected")
        return True
    if member.issparse():
        size = getattr(member, "apparent", None)
        apparent = "" if size is None else f"{size} bytes apparent, "
        why = f"sparse file ({apparent}{span} stored): only plain regular files are collected"
        intake.reject(shown, why)
        return True
    if member.size < 0 or member._block(member.size) != span:  # type: ignore[attr-defined]
        intake.reject(shown, f"its headers disagree on its size ({member.size} or {span})")
        return True
    path = intake.name(member.name, shown)
    if path is None or not intake.place(path, shown):
        return True
    reason = intake.over(member.size)
    if reason:
        intake.reject(shown, reason)
        return True
    data = tar.extractfile(member)
    if data is None:  # cannot happen for a regular file; refuse rather than guess
        intake.reject(shown, "no content could be read")
        return True
    try:
        result = intake.sink.write(cast(io.BufferedReader, data).readinto, member.size)
    except SourceFailed as exc:
        reason = f"stream broke inside this file ({printable(str(exc))[:200]}); {_AFTER}"
        intake.reject(shown, reason)
        return False
    if result is None or result[1] != member.size:
        intake.reject(shown, f"content does not match its header size; {_AFTER}")
        return False
    stored = Stored(result[0], result[1])
    intake.take(path, shown, "create", normal_mode(member.mode), stored)
    return True
