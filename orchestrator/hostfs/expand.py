"""Host paths and glob patterns expanded to regular files, never through a link, at any depth.

What a person names as inputs often lies in folders other people fill: a downloads folder,
an unpacked archive. A link planted there (``zz-evil -> ~victim/.ssh``) must not turn
``'/tmp/dl/*/*'`` into a way to read another user's files, and Python's :mod:`glob`
follows links in the middle of a path (only the last name is looked at with ``lstat``).
So patterns are expanded here: every folder on the way, from ``/``, is opened with
``O_NOFOLLOW`` (:func:`~.paths.open_path`) before its names are listed, and a link met on
any path that could be an input is refused with :class:`~.paths.PathRefused` naming it:
a component named, a name a pattern matched, a folder ``**`` would cross, anything inside
a folder that is an input. FIFOs, sockets and devices are refused the same way.

Paths are absolute and normalised (no ``.`` or ``..``: ``os.path.abspath``, which is safe
here because no link on them is ever followed). Patterns are :mod:`glob`'s: ``*``, ``?``
and ``[...]`` within one name, ``**`` for any number of folders; names starting with ``.``
only match a pattern that starts with ``.``. The walk is a loop over paths with one
descriptor open at a time, never a recursion, and stops with a refusal below
:data:`MAX_DEPTH` folders (a hostile tree can be thousands deep). Nothing is read: the
caller opens what it was given the same way (:mod:`orchestrator.runtime.inputs`), and a
link swapped in meanwhile is refused there.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

from orchestrator.hostfs.entries import kind_phrase
from orchestrator.hostfs.paths import PathRefused, open_path

__all__ = ["MAX_DEPTH", "TooDeep", "exists", "expand", "files_in", "is_pattern"]

#: How many levels of folders below an input (or a pattern's first folder) are walked.
MAX_DEPTH = 100

_MAGIC = frozenset("*?[")


class TooDeep(PathRefused):
    """A folder below the walk's top lies more than the depth allowed."""


def is_pattern(text: str) -> bool:
    """Whether ``text`` has glob characters (``*``, ``?``, ``[``)."""
    return not _MAGIC.isdisjoint(text)


def exists(path: Path) -> bool:
    """Whether ``path`` names an entry (a link counts); every folder above it must be a
    real folder (:class:`PathRefused` otherwise)."""
    if path == path.parent:
        return True
    try:
        folder = open_path(path.parent)
    except PathRefused as refused:
        if refused.missing:
            return False
        raise
    try:
        return _lstat(folder, path.name) is not None
    finally:
        os.close(folder)


def expand(pattern: Path, *, max_depth: int = MAX_DEPTH) -> list[Path]:
    """The regular files ``pattern`` names, in name order (a folder stands for every file
    under it); an empty list when it matches nothing."""
    parts = pattern.parts[1:]
    first = next((n for n, part in enumerate(parts) if is_pattern(part) or part == "**"), None)
    if first is None:
        return files_in(pattern, max_depth=max_depth) if exists(pattern) else []
    base = Path("/", *parts[:first])
    try:
        os.close(open_path(base))
    except PathRefused as refused:
        if refused.missing:
            return []
        raise
    found: list[Path] = []
    for match in sorted(_matches(base, parts[first:], max_depth), key=lambda p: p.parts):
        found += files_in(match, max_depth=max_depth)
    return found


def files_in(path: Path, *, max_depth: int = MAX_DEPTH) -> list[Path]:
    """``path`` itself when it is a regular file, or every regular file under the folder
    ``path``, in name order (each folder's names sorted, folders walked in place)."""
    if _kind(path) == "file":
        return [path]
    found: list[Path] = []
    pending = [(path, 0)]
    while pending:
        folder, depth = pending.pop()
        for name, info in _listing(folder):
            inner = folder / name
            if stat.S_ISREG(info.st_mode):
                found.append(inner)
            elif stat.S_ISDIR(info.st_mode):
                _check_depth(inner, path, depth + 1, max_depth)
                pending.append((inner, depth + 1))
            else:
                _refuse(inner, info.st_mode, folder)
    found.sort(key=lambda p: p.parts)
    return found


def _kind(path: Path) -> str:
    """``"file"`` or ``"folder"`` for ``path``; anything else is refused."""
    if path == path.parent:
        return "folder"
    info = _lstat_in(path.parent, path.name)
    if info is None:
        raise PathRefused(path, path, f"{path} does not exist", missing=True)
    if stat.S_ISREG(info.st_mode):
        return "file"
    if stat.S_ISDIR(info.st_mode):
        return "folder"
    _refuse(path, info.st_mode, path.parent)
    raise AssertionError  # pragma: no cover - _refuse raises


def _matches(base: Path, parts: tuple[str, ...], max_depth: int) -> set[Path]:
    """The paths under the folder ``base`` that ``parts`` (glob components) match."""
    found: set[Path] = set()
    pending = [(base, 0, 0)]  # (folder, index of the next component, depth below base)
    seen: set[tuple[Path, int]] = set()
    while pending:
        folder, index, depth = pending.pop()
        if (folder, index) in seen:
            continue  # '**/**' reaches a folder twice
        seen.add((folder, index))
        if index == len(parts):
            found.add(folder)
            continue
        part, last = parts[index], index == len(parts) - 1
        if part == "**":
            pending.append((folder, index + 1, depth))  # no folder at all
            for name, info in _listing(folder, hidden=False):
                inner = folder / name
                if stat.S_ISLNK(info.st_mode):
                    _refuse(inner, info.st_mode, folder)
                if stat.S_ISDIR(info.st_mode):
                    _check_depth(inner, base, depth + 1, max_depth)
                    pending.append((inner, index, depth + 1))
            continue
        if is_pattern(part):
            hidden = part.startswith(".")
            named = [(n, i) for n, i in _listing(folder, hidden) if fnmatch.fnmatchcase(n, part)]
        else:
            found_info = _lstat_in(folder, part)
            named = [] if found_info is None else [(part, found_info)]
        for name, info in named:
            inner = folder / name
            if stat.S_ISLNK(info.st_mode):
                _refuse(inner, info.st_mode, folder)
            if last:
                found.add(inner)
            elif stat.S_ISDIR(info.st_mode):
                _check_depth(inner, base, depth + 1, max_depth)
                pending.append((inner, index + 1, depth + 1))
    return found


def _listing(folder: Path, hidden: bool = True) -> list[tuple[str, os.stat_result]]:
    """Every name in ``folder`` (opened without following a link) with its ``lstat``;
    without ``hidden``, no name starting with ``.``."""
    fd = open_path(folder)
    try:
        names = [n for n in os.listdir(fd) if hidden or not n.startswith(".")]
        listed = [(n, _lstat(fd, n)) for n in names]
    finally:
        os.close(fd)
    return sorted((n, i) for n, i in listed if i is not None)


def _lstat_in(folder: Path, name: str) -> os.stat_result | None:
    fd = open_path(folder)
    try:
        return _lstat(fd, name)
    finally:
        os.close(fd)


def _lstat(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return None


def _check_depth(folder: Path, top: Path, depth: int, max_depth: int) -> None:
    if depth > max_depth:
        raise TooDeep(
            folder,
            top,
            f"{top} holds folders more than {max_depth} levels deep; name a folder closer "
            "to the files",
        )


def _refuse(path: Path, mode: int, folder: Path | None) -> None:
    if stat.S_ISLNK(mode):
        fd = open_path(folder) if folder is not None else None
        try:
            target = os.readlink(path.name, dir_fd=fd) if fd is not None else "?"
        except OSError:
            target = "?"
        finally:
            if fd is not None:
                os.close(fd)
        raise PathRefused(path, path, f"{path} is a symbolic link (to {target})", link=target)
    raise PathRefused(path, path, f"{path} is {kind_phrase(mode)}")
