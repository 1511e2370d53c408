"""The host folders a run mounts, held open from the check until the container is gone.

A bind mount names its source by path, and the engine resolves that path itself, later,
following every link on it. A worker of another run that can write a folder on the path
(an rw zone holding a nested zone, ``/repo`` for a ``full`` worker) could swap that folder
for a link in between, and the engine would mount wherever the link points. So each
source is opened through :func:`orchestrator.hostfs.paths.open_path` (no link followed) and
its descriptor is held for the run:

- **As root, with the engine in this mount namespace** (a local Docker or Podman), the
  held folder is *pinned*: bind-mounted from ``/proc/self/fd/N`` (the kernel takes the very
  folder that was opened) onto a private folder under :data:`PIN_ROOT`, ``nosuid`` and
  ``nodev`` (and read-only for a read-only zone), and the engine mounts the pin. Nothing a
  worker does to the original path changes what the container gets. Pins are unmounted
  when the run closes; ``orchestrator gc`` unmounts those of dead processes.
- **Otherwise** (not root, an engine in another namespace, Swarm) the engine gets the
  path, checked right before the container is created and again once it runs
  (:meth:`MountSources.changed`): a swap seen then stops the run as a violation. A swap
  made and undone between the check and the engine's own lookup is not seen there
  (docs/security.md states this limit).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from orchestrator import labels
from orchestrator.hostfs.paths import Identity, PathRefused, identity, open_beneath, open_path

__all__ = ["PIN_ROOT", "MountSources", "sweep_pins"]

log = logging.getLogger(__name__)

#: Where pins live: root's runtime folder (never a zone: ``/run`` is refused as one), so a
#: ``rm -rf`` of the project cannot reach a zone through a pin left by a killed run.
PIN_ROOT = Path("/run/orchestrator/mounts")
_OWNER = "owner.json"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
#: statvfs flags kept on a pin (a no-exec or read-only file system stays so through it).
_KEPT = {
    os.ST_RDONLY: _MS_RDONLY,
    os.ST_NOSUID: _MS_NOSUID,
    os.ST_NODEV: _MS_NODEV,
    os.ST_NOEXEC: _MS_NOEXEC,
    os.ST_NOATIME: 1024,
    os.ST_NODIRATIME: 2048,
    os.ST_RELATIME: 1 << 21,
}


def _mount(source: str, target: str, flags: int) -> None:
    import ctypes  # here: only a run that pins its mount sources loads it

    if ctypes.CDLL(None, use_errno=True).mount(source.encode(), target.encode(), None, flags, None):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def _umount(target: str) -> None:
    import ctypes

    if ctypes.CDLL(None, use_errno=True).umount2(target.encode(), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
            raise OSError(code, os.strerror(code), target)


class MountSources:
    """The sources of one run's bind mounts: :meth:`hold` them, give the engine
    :meth:`source` of each, ask :meth:`changed`, and :meth:`release` on every path."""

    def __init__(self, run_id: str, *, pin: bool) -> None:
        self.run_id = run_id
        self.pin = pin
        self._held: dict[str, tuple[int, Identity, bool]] = {}
        self._pins: dict[str, Path] = {}
        self._folder = PIN_ROOT / run_id

    @property
    def pinned(self) -> bool:
        return bool(self._pins)

    def hold(
        self, sources: Iterable[tuple[str, bool]], *, beneath: tuple[Path, int] | None = None
    ) -> None:
        """Open each ``(host path, read_only)`` without following links (:class:`PathRefused`
        names a link on the way) and, when pinning, pin it (read-only when every mount of
        that path is: the engine makes each mount read-only or not on its own).

        ``beneath`` is a checked folder (the sandbox root) and its descriptor: paths inside
        it are opened from that descriptor, never through its name, which whoever may
        write the folder above could have swapped since the check."""
        wanted: dict[str, bool] = {}
        for path, read_only in sources:
            wanted[path] = wanted.get(path, True) and read_only
        for path, read_only in wanted.items():
            if path in self._held:
                continue
            fd = _open_source(Path(path), beneath)
            folder = stat.S_ISDIR(os.fstat(fd).st_mode)
            self._held[path] = (fd, identity(fd), folder)
            if self.pin:
                self._pins[path] = self._pin(fd, folder, read_only, len(self._pins))

    def identities(self) -> dict[str, Identity]:
        return {path: ident for path, (_, ident, _) in self._held.items()}

    def source(self, path: str) -> str:
        """What the engine is told to mount for ``path``."""
        pinned = self._pins.get(path)
        return str(pinned) if pinned is not None else path

    def changed(self) -> list[str]:
        """The held paths that no longer lead, link-free, to the folder held: one line each."""
        problems: list[str] = []
        for path, (_, ident, _) in self._held.items():
            try:
                fd = open_path(Path(path), file_ok=True)
            except PathRefused as refused:
                problems.append(f"{path}: {refused.reason}")
                continue
            try:
                if identity(fd) != ident:
                    problems.append(f"{path} was replaced by another folder")
            finally:
                os.close(fd)
        return problems

    def release(self) -> None:
        """Unmount the pins and close what was held (safe twice)."""
        left = False
        for target in self._pins.values():
            try:
                _umount(str(target))
                _remove(target)
            except OSError as exc:
                left = True
                log.warning("run %s: could not remove the pin %s: %s", self.run_id, target, exc)
        if self._pins and not left:  # else the owner stays, for gc to sweep the rest
            with contextlib.suppress(OSError):
                (self._folder / _OWNER).unlink()
                self._folder.rmdir()
        self._pins.clear()
        for fd, _, _ in self._held.values():
            os.close(fd)
        self._held.clear()

    def _pin(self, fd: int, folder: bool, read_only: bool, index: int) -> Path:
        if not self._pins:
            _private_pin_root()
            self._folder.mkdir(mode=0o700)
            owner = labels.current_owner()
            record = json.dumps({"pid": owner.pid, "start": owner.start, "pid_ns": owner.pid_ns})
            partial = self._folder / f".{_OWNER}"
            partial.write_text(record)
            partial.rename(self._folder / _OWNER)  # whole or absent, even after a SIGKILL
        target = self._folder / str(index)
        if folder:
            target.mkdir(mode=0o700)
        else:
            target.touch(mode=0o600)
        flags = _MS_NOSUID | _MS_NODEV | (_MS_RDONLY if read_only else 0)
        held = os.fstatvfs(fd).f_flag
        for kept, flag in _KEPT.items():
            if held & kept:
                flags |= flag
        try:
            _mount(f"/proc/self/fd/{fd}", str(target), _MS_BIND | _MS_REC)
            _mount("", str(target), _MS_PRIVATE | _MS_REC)
            _mount("", str(target), _MS_BIND | _MS_REMOUNT | flags)
        except OSError:
            with contextlib.suppress(OSError):
                _umount(str(target))
                _remove(target)
            raise
        return target


def _open_source(path: Path, beneath: tuple[Path, int] | None) -> int:
    """``path`` opened without following a link: from ``beneath``'s descriptor when it
    lies inside that folder, else walked from ``/``."""
    if beneath is None or path == beneath[0] or not path.is_relative_to(beneath[0]):
        return open_path(path, file_ok=True)
    relative = path.relative_to(beneath[0]).as_posix()
    try:
        try:
            return open_beneath(beneath[1], relative, folder=True)
        except NotADirectoryError:
            return open_beneath(beneath[1], relative)
    except OSError as exc:
        reason = f"{path} cannot be opened inside the checked {beneath[0]}: {exc.strerror}"
        raise PathRefused(
            path, path, reason, missing=exc.errno == errno.ENOENT, link=None
        ) from None


def _private_pin_root() -> None:
    """Make :data:`PIN_ROOT` a private mount point (once per boot), so that pins never
    propagate into other mount namespaces, whatever ``/run``'s propagation is."""
    PIN_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
    if _is_mount_point(PIN_ROOT):
        return
    lock = os.open(PIN_ROOT.parent / "mounts.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_mount_point(PIN_ROOT):
            _mount(str(PIN_ROOT), str(PIN_ROOT), _MS_BIND)
            _mount("", str(PIN_ROOT), _MS_PRIVATE)
    finally:
        os.close(lock)


def _is_mount_point(path: Path) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
        return any(line.split()[4] == str(path) for line in table if len(line.split()) > 4)


def _remove(target: Path) -> None:
    """Remove an unmounted pin's folder or file; never anything under it (rmdir, unlink)."""
    if target.is_dir() and not target.is_symlink():
        target.rmdir()
    else:
        target.unlink(missing_ok=True)


def sweep_pins() -> list[str]:
    """Unmount the pins of runs whose process is gone (``orchestrator gc``): the run ids."""
    swept: list[str] = []
    if os.geteuid() != 0 or not PIN_ROOT.is_dir():
        return swept
    for folder in sorted(PIN_ROOT.iterdir()):
        try:
            owner = json.loads((folder / _OWNER).read_text())
        except (OSError, ValueError):
            owner = None
        if owner is None:  # killed before its owner was written: nothing was pinned yet
            if not any(_is_mount_point(target) for target in folder.iterdir()):
                shutil.rmtree(folder, ignore_errors=True)  # no mount in it: nothing to cross
                swept.append(folder.name)
            continue
        state = labels.owner_state(
            {
                labels.OWNER_PID: str(owner.get("pid", "")),
                labels.OWNER_START: str(owner.get("start", "")),
                labels.OWNER_NS: str(owner.get("pid_ns", "")),
            }
        )
        if state != "gone":
            continue
        try:
            for target in folder.iterdir():
                if target.name != _OWNER:
                    _umount(str(target))
                    _remove(target)
            (folder / _OWNER).unlink(missing_ok=True)
            folder.rmdir()
        except OSError as exc:
            log.warning("gc could not remove the pins of run %s: %s", folder.name, exc)
            continue
        swept.append(folder.name)
    return swept
