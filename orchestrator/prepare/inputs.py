"""A run's own inputs (``run --input``), checked at prepare time: no engine, nothing written.

An input is a host file or folder given for one run. :func:`check_inputs` refuses what
could not be handed over safely: a path that does not exist, a symbolic link (given as the
input, or anywhere inside a given folder), a FIFO, socket or device file, the
orchestrator's own sandbox root (or a folder holding it), and what the worker file's
``inputs:`` section does not accept (suffixes, count, size). Every problem is listed at
once, one line each. Placing them (:mod:`orchestrator.runtime.inputs`) checks them again.

Names: the container sees ``/inputs/<name>``, where ``name`` is the input's own name with
every control, format (bidi) or line-separator character replaced by ``_``, and a leading
``-`` or ``.`` prefixed with ``_`` (so a shell glob in /inputs never yields an option and
never misses a hidden file). The original path is in the audit log. Names inside a given
folder are kept as they are.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from orchestrator.config.models import human_size
from orchestrator.errors import ConfigError
from orchestrator.escaping import escape
from orchestrator.hostfs.entries import kind_phrase
from orchestrator.hostfs.expand import MAX_DEPTH
from orchestrator.plan import INPUTS_DIR

if TYPE_CHECKING:
    from orchestrator.config import Project, Worker

__all__ = [
    "LINKS_REFUSED",
    "MAX_DEPTH",
    "InputPath",
    "InputSpec",
    "Kind",
    "LinkFree",
    "check_inputs",
    "guarded_folders",
    "kind_phrase",
    "safe_name",
    "shown",
]

Kind = Literal["file", "folder"]
InputPath = str | os.PathLike[str]
_MAX_NAME = 255


@dataclass(frozen=True)
class LinkFree:
    """An input path none of whose components may be a symbolic link, not even one of the
    host's own above the project: a batch's inputs, found that way in folders other people
    can write (a downloads folder), where a link may have been planted since."""

    path: Path

    def __fspath__(self) -> str:
        return os.fspath(self.path)


@dataclass(frozen=True)
class InputSpec:
    """A checked input: where it is on the host, and its name under /inputs."""

    source: Path
    name: str
    kind: Kind
    size: int
    """Bytes (a folder: the sum of its files) when it was checked."""
    link_free: bool = False
    """Given as :class:`LinkFree`: placed without following any link on its whole path."""

    @property
    def target(self) -> str:
        return f"{INPUTS_DIR}/{self.name}"


def shown(path: InputPath) -> str:
    """A path for a one-line message, unsafe characters escaped (:mod:`orchestrator.escaping`)."""
    return escape(os.fsdecode(path))


def safe_name(name: str) -> str:
    """The name an input gets under /inputs (see the module docstring)."""
    chars = ["_" if _unsafe(c) else c for c in name] or ["_"]
    text = "".join(chars)
    if text.startswith(("-", ".")):
        text = "_" + text
    while len(os.fsencode(text)) > _MAX_NAME:
        text = text[:-1]
    return text


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") or char in (
        "/",
        "\\",
    )


def check_inputs(
    project: Project, worker: Worker, given: Sequence[InputPath | InputSpec]
) -> tuple[InputSpec, ...]:
    """Check every input path (an :class:`InputSpec` again, as it was given); raise a
    :class:`ConfigError` listing every problem."""
    accepts = worker.config.inputs
    problems: list[str] = []
    if accepts is not None and accepts.max_count is not None and len(given) > accepts.max_count:
        problems.append(
            f"{worker.file}: inputs.max_count is {accepts.max_count}, {len(given)} inputs "
            f"given; give at most {accepts.max_count}"
        )
    sandbox = project.sandbox_root  # link-free: checked at load
    guarded = guarded_folders(project)
    found: dict[str, InputSpec] = {}
    for item in given:
        if isinstance(item, InputSpec):
            item = LinkFree(item.source) if item.link_free else item.source
        try:
            spec = _check_one(item, sandbox, guarded, worker)
        except _Refused as exc:
            problems.append(str(exc))
            continue
        if spec.name in found:
            problems.append(
                f"inputs {shown(found[spec.name].source)} and {shown(spec.source)} would both "
                f"be {shown(spec.target)}; rename one"
            )
        found[spec.name] = spec
    if problems:
        raise ConfigError(problems)
    return tuple(found.values())


class _Refused(Exception):
    pass


#: Why a :class:`LinkFree` input reached through a link is refused.
LINKS_REFUSED = (
    "links are never followed on a batch's input paths (one could point anywhere on the "
    "host): give the real path, or remove the link"
)


def guarded_folders(project: Project) -> list[Path]:
    """Folders a worker can write: a link in them is never followed on an input's path."""
    return [project.root, project.sandbox_root, *(z.host_path for z in project.zones.values())]


def _check_one(item: InputPath, sandbox: Path, guarded: list[Path], worker: Worker) -> InputSpec:
    # The folders above an input are resolved, except a link in a folder a worker can
    # write (the project, a zone, the sandbox root): refused. The input itself never is.
    # A LinkFree input's folders are never resolved: any link on its path is refused.
    from orchestrator.hostfs.hostpath import HostPathError, real_parent  # only with inputs
    from orchestrator.hostfs.paths import PathRefused, check_path

    raw, link_free = Path(item), isinstance(item, LinkFree)
    label = f"input {shown(raw)}"
    try:
        if link_free:
            path = Path(os.path.abspath(raw))
            check_path(path.parent)
        else:
            path = real_parent(raw, guarded)
    except PathRefused as exc:
        raise _Refused(f"{label}: {shown(str(exc))}; {LINKS_REFUSED}") from None
    except HostPathError as exc:
        raise _Refused(f"{label}: {shown(str(exc))}") from None
    except OSError as exc:
        raise _Refused(f"{label}: {exc.strerror}") from None
    try:
        info = path.lstat()
    except OSError:
        raise _Refused(f"{label}: does not exist; give an existing file or folder") from None
    if stat.S_ISLNK(info.st_mode):
        raise _Refused(
            f"{label}: is a symbolic link; give the file or folder itself (links are never "
            "followed)"
        )
    if path == sandbox or path.is_relative_to(sandbox):
        raise _Refused(f"{label}: is inside the orchestrator's sandbox root {sandbox}; refusing")
    if stat.S_ISDIR(info.st_mode) and sandbox.is_relative_to(path):
        raise _Refused(
            f"{label}: holds the orchestrator's sandbox root {sandbox}; give a folder inside it"
        )
    accepts = worker.config.inputs
    suffixes = tuple(s.lower() for s in accepts.suffixes) if accepts and accepts.suffixes else None
    name = safe_name(path.name)
    if stat.S_ISREG(info.st_mode):
        kind: Kind = "file"
        size = info.st_size
        if suffixes and not name.lower().endswith(suffixes):
            raise _Refused(
                f"{label}: {worker.file} accepts only {', '.join(suffixes)} files (inputs.suffixes)"
            )
    elif stat.S_ISDIR(info.st_mode):
        kind = "folder"
        size = _check_folder(path, label, suffixes, worker)
    else:
        raise _Refused(
            f"{label}: is {kind_phrase(info.st_mode)}; only regular files and folders can be inputs"
        )
    if accepts is not None and accepts.max_size is not None and size > accepts.max_size:
        raise _Refused(
            f"{label}: {human_size(size)} is over {worker.file}'s inputs.max_size of "
            f"{human_size(accepts.max_size)}"
        )
    return InputSpec(source=path, name=name, kind=kind, size=size, link_free=link_free)


def _check_folder(path: Path, label: str, suffixes: tuple[str, ...] | None, worker: Worker) -> int:
    total = 0
    pending = [(path, 0)]  # a loop, not a recursion: a hostile tree can be deep
    while pending:
        folder, depth = pending.pop()
        try:
            entries = sorted(entry.name for entry in os.scandir(folder))
        except OSError as error:
            raise _Refused(f"input {shown(folder)}: {error.strerror}") from None
        for entry in entries:
            inner = folder / entry
            info = inner.lstat()
            where = shown(inner.relative_to(path))
            if stat.S_ISDIR(info.st_mode):
                if depth >= MAX_DEPTH:
                    raise _Refused(
                        f"{label}: holds folders more than {MAX_DEPTH} levels deep; give a "
                        "folder closer to the files"
                    )
                pending.append((inner, depth + 1))
                continue
            if stat.S_ISLNK(info.st_mode):
                raise _Refused(
                    f"{label}: holds a symbolic link at {where}; links inside inputs are "
                    "refused (give the file itself)"
                )
            if not stat.S_ISREG(info.st_mode):
                raise _Refused(
                    f"{label}: holds {kind_phrase(info.st_mode)} at {where}; only regular "
                    "files and folders can be inputs"
                )
            if suffixes and not entry.lower().endswith(suffixes):
                raise _Refused(
                    f"{label}: {where}: {worker.file} accepts only {', '.join(suffixes)} files "
                    "(inputs.suffixes)"
                )
            total += info.st_size
    return total
