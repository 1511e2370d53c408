"""A build's context folder, read as hostile input: nothing followed, nothing special opened.

A task's context comes from wherever the task came from. It is walked once, as zones are
(:func:`orchestrator.hostfs.walk.walk`: one folder descriptor at a time, never following a
link), into a manifest of what is there; ``.dockerignore`` leaves entries out. ``COPY`` and
``ADD`` pick from the manifest, and each file is then opened beneath the context's own
descriptor without following a link and checked to be the file the walk saw (device and
inode), so a name swapped in between is refused, never followed. What cannot be copied is
refused naming its path: a FIFO, a socket or a device, and a hard link whose other names
are outside the context (its content is a host file's). A symbolic link is copied as the
link itself (it means a path inside the image), never as what it points to.

Files reach the build only as a tar made from the descriptors it opened
(:func:`tar_members`, counted first from :func:`planned`); archives ``ADD`` unpacks are
read as untrusted data: members named absolutely or with ``..``, devices and FIFOs are
refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from orchestrator.build.dockerfile import BuildRefused
from orchestrator.build.tarstream import Member, chunks_of
from orchestrator.hostfs.entries import special_kind
from orchestrator.hostfs.files import read_limited
from orchestrator.hostfs.paths import PathRefused, open_beneath, open_path
from orchestrator.hostfs.walk import Entry, walk

__all__ = ["Context", "Item", "Placed", "planned", "tar_members", "unpack_members"]

#: Largest .dockerignore or Dockerfile read.
TEXT_LIMIT = 1 << 20
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Item:
    """One entry of the context, as the walk saw it."""

    path: str
    """Its path from the context's root (``""``: the root)."""
    mode: int
    size: int
    nlink: int
    ident: tuple[int, int]
    mtime: float
    link: str | None = None
    """A symbolic link's target."""

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


@dataclass(frozen=True)
class Placed:
    """A context item (or inline content) and where it goes in the image."""

    target: str
    """Absolute path in the image."""
    item: Item | None
    content: bytes | None = None
    """Inline content (a heredoc), when ``item`` is None."""


@dataclass
class Context:
    """The context folder: its descriptor, manifest and the digests read so far."""

    root: Path
    fd: int
    items: dict[str, Item]
    digests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, root: Path) -> Context:
        """Walk ``root`` (a folder a person named; links on the way to it are theirs)."""
        try:
            real = root.resolve(strict=True)
            fd = open_path(real)
        except (OSError, PathRefused) as exc:
            raise BuildRefused(f"build context {root}: {_reason(exc)}") from None
        context = cls(real, fd, {})
        ignore = _Ignore(context.read_text(".dockerignore") or "")
        found: dict[str, Item] = {}

        def visit(entry: Entry) -> bool:
            if entry.path and ignore.excluded(entry.path):
                return stat.S_ISDIR(entry.info.st_mode) and ignore.has_exceptions
            found[entry.path] = _item(entry)
            return True

        try:
            walk(real, visit)
        except OSError as exc:
            os.close(fd)
            raise BuildRefused(f"build context {root}: {_reason(exc)}") from None
        context.items = found
        return context

    def close(self) -> None:
        os.close(self.fd)

    def read_text(self, path: str) -> str | None:
        """A small file of the context (``.dockerignore``), or None when absent."""
        try:
            fd = open_beneath(self.fd, path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BuildRefused(f"{self.root / path}: {_reason(exc)}") from None
        try:
            return read_limited(fd, TEXT_LIMIT).decode("utf-8", errors="replace")
        finally:
            os.close(fd)

    # -- picking sources --------------------------------------------------------------------

    def select(self, source: str, where: str) -> list[Item]:
        """The items a ``COPY`` source names (a path or a wildcard), each with everything
        under it; refused (naming ``where``) when nothing matches."""
        clean = _clean(source)
        if clean in self.items:
            roots = [clean]
        else:
            pattern = _glob(clean)
            roots = sorted(p for p in self.items if p and pattern.fullmatch(p))
        if not roots:
            raise BuildRefused(f"{where}: {source}: not found in the build context {self.root}")
        return [self.items[r] for r in roots]

    def under(self, folder: Item) -> list[Item]:
        prefix = f"{folder.path}/" if folder.path else ""
        return [i for p, i in sorted(self.items.items()) if p.startswith(prefix) and p != ""]

    def check(self, item: Item, where: str) -> None:
        """Refuse what cannot be copied."""
        kind = special_kind(item.mode)
        if kind is not None and not stat.S_ISLNK(item.mode):
            raise BuildRefused(f"{where}: {self.root / item.path} is a {kind}: never copied")
        if stat.S_ISREG(item.mode) and item.nlink > 1:
            names = sum(1 for i in self.items.values() if i.ident == item.ident)
            if names < item.nlink:
                raise BuildRefused(
                    f"{where}: {self.root / item.path} is a hard link to a file outside the "
                    "build context: never copied (make it a copy of its own)"
                )

    def digest(self, item: Item) -> str:
        """sha256 of what copying ``item`` brings (content, link target or folder)."""
        found = self.digests.get(item.path)
        if found is None:
            if item.link is not None:
                found = hashlib.sha256(b"link:" + item.link.encode()).hexdigest()
            elif item.is_dir:
                found = hashlib.sha256(b"folder").hexdigest()
            else:
                hasher = hashlib.sha256()
                for chunk in self._chunks(item):
                    hasher.update(chunk)
                found = hasher.hexdigest()
            self.digests[item.path] = found
        return found

    def _open(self, item: Item) -> int:
        try:
            fd = open_beneath(self.fd, item.path)
        except OSError as exc:
            raise BuildRefused(f"{self.root / item.path}: {_reason(exc)}") from None
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != item.ident:
            os.close(fd)
            raise BuildRefused(f"{self.root / item.path} changed while it was being built")
        return fd

    def _chunks(self, item: Item) -> Iterator[bytes]:
        fd = self._open(item)
        try:
            offset = 0
            while data := os.pread(fd, _CHUNK, offset):
                offset += len(data)
                yield data
        finally:
            os.close(fd)

    def content(self, item: Item) -> Iterator[bytes]:
        """The content of the file ``item`` (checked to be the one walked), exactly the
        size the walk saw: a file that changed size since is refused, naming it."""
        fd = self._open(item)
        try:
            if os.fstat(fd).st_size != item.size:
                raise BuildRefused(f"{self.root / item.path} changed while it was being built")
            offset = 0
            while offset < item.size:
                data = os.pread(fd, min(_CHUNK, item.size - offset), offset)
                if not data:
                    raise BuildRefused(f"{self.root / item.path} changed while it was being built")
                offset += len(data)
                yield data
        finally:
            os.close(fd)

    def reader(self, item: Item) -> IO[bytes]:
        """The file ``item`` opened for reading (checked to be the one walked)."""
        return os.fdopen(self._open(item), "rb")


def _item(entry: Entry) -> Item:
    info = entry.info
    link = os.readlink(entry.name, dir_fd=entry.folder) if stat.S_ISLNK(info.st_mode) else None
    return Item(entry.path, info.st_mode, info.st_size, info.st_nlink,
                (info.st_dev, info.st_ino), info.st_mtime, link)  # fmt: skip


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror:
        return exc.strerror.lower() if not isinstance(exc, PathRefused) else str(exc)
    return str(exc)


def _clean(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)


def _glob(pattern: str, *, doublestar: bool = False) -> re.Pattern[str]:
    """Go's ``filepath.Match`` (``*`` stays within one folder), and ``**`` (any number of
    folders) with ``doublestar``, as a regular expression."""
    out: list[str] = []
    at = 0
    while at < len(pattern):
        char = pattern[at]
        if doublestar and pattern.startswith("**", at):
            out.append(".*")
            at += 2
            if pattern.startswith("/", at):
                out[-1] = "(?:.*/)?"
                at += 1
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", at + 1)
            if end < 0:
                out.append(re.escape(char))
            else:
                body = pattern[at + 1 : end].replace("\\", "\\\\")
                out.append(f"[{'^' + body[1:] if body.startswith('^') else body}]")
                at = end
        elif char == "\\" and at + 1 < len(pattern):
            at += 1
            out.append(re.escape(pattern[at]))
        else:
            out.append(re.escape(char))
        at += 1
    return re.compile("".join(out))


class _Ignore:
    """``.dockerignore``: patterns in order, the last match wins, ``!`` re-includes; a
    pattern that matches a folder excludes what is under it."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            cleaned = _clean(line.removeprefix("!").strip())
            if cleaned:
                self.rules.append((negate, _glob(cleaned, doublestar=True)))
        self.has_exceptions = any(negate for negate, _ in self.rules)

    def excluded(self, path: str) -> bool:
        result = False
        prefixes = [path]
        parts = path.split("/")
        prefixes += ["/".join(parts[:n]) for n in range(1, len(parts))]
        for negate, pattern in self.rules:
            if any(pattern.fullmatch(p) for p in prefixes):
                result = not negate
        return result


# -- the tar the build puts into a step's container ------------------------------------------


def tar_members(
    context: Context | None,
    placed: Iterable[Placed],
    *,
    owner: tuple[int, int] = (0, 0),
    chmod: int | None = None,
) -> Iterator[Member]:
    """The members of ``placed`` for :func:`orchestrator.build.tarstream.stream` at ``/``:
    content read from the descriptors opened (never a path again), exactly the size the
    walk saw; owned by ``owner``, modes kept or ``chmod``."""
    for entry in placed:
        info = tarfile.TarInfo(entry.target.lstrip("/") or ".")
        info.uid, info.gid = owner
        if entry.item is None:
            data = entry.content or b""
            info.size, info.mode = len(data), chmod if chmod is not None else 0o644
            yield info, [data]
            continue
        item = entry.item
        info.mtime = int(item.mtime)
        info.mode = chmod if chmod is not None else stat.S_IMODE(item.mode)
        if item.link is not None:
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, item.link, 0o777
            yield info, None
        elif item.is_dir:
            info.type = tarfile.DIRTYPE
            yield info, None
        else:
            assert context is not None
            info.size = item.size
            yield info, context.content(item)


def planned(placed: Iterable[Placed]) -> list[tarfile.TarInfo]:
    """What :func:`tar_members` would write, as headers only (sizes as the walk saw
    them), to count before anything is read or written."""
    out = []
    for entry in placed:
        info = tarfile.TarInfo(entry.target.lstrip("/") or ".")
        item = entry.item
        if item is None:
            info.size = len(entry.content or b"")
        elif item.link is not None:
            info.type, info.linkname = tarfile.SYMTYPE, item.link
        elif item.is_dir:
            info.type = tarfile.DIRTYPE
        else:
            info.size = item.size
        out.append(info)
    return out


def unpack_members(
    archive: IO[bytes], target: str, where: str, *, content: bool = True
) -> Iterator[Member]:
    """The members of an archive ``ADD`` unpacks, renamed under ``target``; refused
    (naming ``where`` and the member) when named outside it or not a plain entry. Read as
    a stream (a compressed archive is never unpacked anywhere but into the step); without
    ``content`` only the headers are wanted (to count them: a member's data is then
    skipped, never kept)."""
    try:
        tar = tarfile.open(fileobj=archive, mode="r|*")  # noqa: SIM115 (closed below)
    except tarfile.TarError as exc:
        raise BuildRefused(f"{where}: not an archive ADD can unpack: {exc}") from None
    with tar:
        while True:
            try:
                member = tar.next()
            except tarfile.TarError as exc:
                raise BuildRefused(f"{where}: not an archive ADD can unpack: {exc}") from None
            if member is None:
                return
            tar.members.clear()  # type: ignore[attr-defined]  # (a stream of millions: never kept)
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts:
                raise BuildRefused(f"{where}: archive member {member.name} is outside its folder")
            if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
                raise BuildRefused(
                    f"{where}: archive member {member.name} is a device or FIFO: never unpacked"
                )
            if member.islnk():
                link = PurePosixPath(member.linkname)
                if link.is_absolute() or ".." in link.parts:
                    raise BuildRefused(
                        f"{where}: archive member {member.name} links outside its folder"
                    )
                member.linkname = str(PurePosixPath(target) / link).lstrip("/")
            member.name = str(PurePosixPath(target) / name).lstrip("/")
            data = tar.extractfile(member) if content and member.isreg() else None
            yield member, chunks_of(data, member.size) if data is not None else None


def is_archive(handle: IO[bytes]) -> bool:
    handle.seek(0)
    try:
        return tarfile.is_tarfile(handle)
    except (OSError, tarfile.TarError):
        return False
    finally:
        handle.seek(0)
