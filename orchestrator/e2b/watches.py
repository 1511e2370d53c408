"""E2B's streamed folder watch (``filesystem.Filesystem/WatchDir``, the async client's
``files.watch_dir``) over one exec per watch.

The exec is :data:`~orchestrator.e2b.processes.WATCH_LOOP`: it looks at the folder every
:data:`~orchestrator.e2b.processes.WATCH_POLL_S` seconds and prints the listing only when
it changed; the events are the differences between two listings (as the sync client's
polled watch computes them). So a watch is one ``session.exec`` in the audit log, however
long it runs, and one more for the kill that ends it when its client goes; not one per
look.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from orchestrator.e2b import processes, wire
from orchestrator.e2b.wire import ConnectFailure
from orchestrator.errors import OrchestratorError
from orchestrator.integrations import transfer

if TYPE_CHECKING:
    from orchestrator.e2b.sandboxes import Sandbox

log = logging.getLogger(__name__)

__all__ = ["watch_stream"]

#: The most bytes one listing of a watched folder may take.
MAX_LISTING = 16 << 20
#: Sends signal "$1" to the process groups of the processes whose environment holds
#: ``E2B_WATCH_ID="$2"`` (the watch's loop), as the worker.
_STOP = (
    transfer._PATH + 'want="E2B_WATCH_ID=$1"; found=1; '
    "for d in /proc/[0-9]*; do "
    'tr "\\000" "\\n" < "$d/environ" 2>/dev/null | grep -qx -- "$want" || continue; '
    'read -r stat < "$d/stat" || continue; rest=${stat##*) }; set -- "$1" $rest; '
    'kill -s TERM -- "-$5" 2>/dev/null && found=0; done; exit $found'
)

Changes = Callable[
    [str, dict[str, tuple[str, int, float]], dict[str, tuple[str, int, float]]],
    list[dict[str, Any]],
]


class _Listings:
    """Cuts the loop's output into listings (records ended by NUL, a listing by ``=``)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.current = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        self.buffer += chunk
        done = []
        while True:
            end = self.buffer.find(b"\0")
            if end < 0:
                break
            record = bytes(self.buffer[: end + 1])
            del self.buffer[: end + 1]
            if record == b"=\0":
                done.append(bytes(self.current))
                self.current = bytearray()
            else:
                self.current += record
                if len(self.current) > MAX_LISTING:
                    raise transfer.TooMuch("stdout")
        return done


def watch_stream(
    sandbox: Sandbox,
    path: str,
    depth: int,
    changes: Changes,
    keepalive: float = processes.KEEPALIVE_S,
) -> AsyncIterator[bytes]:
    """The ``WatchDir`` stream of ``path``: start, then each event as the loop sees it,
    until the client goes (the loop is then killed) or the exec ends."""
    watch_id = secrets.token_hex(8)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    gone = threading.Event()
    ended = threading.Event()
    listings = _Listings()
    state: dict[str, Any] = {"seen": None}

    def put(item: bytes | None) -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def output(stream: str, chunk: bytes) -> None:
        if stream != "stdout":
            return
        for listing in listings.feed(chunk):
            now = {e.path: (e.kind, e.size, e.mtime) for e in wire.parse_entries(listing)}
            before, state["seen"] = state["seen"], now
            if before is None:  # the first look: what is there already is no event
                put(wire.frame({"start": {}}))
                continue
            for event in changes(path, before, now):
                put(wire.frame({"filesystem": event}))

    def run() -> None:
        argv = ["/bin/sh", "-c", processes.WATCH_LOOP, "sh", path, str(depth)]
        argv.append(str(processes.WATCH_POLL_S))
        try:
            result = sandbox.session.exec(
                argv,
                cwd="/",
                env={"E2B_WATCH_ID": watch_id},
                timeout=processes.WATCH_TIMEOUT,
                on_output=output,
            )
            if state["seen"] is None and result.exit_code != 0:
                why = result.stderr.strip().splitlines()[-1:] or [f"{path}: cannot watch"]
                code = "invalid_argument" if result.exit_code == 2 else "not_found"
                put(wire.end_frame(ConnectFailure(code, why[0])))
            elif not gone.is_set():
                put(wire.end_frame())
        except transfer.TooMuch:
            put(wire.end_frame(ConnectFailure("resource_exhausted", f"{path}: too many entries")))
        except OrchestratorError as exc:
            put(wire.end_frame(ConnectFailure("unavailable", str(exc).splitlines()[0])))
        except Exception:
            log.exception("e2b: a watch in sandbox %s failed", sandbox.id)
            put(wire.end_frame(ConnectFailure("internal", "internal error")))
        finally:
            ended.set()
            put(None)

    def stop() -> None:
        try:
            sandbox.session.exec(
                ["/bin/sh", "-c", _STOP, "sh", watch_id],
                cwd="/",
                timeout=processes.INPUT_TIMEOUT,
                on_output=lambda stream, chunk: None,
            )
        except OrchestratorError as exc:  # the session closed: the loop went with it
            log.debug("stopping watch %s: %s", watch_id, exc)

    async def stream() -> AsyncIterator[bytes]:
        threading.Thread(target=run, name=f"e2b-watch-{watch_id}", daemon=True).start()
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=keepalive)
                except TimeoutError:
                    yield wire.frame({"keepalive": {}})
                    continue
                if item is None:
                    return
                yield item
        finally:
            gone.set()
            if not ended.is_set() and not sandbox.session.closed:
                threading.Thread(target=stop, name=f"e2b-unwatch-{watch_id}", daemon=True).start()

    return stream()
