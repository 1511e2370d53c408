"""A batch's inputs: ``PATH|GLOB`` arguments expanded on the host, each keyed.

A file is one input. A folder means every regular file under it (recursively, in name
order). An argument that names no existing path is a glob pattern (``*``, ``?``, ``[...]``;
``**`` crosses folders); a pattern that matches nothing is an error, so a typo never makes
an empty batch. Every component of every path is walked without following a link, patterns
included (:mod:`orchestrator.hostfs.expand`, never Python's :mod:`glob`): a link anywhere on
the way, or inside a folder given or matched, refuses the batch, naming it (it could point
anywhere on the host: ``zz-evil -> ~victim/.ssh`` in a downloads folder). So are sockets,
devices and FIFOs, folders more than :data:`~orchestrator.hostfs.expand.MAX_DEPTH` levels
deep, and anything inside the project's sandbox folder. The same file named twice is one
input.

Nothing is read here: each input is hashed once, from the bytes placed in its run's
``/inputs`` (:mod:`orchestrator.runtime.inputs`), reached again the same way.

Each input gets a *key*: a short name that is safe as a folder name in a change set and in
a terminal (``0007-report.txt``): its position, then its base name with anything but
letters, digits, ``.``, ``_`` and ``-`` replaced by ``_`` and no leading ``.`` or ``-``.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.hostfs.expand import TooDeep, exists, files_in, is_pattern
from orchestrator.hostfs.expand import expand as expand_path
from orchestrator.hostfs.flags import FILE_FLAGS
from orchestrator.hostfs.paths import PathRefused, open_path
from orchestrator.prepare.inputs import LINKS_REFUSED, shown

__all__ = ["BatchInput", "expand", "file_sha256", "key_for"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_KEY_NAME_MAX = 60
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BatchInput:
    """One input of a batch: the file (an absolute path without links) and its key in the
    change set. Its content is hashed when it is placed for its run."""

    path: Path
    key: str

    def to_dict(self) -> dict[str, str]:
        return {"path": os.fsdecode(self.path), "key": self.key}


def file_sha256(path: Path) -> str:
    """The sha256 of the regular file ``path``, reached without following any link (to
    tell whether a finished input changed since: ``--resume``)."""
    folder = open_path(path.parent)
    try:
        fd = os.open(path.name, FILE_FLAGS, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
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
    """Every input the arguments name, in order, keyed; one clear error if any argument
    names nothing usable or reaches through a link."""
    if not arguments:
        raise ConfigError(["no inputs: give --inputs PATH|GLOB (a file, a folder or a pattern)"])
    sandbox = sandbox_root.resolve()
    seen: set[Path] = set()
    paths: list[Path] = []
    for argument in arguments:
        for path in _one(argument):
            if path == sandbox or sandbox in path.parents:
                raise ConfigError(
                    [
                        f"{shown(path)}: inside the sandbox folder {sandbox}; inputs come from "
                        "outside it"
                    ]
                )
            if path not in seen:
                seen.add(path)
                paths.append(path)
    return [BatchInput(p, key_for(i, p)) for i, p in enumerate(paths, 1)]


def _one(argument: str | os.PathLike[str]) -> list[Path]:
    text = os.fspath(argument)
    label = f"--inputs {shown(text)}"
    # Normalised as text: no link on the path is ever followed, so '..' is its parent.
    path = Path(os.path.abspath(text))
    try:
        if exists(path):
            return files_in(path)
        if not is_pattern(text):
            raise ConfigError([f"{label}: no such file or folder"])
        found = expand_path(path)
    except PathRefused as refused:
        raise ConfigError([f"{label}: {_reason(refused)}"]) from None
    except OSError as exc:
        raise ConfigError([f"{label}: {exc.strerror or exc}"]) from None
    if not found:
        raise ConfigError([f"{label}: the pattern matches nothing"])
    return found


def _reason(refused: PathRefused) -> str:
    reason = shown(refused.reason)
    if refused.link is not None:
        return f"{reason}; {LINKS_REFUSED}"
    if refused.missing or isinstance(refused, TooDeep):
        return reason
    return f"{reason}; inputs are regular files or folders"
