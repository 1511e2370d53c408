"""A run's own inputs (``run --input``): checked like zones, placed read-only at /inputs.

An input is a host file or folder given for one run, checked when the run is prepared
(:mod:`orchestrator.prepare.inputs`, which also names it).

:func:`place_inputs` fills the run's inputs folder (``<sandbox>/runs/<run id>/inputs``,
which the plan mounts read-only at ``/inputs``) when the run opens, or later for a run
opened ahead of need (a pooled container's mounts are fixed when it is created, not its
folder's content). Each input is reached again as it was checked (a batch's:
:class:`~orchestrator.prepare.inputs.LinkFree`, no link anywhere on its path), opened
without following a link or waiting on a FIFO, and checked on the open descriptor, so a
path swapped after the check is refused, never followed. A file is hard-linked (the same
inode, no copy) only when nobody but this user or root can change its bytes afterwards: on
the same file system, readable by the worker's uid, no setuid or setgid bit, writable by
its owner alone, who is this user or root; otherwise it is copied (a copy never has set-id
bits), keeping its holes (``SEEK_DATA``/``SEEK_HOLE``: a sparse file stays sparse). Its
sha256 is computed once, from the bytes placed: a linked file written to while it was
hashed is copied instead. That hash is what the run records (``run.inputs`` in the audit
log, the run's result, a batch's ``results.jsonl`` and manifest).

Names: the container sees ``/inputs/<name>``, where ``name`` is the input's own name with
every control, format (bidi) or line-separator character replaced by ``_``, and a leading
``-`` or ``.`` prefixed with ``_`` (so a shell glob in /inputs never yields an option and
never misses a hidden file). The original path is in the audit log. Names inside a given
folder are kept as they are.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.entries import kind_phrase, open_entry, permits
from orchestrator.hostfs.paths import PathRefused, open_path
from orchestrator.plan import INPUTS_DIR
from orchestrator.prepare import Prepared
from orchestrator.prepare.inputs import (
    LINKS_REFUSED,
    MAX_DEPTH,
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
    checked = check_inputs(prepared.project, prepared.worker, inputs)
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
        without following a link a worker could have planted since (a :class:`LinkFree`
        input's: any link), then the input opened in that folder's descriptor (never its
        whole path again)."""
        from orchestrator.hostfs.hostpath import HostPathError, open_parent

        label = f"input {shown(spec.source)}"
        try:
            if spec.link_free:
                parent, name = open_path(spec.source.parent), spec.source.name
            else:
                parent, name = open_parent(spec.source, self.guarded, follow_last=False)
        except PathRefused as exc:
            raise _Changed(f"{label}: {shown(str(exc))}; {LINKS_REFUSED}") from None
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
            self._folder(fd, target, "", files, label, 0)
        finally:
            os.close(fd)
        listing = hashlib.sha256()
        for rel, digest, _size in sorted(files):
            listing.update(os.fsencode(rel) + b"\0" + digest.encode() + b"\n")
        return listing.hexdigest(), sum(size for _, _, size in files)

    def _folder(
        self,
        fd: int,
        target: Path,
        prefix: str,
        files: list[tuple[str, str, int]],
        label: str,
        depth: int,
    ) -> None:
        for entry in os.scandir(fd):
            info = entry.stat(follow_symlinks=False)
            rel = f"{prefix}{entry.name}"
            if stat.S_ISREG(info.st_mode):
                digest, size = self._file(fd, entry.name, target / entry.name, info, label)
                files.append((rel, digest, size))
            elif stat.S_ISDIR(info.st_mode):
                if depth >= MAX_DEPTH:  # deepened since it was checked
                    raise _Changed(f"{label}: holds folders more than {MAX_DEPTH} levels deep")
                opened = open_entry(fd, entry.name, info)
                if opened is None:
                    raise _Changed(f"{label}: {shown(rel)} changed while being placed; refusing")
                inner, _ = opened
                try:
                    self._mkdir(target / entry.name)
                    self._folder(inner, target / entry.name, f"{rel}/", files, label, depth + 1)
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
        """Place one file; its hash and size, from the bytes placed."""
        opened = open_entry(folder, name, info) if stat.S_ISREG(info.st_mode) else None
        if opened is None:
            raise _Changed(f"{label}: {shown(name)} changed while being placed; refusing")
        fd, st = opened
        try:
            if self._linkable(st) and _link_descriptor(fd, target):
                linked = os.fstat(fd)  # the link itself changed its ctime
                digest, size = _sparse_copy(fd, None)
                if _unchanged(linked, os.fstat(fd)):
                    return digest, size
                target.unlink()  # written to while it was hashed: a copy is what it was
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                digest, size = _sparse_copy(fd, out)
                os.fchmod(out, (st.st_mode & 0o555) | 0o400)  # no set-id bit
                if self.as_root:
                    os.fchown(out, self.uid, self.gid)
            finally:
                os.close(out)
            return digest, size
        finally:
            os.close(fd)

    def _linkable(self, st: os.stat_result) -> bool:
        """Whether the file may be placed as a hard link (the same inode, no copy): on the
        run folder's file system, readable by the worker, no set-id bit (a link keeps its
        owner and bits), and writable by nobody but its owner, who is this user or root
        (anyone else could change the bytes under the worker after they were hashed)."""
        return (
            not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH)
            and st.st_uid in (0, os.geteuid())
            and st.st_dev == self.device
            and permits(st, self.uid, self.gid, "r")
        )

    def _mkdir(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        if self.as_root:
            os.chown(path, self.uid, self.gid)


def _unchanged(before: os.stat_result, after: os.stat_result) -> bool:
    return (before.st_size, before.st_mtime_ns, before.st_ctime_ns) == (
        after.st_size,
        after.st_mtime_ns,
        after.st_ctime_ns,
    )


_ZEROS = bytes(_CHUNK)


def _sparse_copy(src: int, out: int | None) -> tuple[str, int]:
    """Copy ``src`` into ``out`` (None: only hash it) keeping its holes (``SEEK_DATA`` /
    ``SEEK_HOLE``: a 3 GB sparse file stays a few blocks on disk); the sha256 and size of
    the bytes copied, holes counted as the zeros they read as. Ends at the size the file
    had when the copy began, or earlier if it shrank meanwhile."""
    digest = hashlib.sha256()
    end = os.fstat(src).st_size
    offset = 0
    while offset < end:
        data = min(_seek(src, offset, os.SEEK_DATA, end), end)
        while offset < data:  # a hole: nothing to read or write
            step = min(_CHUNK, data - offset)
            digest.update(_ZEROS[:step])
            offset += step
        hole = min(_seek(src, offset, os.SEEK_HOLE, end), end)
        while offset < hole:
            chunk = os.pread(src, min(_CHUNK, hole - offset), offset)
            if not chunk:  # shrank while it was copied
                end = offset
                break
            digest.update(chunk)
            if out is not None:
                view = memoryview(chunk)
                while view:
                    view = view[os.pwrite(out, view, offset + len(chunk) - len(view)) :]
            offset += len(chunk)
    if out is not None:
        os.ftruncate(out, offset)  # a trailing hole, as long as the file
    return digest.hexdigest(), offset


def _seek(fd: int, offset: int, whence: int, end: int) -> int:
    """``lseek`` to the next data or hole; ``end`` when there is none (``ENXIO``)."""
    try:
        return os.lseek(fd, offset, whence)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return end
        raise
