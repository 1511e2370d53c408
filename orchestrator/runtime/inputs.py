"""A run's own inputs (``run --input``): checked like zones, placed read-only at /inputs.

An input is a host file or folder given for one run, checked when the run is prepared
(:mod:`orchestrator.prepare.inputs`, which also names it).

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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.entries import kind_phrase, open_entry, permits
from orchestrator.plan import INPUTS_DIR
from orchestrator.prepare import Prepared
from orchestrator.prepare.inputs import (
    InputPath,
    InputSpec,
    Kind,
    check_inputs,
    guarded_folders,
    shown,
)

__all__ = ["InputInfo", "place_inputs"]

_CHUNK = 1 << 20


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
