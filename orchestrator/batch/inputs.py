"""A batch's inputs: ``PATH|GLOB`` arguments expanded on the host, each hashed and keyed.

A file is one input. A folder means every regular file under it (recursively, in name
order). An argument that names no existing path is a glob pattern (``*``, ``?``, ``[...]``;
``**`` crosses folders); a pattern that matches nothing is an error, so a typo never makes
an empty batch. Links, sockets, devices and FIFOs are refused wherever they appear (a link
could point anywhere on the host), and so is anything inside the project's sandbox folder.
The same file named twice is one input.

Each input gets a *key*: a short name that is safe as a folder name in a change set and in
a terminal (``0007-report.txt``): its position, then its base name with anything but
letters, digits, ``.``, ``_`` and ``-`` replaced by ``_`` and no leading ``.`` or ``-``.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.hostfs.entries import kind_phrase
from orchestrator.prepare.inputs import shown

__all__ = ["BatchInput", "expand", "file_sha256", "key_for"]

_GLOB = re.compile(r"[*?\[]")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_KEY_NAME_MAX = 60
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BatchInput:
    """One input of a batch: the file, its content hash, and its key in the change set."""

    path: Path
    sha256: str
    key: str

    def to_dict(self) -> dict[str, str]:
        return {"path": os.fsdecode(self.path), "sha256": self.sha256, "key": self.key}


def file_sha256(path: Path) -> str:
    """The sha256 of a regular file, read without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError([f"{shown(path)}: not a regular file; inputs are files"])
        digest = hashlib.sha256()
        while data := os.read(fd, _CHUNK):
            digest.update(data)
        return digest.hexdigest()
    finally:
        os.close(fd)


def key_for(index: int, path: Path) -> str:
    """``NNNN-<safe base name>``: unique by position, printable, never ``..`` or ``-x``."""
    name = _UNSAFE.sub("_", path.name).lstrip(".-_")[:_KEY_NAME_MAX] or "input"
    return f"{index:04d}-{name}"


def expand(arguments: Sequence[str | os.PathLike[str]], *, sandbox_root: Path) -> list[BatchInput]:
    """Every input the arguments name, in order, hashed and keyed; one clear error if any
    argument names nothing usable."""
    if not arguments:
        raise ConfigError(["no inputs: give --inputs PATH|GLOB (a file, a folder or a pattern)"])
    sandbox = sandbox_root.resolve()
    seen: set[Path] = set()
    paths: list[Path] = []
    for argument in arguments:
        for path in _one(argument):
            absolute = Path(os.path.abspath(path))
            resolved = absolute.parent.resolve() / absolute.name
            if resolved == sandbox or sandbox in resolved.parents:
                raise ConfigError(
                    [
                        f"{shown(path)}: inside the sandbox folder {sandbox}; inputs come from "
                        "outside it"
                    ]
                )
            if resolved not in seen:
                seen.add(resolved)
                paths.append(absolute)
    return [BatchInput(p, file_sha256(p), key_for(i, p)) for i, p in enumerate(paths, 1)]


def _one(argument: str | os.PathLike[str]) -> Iterable[Path]:
    text = os.fspath(argument)
    path = Path(text)
    if os.path.lexists(path):
        return _walk(path)
    if not _GLOB.search(text):
        raise ConfigError([f"--inputs {shown(path)}: no such file or folder"])
    matches = sorted(glob.glob(text, recursive=True))
    if not matches:
        raise ConfigError([f"--inputs {shown(path)}: the pattern matches nothing"])
    return [f for match in matches for f in _walk(Path(match))]


def _walk(path: Path) -> list[Path]:
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode):
        return [path]
    if not stat.S_ISDIR(mode):
        raise ConfigError([f"{shown(path)}: {_kind(mode)}; inputs are regular files or folders"])
    found: list[Path] = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        found.extend(_walk(Path(entry.path)))
    return found


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link (it could point anywhere on the host)"
    return kind_phrase(mode)
