"""Runs with an outbox: the worker runs by exec, so its outbox can be read after it ends.

A tmpfs outbox disappears with the container, and the engine's archive API cannot see
tmpfs mounts. So the container's own process (as a user of its own) only keeps the mounts
alive; the worker runs by ``exec`` as the worker's user; when it ends (or times out), every
process of that user is killed (``kill -9 -1`` as the worker spares only other users'
processes), and only then is the outbox read, as a tar stream, by one more exec. The host
parses that stream as hostile data (``orchestrator.staging``).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

from orchestrator.errors import ContainerStopped, OrchestratorError
from orchestrator.plan import ContainerSpec
from orchestrator.runtime.engine import Containers, ExecHandle, Stream

#: Kill everything the worker's user runs. Twice: a process forking during the first
#: sweep is caught by the second (the PID limit bounds how many there can be).
KILL_ALL = ["/bin/sh", "-c", "kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null; true"]
#: The same for a run as the image's user (``image_user``): there the keep-alive process is
#: root's too (the engine gives an exec only the capabilities the container's own user
#: has), so every process but PID 1, the keep-alive (PID 1's first child: the lowest pid
#: whose parent is 1) and this shell is killed by pid. What it runs is the container's
#: own ``sh``, which such a worker can replace: it only ever acts on the worker's own run.
KILL_ALL_BUT_KEEPALIVE = [
    "/bin/sh",
    "-c",
    r"""keep=
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  while read -r key value; do
    if [ "$key" = PPid: ]; then
      if [ "$value" = 1 ] && { [ -z "$keep" ] || [ "$p" -lt "$keep" ]; }; then keep=$p; fi
      break
    fi
  done < "$d/status" 2>/dev/null
done
for round in 1 2; do
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = 1 ] || [ "$p" = "$keep" ] || [ "$p" = $$ ] || kill -9 "$p" 2>/dev/null
  done
done
true""",
]


def kill_all(spec: ContainerSpec) -> list[str]:
    """The command that kills every process of the worker (see :data:`KILL_ALL`)."""
    return KILL_ALL_BUT_KEEPALIVE if spec.image_user else KILL_ALL


#: Our own execs never use the worker's PATH or tar options: a worker file may point PATH
#: at a writable zone, where a planted `sh` or `tar` would then run in their place.
TOOL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TAR_OPTIONS": "", "ENV": "", "BASH_ENV": ""}
OOM_COUNTERS = [
    "/bin/sh",
    "-c",
    "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null",
]
#: The outbox as tar under gVisor, whose tmpfs shows no holes (SEEK_DATA fails, st_blocks
#: counts the apparent size): tar then stores a sparse file in full, and one larger than the
#: outbox itself (``$1`` bytes: it can only be sparse) stops the reader at its budget. Such
#: files are listed last, so they hide no other entry; they are refused by name as before.
GVISOR_TAR = (
    'cd "$0" || exit 2; { find . \\( ! -type f -o ! -size +"$1"c \\) -print0; '
    'find . -type f -size +"$1"c -print0; } | exec tar --sparse --null --no-recursion -T - -cf -'
)
#: Reads one run's outbox tar stream (hostile data) and says what it became.
OutboxReader = Callable[[ContainerSpec, IO[bytes]], Any]


class FrameReader(io.RawIOBase):
    """A binary file over an exec's stdout frames (stderr kept aside), for ``tarfile``."""

    def __init__(self, frames: Iterator[tuple[Stream, bytes]]) -> None:
        self.frames = frames
        self.pending = b""
        self.stderr = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            try:
                stream, chunk = next(self.frames)
            except StopIteration:
                return 0
            if stream == "stdout":
                self.pending = chunk
            elif len(self.stderr) < 4096:
                self.stderr += chunk
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        self.pending = self.pending[size:]
        return size


def drain(handle: ExecHandle) -> bytes:
    return b"".join(chunk for _, chunk in handle.frames)


def run_worker_exec(
    engine: Containers,
    container_id: str,
    spec: ContainerSpec,
    pump: Callable[[Iterator[tuple[Stream, bytes]]], None],
    *,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> tuple[int | None, bool]:
    """Exec the worker and wait up to its timeout; return (exit code, timed out). The exit
    code is None when the container itself stopped under the worker.

    Its argv is the image's command (or the worker's), then the plan's arguments, then
    ``args``; its environment the plan's, with ``env`` over it. Whatever happens, every
    process of the worker's user is gone when this returns (or raises
    :class:`~orchestrator.errors.StartFailure`: the worker's command could not start).
    """
    argv = engine.image_argv(spec.image, spec.command)
    if not argv:
        raise OrchestratorError(
            f"image '{spec.image}' has no command; set command: in the worker file"
        )
    argv = [*argv, *spec.args, *args]
    environment = {**spec.env, **(env or {})}
    handle = engine.exec(container_id, argv, user=spec.user, env=environment, workdir=spec.workdir)
    done = threading.Event()

    def read() -> None:
        try:
            pump(handle.frames)
        finally:
            done.set()

    reader = threading.Thread(target=read, name=f"exec-{container_id[:12]}", daemon=True)
    reader.start()
    finished = done.wait(timeout=spec.limits.timeout_s)
    try:
        drain(engine.exec(container_id, kill_all(spec), user=spec.user, env=TOOL_ENV))
    except ContainerStopped:
        return None, False  # the whole container died (gVisor at its memory limit): see Run
    done.wait(timeout=10)
    return handle.exit_code(), not finished  # StartFailure: the worker's command cannot run


def oom_killed(engine: Containers, container_id: str, user: str) -> bool:
    """Whether the container's memory cgroup has OOM-killed anything (cgroup v1 or v2)."""
    counters = engine.exec(container_id, OOM_COUNTERS, user=user, env=TOOL_ENV)
    text = drain(counters).decode(errors="replace")
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit() and int(value) > 0:
            return True
    return False


def read_outbox(
    engine: Containers, container_id: str, spec: ContainerSpec, reader: OutboxReader
) -> Any:
    """Stream the outbox as tar, as the worker's user, into ``reader`` (hostile data)."""
    assert spec.outbox is not None
    # --sparse: a sparse file is sent as its map and written chunks, not its apparent size
    # in zeros, so the reader can refuse it and skip it by what the stream holds.
    tar = ["/bin/sh", "-c", 'exec tar --sparse -C "$0" -cf - .', spec.outbox]
    if spec.isolation == "gvisor":
        outbox = spec.tmpfs_at(spec.outbox)
        tar = ["/bin/sh", "-c", GVISOR_TAR, spec.outbox, str(outbox.size if outbox else 0)]
    handle = engine.exec(container_id, tar, user=spec.user, env=TOOL_ENV)
    stream = FrameReader(handle.frames)
    try:
        return reader(spec, io.BufferedReader(stream, buffer_size=1 << 20))
    finally:
        # Never read on past what the reader took (it stops at its byte budget). Closing
        # the stream, then removing the container, ends tar.
        close = getattr(handle.frames, "close", None)
        if close is not None:
            close()
