"""E2B's process service over a session's execs: a command's stream and the clients
connected to it, standard input, pseudo-terminals (blocking exec calls run in threads).

Every command is one :meth:`~orchestrator.runtime.session.Session.exec` (as the worker's
uid, audited as any session's command); nothing here has a lifecycle of its own: a
command lives as long as its exec.

- **Output to every client.** A command's output goes to each stream open on it: the
  ``Start`` that began it and any ``Connect`` since (which see the output from then on,
  as envd's do). A command nobody listens to keeps running; its output is dropped.
- **Standard input** (``stdin=True``, and every PTY): the command reads a FIFO in a
  folder of its own under ``/tmp`` that a small holder process keeps open, so each
  ``SendInput`` (an exec writing to the FIFO) is not an end of file; ``CloseStdin`` ends
  the holder, and the command then reads end of file. The folder goes with the command.
- **PTY**: the command runs under util-linux ``script`` (in every Debian image), which
  gives it a real pseudo-terminal (``/dev/pts/N``) of the size asked for; what the
  terminal shows is the ``pty`` output, input goes to the terminal. A resize sets the
  terminal's size with ``stty`` (the kernel tells the foreground job by SIGWINCH).
- **Watches** (``WatchDir``, async ``files.watch_dir``): one exec per watch, a loop in
  the container that lists the folder every :data:`WATCH_POLL_S` and prints it only when
  it changed; the events are the differences, computed here. The audit log so holds one
  entry for the watch (and one for the kill that stops it), not one per look.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import shlex
import struct
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.e2b import wire
from orchestrator.e2b.wire import ConnectFailure
from orchestrator.errors import OrchestratorError
from orchestrator.integrations import transfer

if TYPE_CHECKING:
    from orchestrator.e2b.sandboxes import Sandbox

log = logging.getLogger(__name__)

__all__ = [
    "Process",
    "close_stdin",
    "connect_stream",
    "resize",
    "send_input",
    "start_stream",
    "stream_input",
]

#: The most output kept of one stream of a command (bytes).
MAX_OUTPUT = 64 << 20
#: Seconds between two keepalive events on a quiet stream (the SDK's own interval is 50).
KEEPALIVE_S = 30.0
#: How long writing input, closing it or resizing may take (seconds): the FIFO is full
#: while the command reads nothing.
INPUT_TIMEOUT = 30.0
#: Seconds between two looks of a watch at its folder.
WATCH_POLL_S = 0.25
#: How long a watch may run (seconds): E2B's longest sandbox timeout.
WATCH_TIMEOUT = 24 * 3600.0

#: Runs "$@" reading the FIFO "$1/in", kept open by a holder until "$1/ctl" gets a line.
STDIN_WRAPPER = (
    transfer._PATH + 'd=$1; shift; mkdir -m 700 -- "$d" && mkfifo -m 600 -- "$d/in" "$d/ctl" '
    "|| exit 126; "
    '( exec 3<>"$d/in" 4<>"$d/ctl"; read -r _ <&4 ) </dev/null >/dev/null 2>&1 & h=$!; '
    '"$@" <"$d/in"; rc=$?; kill "$h" 2>/dev/null; rm -rf -- "$d"; exit "$rc"'
)
#: Waits (5 s at most) for the FIFOs of a command just started ($1: their folder).
_READY = (
    transfer._PATH + 'i=0; until [ -p "$1/ctl" ]; do [ "$i" -lt 50 ] || exit 3; '
    "sleep 0.1; i=$((i + 1)); done; "
)
#: Copies standard input to the command's FIFO; 3 when it has gone.
_SEND = _READY + 'exec cat >"$1/in"'
#: Ends the holder, so the command reads end of file.
_CLOSE = _READY + 'printf "x\\n" >"$1/ctl"'
#: Sets the size of the terminal of the command whose environment holds
#: ``E2B_PROCESS_ID="$1"`` (the terminal its process reads from) to "$2" rows, "$3" cols;
#: a terminal just asked for may take a moment to appear (5 s at most).
_RESIZE = (
    transfer._PATH + 'want="E2B_PROCESS_ID=$1"; i=0; while :; do '
    "for d in /proc/[0-9]*; do "
    'tr "\\000" "\\n" < "$d/environ" 2>/dev/null | grep -qx -- "$want" || continue; '
    't=$(readlink "$d/fd/0" 2>/dev/null) || continue; '
    'case "$t" in /dev/pts/*) exec stty -F "$t" rows "$2" cols "$3";; esac; done; '
    '[ "$i" -lt 50 ] || exit 3; sleep 0.1; i=$((i + 1)); done'
)
#: Prints the folder "$1" (find records to depth "$2", then a record ``=``) each time
#: it differs from the last look, every "$3" seconds (a folder gone: an empty one); exit
#: 1 when there is no such folder, 2 when it is not a folder.
WATCH_LOOP = (
    transfer._PATH + 'if [ ! -d "$1" ]; then if [ -e "$1" ]; then '
    'printf "%s: Not a directory\\n" "$1" >&2; exit 2; fi; '
    'printf "%s: No such file or directory\\n" "$1" >&2; exit 1; fi; '
    "last=; while :; do "
    f'now=$(find "$1" -mindepth 1 -maxdepth "$2" -printf \'{wire.FIND_FORMAT}\' '
    "2>/dev/null | cksum); "
    'if [ "$now" != "$last" ]; then last=$now; '
    f'find "$1" -mindepth 1 -maxdepth "$2" -printf \'{wire.FIND_FORMAT}\' 2>/dev/null; '
    "printf '=\\000'; fi; sleep \"$3\"; done"
)


@dataclass
class Process:
    """A command running in a sandbox: what it was started with, and who listens."""

    pid: int
    config: dict[str, Any]
    tag: str | None
    pty: bool
    fifo: str | None
    """The folder of its standard input's FIFO (None: its input is empty)."""
    listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[bytes | None]]] = field(
        default_factory=list
    )
    lock: threading.Lock = field(default_factory=threading.Lock)
    ended: bool = False

    def publish(self, item: bytes | None) -> None:
        """A frame (None: the end) to every stream open on the command."""
        with self.lock:
            if item is None:
                self.ended = True
            listeners = list(self.listeners)
        for loop, queue in listeners:
            with contextlib.suppress(RuntimeError):  # that stream's loop has gone
                loop.call_soon_threadsafe(queue.put_nowait, item)

    def listen(self) -> asyncio.Queue[bytes | None]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        with self.lock:
            if self.ended:
                raise ConnectFailure("not_found", f"process {self.pid} is not running")
            self.listeners.append((asyncio.get_running_loop(), queue))
        return queue

    def unlisten(self, queue: asyncio.Queue[bytes | None]) -> None:
        with self.lock:
            self.listeners = [(lp, q) for lp, q in self.listeners if q is not queue]


def find(sandbox: Sandbox, selector: Any) -> Process:
    """The running command a ``ProcessSelector`` (pid or tag) names, or not_found."""
    if not isinstance(selector, dict):
        raise ConnectFailure("invalid_argument", "process: give a pid or a tag")
    pid, tag = selector.get("pid"), selector.get("tag")
    with sandbox.lock:
        for process in sandbox.processes.values():
            if (isinstance(pid, int) and process.pid == pid) or (
                isinstance(tag, str) and tag and process.tag == tag
            ):
                found: Process = process
                return found
    raise ConnectFailure("not_found", f"process {pid if tag is None else tag!r} is not running")


def _frames(process: Process) -> Callable[[str, bytes], None]:
    kept = {"stdout": 0, "stderr": 0}

    def output(stream: str, chunk: bytes) -> None:
        kept[stream] += len(chunk)
        if kept[stream] > MAX_OUTPUT:
            raise transfer.TooMuch(stream)
        key = "pty" if process.pty else stream
        data = base64.b64encode(chunk).decode()
        process.publish(wire.frame({"event": {"data": {key: data}}}))

    return output


def start_stream(
    sandbox: Sandbox,
    argv: list[str],
    cwd: str | None,
    env: dict[str, str],
    timeout: float | None,
    shown: dict[str, Any],
    *,
    tag: str | None = None,
    stdin: bool = False,
    pty: tuple[int, int] | None = None,
    keepalive: float = KEEPALIVE_S,
) -> AsyncIterator[bytes]:
    """A ``process.Process/Start`` stream: start, the output as it comes, end. The
    command is in the sandbox's ``running`` (``commands.list``) and ``processes`` (for
    ``Connect``, input, signals) while it runs."""
    pid = sandbox.pid()
    fifo = f"/tmp/.e2b-stdin-{pid}-{secrets.token_hex(4)}" if stdin or pty else None
    process = Process(pid, shown, tag, pty is not None, fifo)
    if pty is not None:
        rows, cols = pty
        inner = f"stty rows {rows} cols {cols} 2>/dev/null; exec {shlex.join(argv)}"
        argv = ["script", "-qfec", inner, "/dev/null"]
        env = {**env, "SHELL": "/bin/sh"}
    if fifo is not None:
        argv = ["/bin/sh", "-c", STDIN_WRAPPER, "sh", fifo, *argv]
    env = {**env, "E2B_PROCESS_ID": str(pid)}
    output = _frames(process)
    spec_timeout = sandbox.session.spec.limits.timeout_s

    def run() -> None:
        put = process.publish
        try:
            result = sandbox.session.exec(argv, cwd=cwd, env=env, timeout=timeout, on_output=output)
            if result.timed_out:
                failure = ConnectFailure(
                    "deadline_exceeded",
                    f"the command ran over its timeout ({timeout or spec_timeout} s)",
                )
                put(wire.end_frame(failure))
            else:
                end: dict[str, Any] = {
                    "exitCode": result.exit_code,
                    "exited": result.signal is None,
                    "status": (
                        f"exit status {result.exit_code}"
                        if result.signal is None
                        else f"signal: {result.signal}"
                    ),
                }
                put(wire.frame({"event": {"end": end}}))
                put(wire.end_frame())
        except transfer.TooMuch as exc:
            put(wire.end_frame(ConnectFailure("resource_exhausted", f"{exc.stream} over cap")))
        except OrchestratorError as exc:
            put(wire.end_frame(ConnectFailure("unavailable", str(exc).splitlines()[0])))
        except Exception:
            log.exception("e2b: a command in sandbox %s failed", sandbox.id)
            put(wire.end_frame(ConnectFailure("internal", "internal error")))
        finally:
            with sandbox.lock:
                sandbox.running.pop(pid, None)
                sandbox.processes.pop(pid, None)
            put(None)

    async def stream() -> AsyncIterator[bytes]:
        with sandbox.lock:
            sandbox.running[pid] = shown
            sandbox.processes[pid] = process
        queue = process.listen()
        try:
            yield wire.frame({"event": {"start": {"pid": pid}}})
            threading.Thread(target=run, name=f"e2b-exec-{pid}", daemon=True).start()
            async for item in _drain(queue, keepalive):
                yield item
        finally:
            process.unlisten(queue)

    return stream()


def connect_stream(
    sandbox: Sandbox, selector: Any, keepalive: float = KEEPALIVE_S
) -> AsyncIterator[bytes]:
    """A ``process.Process/Connect`` stream: start (the pid), then the command's output
    from now on, and its end. Raises not_found (before any stream) when nothing runs."""
    process = find(sandbox, selector)
    queue = process.listen()

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield wire.frame({"event": {"start": {"pid": process.pid}}})
            async for item in _drain(queue, keepalive):
                yield item
        finally:
            process.unlisten(queue)

    return stream()


async def _drain(queue: asyncio.Queue[bytes | None], keepalive: float) -> AsyncIterator[bytes]:
    while True:
        try:
            item = await asyncio.wait_for(queue.get(), timeout=keepalive)
        except TimeoutError:
            yield wire.frame({"event": {"keepalive": {}}})
            continue
        if item is None:
            return
        yield item


async def _script(sandbox: Sandbox, script: str, args: list[str], data: bytes | None) -> int:
    capture = transfer.Capture(64 << 10, 64 << 10)
    try:
        result = await asyncio.to_thread(
            sandbox.session.exec,
            ["/bin/sh", "-c", script, "sh", *args],
            cwd="/",
            timeout=INPUT_TIMEOUT,
            stdin=data,
            on_output=capture.add,
        )
    except OrchestratorError as exc:
        raise ConnectFailure("unavailable", str(exc).splitlines()[0]) from None
    if result.timed_out:
        raise ConnectFailure(
            "deadline_exceeded", f"the process read nothing for {INPUT_TIMEOUT:.0f} s"
        )
    return int(result.exit_code)


def _input_fifo(sandbox: Sandbox, selector: Any) -> Process:
    process = find(sandbox, selector)
    if process.fifo is None:
        raise ConnectFailure(
            "failed_precondition",
            f"process {process.pid} was started without stdin: run it with stdin=True",
        )
    return process


async def send_input(sandbox: Sandbox, message: dict[str, Any]) -> None:
    """``SendInput``: the bytes (``input.stdin`` or ``input.pty``) to the command."""
    process = _input_fifo(sandbox, message.get("process"))
    given = message.get("input") or {}
    raw = given.get("pty" if process.pty else "stdin") if isinstance(given, dict) else None
    if raw is None and isinstance(given, dict):
        raw = given.get("stdin") or given.get("pty")
    if not isinstance(raw, str):
        raise ConnectFailure("invalid_argument", "input: give stdin or pty bytes")
    try:
        data = base64.b64decode(raw, validate=True)
    except ValueError:
        raise ConnectFailure("invalid_argument", "input: not base64") from None
    assert process.fifo is not None
    if await _script(sandbox, _SEND, [process.fifo], data) != 0:
        raise ConnectFailure("not_found", f"process {process.pid}: its stdin is closed")


async def close_stdin(sandbox: Sandbox, message: dict[str, Any]) -> None:
    """``CloseStdin``: the command reads end of file once it has read what was sent."""
    process = _input_fifo(sandbox, message.get("process"))
    assert process.fifo is not None
    if await _script(sandbox, _CLOSE, [process.fifo], None) != 0:
        raise ConnectFailure("not_found", f"process {process.pid}: its stdin is closed")


async def resize(sandbox: Sandbox, message: dict[str, Any]) -> None:
    """``Update``: a PTY's new size."""
    process = find(sandbox, message.get("process"))
    size = (message.get("pty") or {}).get("size") if isinstance(message.get("pty"), dict) else None
    if not process.pty:
        raise ConnectFailure("failed_precondition", f"process {process.pid} has no PTY")
    rows = size.get("rows") if isinstance(size, dict) else None
    cols = size.get("cols") if isinstance(size, dict) else None
    if not all(isinstance(n, int) and 0 < n < 10000 for n in (rows, cols)):
        raise ConnectFailure("invalid_argument", "pty.size: give rows and cols, 1 to 9999")
    args = [str(process.pid), str(rows), str(cols)]
    if await _script(sandbox, _RESIZE, args, None) != 0:
        raise ConnectFailure("not_found", f"process {process.pid}: its terminal has gone")


def split_size(pty: Any) -> tuple[int, int] | None:
    """A ``StartRequest``'s PTY size as (rows, cols), None without a PTY."""
    if not pty:
        return None
    size = pty.get("size") if isinstance(pty, dict) else None
    rows = size.get("rows", 24) if isinstance(size, dict) else 24
    cols = size.get("cols", 80) if isinstance(size, dict) else 80
    if not all(isinstance(n, int) and 0 < n < 10000 for n in (rows, cols)):
        raise ConnectFailure("invalid_argument", "pty.size: give rows and cols, 1 to 9999")
    return rows, cols


async def stream_input(sandbox: Sandbox, chunks: AsyncIterator[bytes]) -> bytes:
    """``StreamInput`` (a client stream): its first message names the command (``start``),
    each ``data`` message after it is sent to the command as it arrives (one exec each,
    in order), ``keepalive`` is skipped. The answer's body: one empty message and the end
    of the stream, or the end with the error."""
    buffer = bytearray()
    process: Process | None = None
    try:
        async for chunk in chunks:
            buffer += chunk
            while len(buffer) >= 5:
                flags, size = struct.unpack(">BI", buffer[:5])
                if len(buffer) < 5 + size:
                    break
                data = bytes(buffer[5 : 5 + size])
                del buffer[: 5 + size]
                if flags & 2:
                    break
                if flags & 1:
                    raise ConnectFailure("invalid_argument", "compressed messages are not accepted")
                message = wire.message_of(data)
                if "start" in message:
                    start = message.get("start")
                    process = _input_fifo(
                        sandbox, start.get("process") if isinstance(start, dict) else None
                    )
                elif "data" in message:
                    if process is None:
                        raise ConnectFailure("invalid_argument", "give start before data")
                    given = message.get("data")
                    await send_input(
                        sandbox,
                        {
                            "process": {"pid": process.pid},
                            "input": given.get("input") if isinstance(given, dict) else None,
                        },
                    )
        if buffer:
            raise ConnectFailure("invalid_argument", "a truncated Connect envelope")
    except ConnectFailure as exc:
        return wire.end_frame(exc)
    return wire.frame({}) + wire.end_frame()
