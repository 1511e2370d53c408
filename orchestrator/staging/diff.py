"""Showing a change set to a reviewer: a unified diff that a hostile file cannot subvert.

Every piece of worker content goes through :func:`~.content.escape`, so escape sequences,
carriage returns and bidirectional marks appear as visible ``\\x1b``-style text and cannot
recolour, move or hide anything. Colour codes are added afterwards, only when asked for.
The target's current content is read without following links: a target that is (or
lies beneath) a symbolic link is reported as such, never read through.

Every new byte is shown, or the file is flagged by a scanner: a file without a NUL byte
is shown as text, whatever its encoding (a byte that is not UTF-8 appears as ``\\xNN``);
a file with one, or over :data:`~.content.MAX_SHOWN_BYTES`, is summarised (type, size,
sha256), and the binary or size scanner flags it. When only the current file cannot be
shown, the new one is shown whole, as added lines.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.hostfs.entries import special_kind
from orchestrator.hostfs.files import read_limited
from orchestrator.hostfs.flags import DIR_FLAGS, FILE_FLAGS
from orchestrator.staging.content import MAX_SHOWN_BYTES, describe_type, escape
from orchestrator.staging.manifest import ChangeFile, ChangeSet
from orchestrator.staging.names import normal_mode, printable
from orchestrator.staging.store import ChangeStore

__all__ = ["MAX_DIFF_BYTES", "TargetState", "diff_files", "read_target", "render_diff"]

#: Files larger than this (on either side) are summarised instead of diffed.
MAX_DIFF_BYTES = MAX_SHOWN_BYTES
_LINES = re.compile(r"[^\n]*\n|[^\n]+$")
_COLOURS = {"bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


@dataclass(frozen=True)
class TargetState:
    """What is at a change's destination now."""

    kind: Literal["missing", "file", "symlink", "folder", "special", "unreadable"]
    data: bytes = b""
    size: int = 0
    mode: int | None = None
    note: str = ""

    @property
    def complete(self) -> bool:
        return len(self.data) == self.size


def read_target(root: Path | None, path: str, limit: int = MAX_DIFF_BYTES) -> TargetState:
    """Look at ``root/path`` without following links; read at most ``limit`` bytes.

    ``root`` None means the target is not known (a zone no longer in the project).
    """
    if root is None:
        return TargetState("missing", note="the target is not in the project any more")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return TargetState(
            "missing", note=f"the target folder {printable(str(root))} does not exist"
        )
    except OSError as exc:
        return TargetState("unreadable", note=f"{printable(str(root))}: {exc.strerror}")
    parts = path.split("/")
    try:
        for depth, part in enumerate(parts):
            where = printable("/".join(parts[: depth + 1]))
            try:
                st = os.lstat(part, dir_fd=fd)
            except FileNotFoundError:
                return TargetState("missing")
            last = depth == len(parts) - 1
            if stat.S_ISLNK(st.st_mode):
                link = printable(os.readlink(part, dir_fd=fd))
                return TargetState("symlink", note=f"'{where}' is a symbolic link to '{link}'")
            if last and stat.S_ISREG(st.st_mode):
                return _read_file(fd, part, st, limit)
            if last and stat.S_ISDIR(st.st_mode):
                return TargetState("folder", note=f"'{where}' is a folder")
            if not stat.S_ISDIR(st.st_mode):
                kind = special_kind(st.st_mode) or "file"
                return TargetState("special", note=f"'{where}' is a {kind}")
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return TargetState("missing")  # not reached: the last part returns above
    except OSError as exc:
        return TargetState("unreadable", note=f"{printable(path)}: {exc.strerror}")
    finally:
        os.close(fd)


def _read_file(dir_fd: int, name: str, st: os.stat_result, limit: int) -> TargetState:
    fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
            return TargetState("unreadable", note=f"{printable(name)} changed while being read")
        data = read_limited(fd, limit)
        return TargetState("file", data, now.st_size, normal_mode(now.st_mode))
    finally:
        os.close(fd)


class _Paint:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, colour: str, text: str) -> str:
        return f"\x1b[{_COLOURS[colour]}m{text}\x1b[0m" if self.color else text


def _summary(data: bytes, size: int) -> str:
    kind = describe_type(data[:4096])
    if len(data) == size:
        return f"{kind}, {size} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
    return f"{kind}, {size} bytes"


def _blob(store: ChangeStore, change: ChangeSet, item: ChangeFile) -> bytes:
    if item.sha256 is None:
        return b""
    with store.open_blob(change.id, item.sha256) as blob:
        return blob.read(MAX_DIFF_BYTES + 1)


def _text(data: bytes, size: int) -> str | None:
    """``data`` as text to show (undecodable bytes kept as lone surrogates, which
    :func:`escape` shows as ``\\xNN``), or None: binary (a NUL), or too large to show."""
    if len(data) > MAX_DIFF_BYTES or len(data) != size or b"\0" in data:
        return None
    return data.decode("utf-8", "surrogateescape")


def _notes(item: ChangeFile, target: TargetState) -> list[str]:
    notes = []
    if target.kind in ("symlink", "folder", "special", "unreadable"):
        notes.append(f"target is not a regular file: {target.note}; it will not be followed")
    if target.kind == "missing" and target.note:
        notes.append(target.note)
    if item.operation == "create" and target.kind == "file":
        notes.append("a file already exists at this path now")
    if item.operation in ("update", "delete") and target.kind == "missing":
        notes.append("the target file no longer exists")
    if (
        item.base_sha256
        and target.kind == "file"
        and target.complete
        and hashlib.sha256(target.data).hexdigest() != item.base_sha256
    ):
        notes.append("the target changed since this change set was made")
    if item.mode is not None and target.mode is not None and item.mode != target.mode:
        notes.append(f"mode changes from {target.mode:04o} to {item.mode:04o}")
    elif item.mode == 0o755 and target.kind != "file":
        notes.append("the new file is executable (mode 0755)")
    return notes


def _file_diff(
    item: ChangeFile, change: ChangeSet, store: ChangeStore, root: Path | None
) -> list[str]:
    """Lines for one file, each ``colour\\0text`` (worker content already escaped)."""
    shown = escape(item.path)
    target = read_target(root, item.path)
    old = target.data if target.kind == "file" else b""
    old_size = target.size if target.kind == "file" else 0
    new = _blob(store, change, item)
    lines = [f"bold\0diff --staged a/{shown} b/{shown}"]
    detail = f"{item.operation}, {item.size} bytes"
    if item.mode is not None:
        detail += f", mode {item.mode:04o}"
    lines.append(f"bold\0{detail}")
    lines += [f"yellow\0! {note}" for note in _notes(item, target)]
    old_text = _text(old, old_size)
    new_text = "" if item.operation == "delete" else _text(new, item.size)
    if new_text is None:
        if target.kind == "file":
            lines.append(f"red\0- was: {_summary(old, old_size)}")
        lines.append(f"green\0+ now: {_summary(new, item.size)}")
        return lines
    if old_text is None:
        lines.append(f"red\0- was: {_summary(old, old_size)}")
        if item.operation == "delete":
            return lines
        lines.append("yellow\0! the current file is not shown: every line below is the new file")
        old_text = ""
    diff = difflib.unified_diff(
        _LINES.findall(old_text), _LINES.findall(new_text), f"a/{shown}", f"b/{shown}", n=3
    )
    for number, line in enumerate(diff):
        if number < 2:
            lines.append(f"bold\0{line.removesuffix(chr(10))}")
        elif line.startswith("@@"):
            lines.append(f"cyan\0{line.removesuffix(chr(10))}")
        else:
            mark, body = line[0], line[1:]
            colour = {"+": "green", "-": "red"}.get(mark, "")
            lines.append(f"{colour}\0{mark}{escape(body.removesuffix(chr(10)), keep=chr(9))}")
            if not body.endswith("\n"):
                lines.append("\0\\ No newline at end of file")
    return lines


def render_diff(
    change: ChangeSet, store: ChangeStore, target_root: Path | None, *, color: bool
) -> str:
    """The reviewer's view of ``change`` against ``target_root``'s current content.

    ``color`` adds ANSI colours (only ever around already escaped text). ``target_root``
    None shows every file against nothing, with a note.
    """
    paint = _Paint(color)
    out: list[str] = []
    for _, lines in diff_files(change, store, target_root):
        out += [paint(colour, text) if colour else text for colour, text in lines]
    return "".join(f"{line}\n" for line in out)


def diff_files(
    change: ChangeSet, store: ChangeStore, target_root: Path | None
) -> list[tuple[ChangeFile, list[tuple[str, str]]]]:
    """Per file of ``change`` (by path), the lines :func:`render_diff` shows, each as
    ``(colour, text)``: colour is "" or a name (bold, cyan, green, red, yellow), text is
    already escaped. For views that mark lines up themselves (the review console)."""
    return [
        (item, [_split(line) for line in _file_diff(item, change, store, target_root)])
        for item in sorted(change.files, key=lambda f: f.path)
    ]


def _split(line: str) -> tuple[str, str]:
    colour, text = line.split("\0", 1)
    return colour, text
