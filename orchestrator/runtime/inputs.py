"""A run's own inputs (``run --input``): checked like zones, placed read-only at /inputs.

An input is a host file or folder given for one run. :func:`check_inputs` (at prepare
time, no engine) refuses what could not be handed over safely: a path that does not exist,
a symbolic link (given as the input, or anywhere inside a given folder), a FIFO, socket or
device file, the orchestrator's own sandbox root (or a folder holding it), and what the
worker file's ``inputs:`` section does not accept (suffixes, count, size). Every problem is
listed at once, one line each.

:func:`place_inputs` fills the run's inputs folder (``<sandbox>/runs/<run id>/inputs``,
which the plan mounts read-only at ``/inputs``) when the run opens, or later for a run
opened ahead of need (a pooled container's mounts are fixed when it is created, not its
folder's content). Each file is hard-linked when it is on the same file system, the
worker's uid can read it and it has no setuid or setgid bit, otherwise copied (a copy
never has those bits); either way it is opened without following a
link or waiting on a FIFO and checked on the open descriptor, so a path swapped after the
check is refused, never followed. Its sha256 is computed from that descriptor.

Names: the container sees ``/inputs/<name>``, where ``name`` is the input's own name with
every control, format (bidi) or line-separator character replaced by ``_``, and a leading
``-`` or ``.`` prefixed with ``_`` (so a shell glob in /inputs never yields an option and
never misses a hidden file). The original path is in the audit log. Names inside a given
folder are kept as they are.
"""

from __future__ import annotations

import hashlib
import os
import stat
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.config.models import human_size
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.escaping import escape
from orchestrator.hostfs.entries import kind_phrase, open_entry, permits
from orchestrator.plan import INPUTS_DIR

if TYPE_CHECKING:
    from orchestrator.config import Project, Worker
    from orchestrator.runtime.preparation import Prepared

__all__ = ["InputInfo", "InputSpec", "check_inputs", "place_inputs", "safe_name", "shown"]

Kind = Literal["file", "folder"]
InputPath = str | os.PathLike[str]
_CHUNK = 1 << 20
_MAX_NAME = 255


@dataclass(frozen=True)
class InputSpec:
    """A checked input: where it is on the host, and its name under /inputs."""

    source: Path
    name: str
    kind: Kind
    size: int
    """Bytes (a folder: the sum of its files) when it was checked."""

    @property
    def target(self) -> str:
        return f"{INPUTS_DIR}/{self.name}"


@dataclass(frozen=True)
class InputInfo:
    """An input as placed: what the worker sees and what it was, for the audit log.

    A folder's ``sha256`` is over its sorted file list, one ``path NUL sha256 LF`` line per
    file (paths relative to the folder)."""

    name: str
    sha256: str
    size: int
    kind: Kind
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    project: Project, worker: Worker, given: Sequence[InputPath]
) -> tuple[InputSpec, ...]:
    """Check every input path; raise a :class:`ConfigError` listing every problem."""
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
    for raw in given:
        try:
            spec = _check_one(Path(raw), sandbox, guarded, worker)
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


def guarded_folders(project: Project) -> list[Path]:
    """Folders a worker can write: a link in them is never followed on an input's path."""
    return [project.root, project.sandbox_root, *(z.host_path for z in project.zones.values())]


def _check_one(raw: Path, sandbox: Path, guarded: list[Path], worker: Worker) -> InputSpec:
    # The folders above an input are resolved, except a link in a folder a worker can
    # write (the project, a zone, the sandbox root): refused. The input itself never is.
    from orchestrator.hostfs.hostpath import HostPathError, real_parent  # only with inputs

    label = f"input {shown(raw)}"
    try:
        path = real_parent(raw, guarded)
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
    return InputSpec(source=path, name=name, kind=kind, size=size)


def _check_folder(path: Path, label: str, suffixes: tuple[str, ...] | None, worker: Worker) -> int:
    total = 0
    for folder, dirs, files in os.walk(path, onerror=_raise):
        for entry in (*dirs, *files):
            inner = Path(folder) / entry
            info = inner.lstat()
            where = shown(inner.relative_to(path))
            if stat.S_ISDIR(info.st_mode):
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


def _raise(error: OSError) -> None:
    raise _Refused(f"input {shown(error.filename or '')}: {error.strerror}") from None


# -- placing -----------------------------------------------------------------------------


def place_inputs(prepared: Prepared, inputs: Sequence[InputSpec | InputPath]) -> list[InputInfo]:
    """Check ``inputs`` again and place them in the run's inputs folder (``/inputs``).

    The run must have been opened (its folder exists) and not have started its worker's
    command yet; its plan must have an inputs folder (inputs given to ``prepare``, an
    ``inputs:`` section in the worker file, or ``input_slot=True``).
    """
    if prepared.spec.inputs is None:
        raise OrchestratorError(
            f"run {prepared.spec.run_id} has no {INPUTS_DIR} folder: its plan was compiled "
            "without inputs; prepare it with inputs (or input_slot=True)"
        )
    folder = prepared.paths.inputs_dir
    try:
        info = folder.lstat()
    except OSError:
        raise OrchestratorError(
            f"{folder} does not exist: open the run before placing its inputs"
        ) from None
    if not stat.S_ISDIR(info.st_mode) or Path(os.path.realpath(folder)) != folder:
        raise OrchestratorError(f"{folder} is not the run's own folder; refusing to fill it")
    sources = [item.source if isinstance(item, InputSpec) else item for item in inputs]
    checked = check_inputs(prepared.project, prepared.worker, sources)
    placer = _Placer(prepared.uid, prepared.gid, info.st_dev, guarded_folders(prepared.project))
    return [placer.place(spec, folder / spec.name) for spec in checked]


def _link_descriptor(fd: int, target: Path) -> bool:
    """Hard-link the very inode ``fd`` holds (never a path looked up again) at ``target``:
    ``linkat`` of ``/proc/self/fd/N`` following that one link. False when it cannot be
    linked (another file system, ``protected_hardlinks``, no /proc): copy instead."""
    try:
        proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        # A source folder descriptor makes this linkat(2) with AT_SYMLINK_FOLLOW; a plain
        # link(2) would link the /proc entry itself.
        os.link(str(fd), target, src_dir_fd=proc, follow_symlinks=True)
    except OSError:
        return False
    finally:
        os.close(proc)
    return True


class _Changed(OrchestratorError):
    pass


class _Placer:
    def __init__(self, uid: int, gid: int, device: int, guarded: list[Path]) -> None:
        self.uid, self.gid, self.device = uid, gid, device
        self.guarded = guarded
        self.as_root = os.getuid() == 0

    def place(self, spec: InputSpec, target: Path) -> InputInfo:
        """Copy (or link) the input, reached again the way it was checked: its folder walked
        without following a link a worker could have planted since, then the input opened
        in that folder's descriptor (never its whole path again)."""
        from orchestrator.hostfs.hostpath import HostPathError, open_parent

        label = f"input {shown(spec.source)}"
        try:
            parent, name = open_parent(spec.source, self.guarded, follow_last=False)
        except HostPathError as exc:
            raise _Changed(f"{label}: {shown(str(exc))}") from None
        try:
            info = os.lstat(name, dir_fd=parent)
            if spec.kind == "file":
                digest, size = self._file(parent, name, target, info, label)
            else:
                digest, size = self._top_folder(parent, name, target, info, label)
        except FileNotFoundError:
            raise OrchestratorError(f"{label}: disappeared while being placed") from None
        finally:
            os.close(parent)
        return InputInfo(spec.name, digest, size, spec.kind, str(spec.source))

    def _top_folder(
        self, parent: int, name: str, target: Path, info: os.stat_result, label: str
    ) -> tuple[str, int]:
        opened = open_entry(parent, name, info) if stat.S_ISDIR(info.st_mode) else None
        if opened is None:
            raise _Changed(f"{label}: changed while being placed; refusing")
        fd, _ = opened
        files: list[tuple[str, str, int]] = []
        try:
            self._mkdir(target)
            self._folder(fd, target, "", files, label)
        finally:
            os.close(fd)
        listing = hashlib.sha256()
        for rel, digest, _size in sorted(files):
            listing.update(os.fsencode(rel) + b"\0" + digest.encode() + b"\n")
        return listing.hexdigest(), sum(size for _, _, size in files)

    def _folder(
        self, fd: int, target: Path, prefix: str, files: list[tuple[str, str, int]], label: str
    ) -> None:
        for entry in os.scandir(fd):
            info = entry.stat(follow_symlinks=False)
            rel = f"{prefix}{entry.name}"
            if stat.S_ISREG(info.st_mode):
                digest, size = self._file(fd, entry.name, target / entry.name, info, label)
                files.append((rel, digest, size))
            elif stat.S_ISDIR(info.st_mode):
                opened = open_entry(fd, entry.name, info)
                if opened is None:
                    raise _Changed(f"{label}: {shown(rel)} changed while being placed; refusing")
                inner, _ = opened
                try:
                    self._mkdir(target / entry.name)
                    self._folder(inner, target / entry.name, f"{rel}/", files, label)
                finally:
                    os.close(inner)
            else:
                what = kind_phrase(info.st_mode)
                raise _Changed(f"{label}: {shown(rel)} is {what} now; refusing")

    def _file(
        self,
        folder: int | None,
        name: str | Path,
        target: Path,
        info: os.stat_result,
        label: str,
    ) -> tuple[str, int]:
        opened = open_entry(folder, name, info) if stat.S_ISREG(info.st_mode) else None
        if opened is None:
            raise _Changed(f"{label}: {shown(name)} changed while being placed; refusing")
        fd, st = opened
        try:
            linked = False
            # A set-id file is copied: a link would keep its owner and bits in /inputs.
            plain = not st.st_mode & (stat.S_ISUID | stat.S_ISGID)
            if plain and st.st_dev == self.device and permits(st, self.uid, self.gid, "r"):
                linked = _link_descriptor(fd, target)
            digest, size = hashlib.sha256(), 0
            with os.fdopen(os.dup(fd), "rb") as src:
                if linked:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                else:
                    with open(target, "xb") as out:
                        while chunk := src.read(_CHUNK):
                            digest.update(chunk)
                            size += len(chunk)
                            out.write(chunk)
                    os.chmod(target, (st.st_mode & 0o555) | 0o400)  # no set-id bit
                    if self.as_root:
                        os.chown(target, self.uid, self.gid)
            return digest.hexdigest(), size
        finally:
            os.close(fd)

    def _mkdir(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        if self.as_root:
            os.chown(path, self.uid, self.gid)
