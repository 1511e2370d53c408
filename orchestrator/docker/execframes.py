"""An exec's output frames, read from its hijacked connection: every one of them, and ending
when the container stops, not only when the stream does.

Two things make this more than the SDK's own demultiplexing:

- **Bytes read with the headers.** The engine answers an exec's start with its HTTP headers
  and runs the command at once; the SDK's HTTP response reads those headers through a
  buffer, then hands out the raw socket beneath it. A command quick enough (a ``cat`` of a
  small file under gVisor on a loaded machine) may have its whole output in the same read
  as the headers: left in that buffer, it was never seen, and the exec looked like exit 0
  with no output at all. :func:`read_ahead` takes those bytes first.
- **A sandbox that dies.** Under gVisor (runsc), when the sandbox dies (the host kills it at
  its memory limit: the whole sandbox, not one process), the engine keeps the streams of
  commands exec'd into it open: reading them would block until the container is removed.
  So for a gVisor container the connection is polled, and each quiet :data:`POLL_S` the
  container is asked whether it still runs; once it does not, the frames end as if the
  stream had.
"""

from __future__ import annotations

import io
import select
import socket
import ssl
import struct
from collections.abc import Callable, Iterator
from typing import Any

from docker.utils import socket as docker_socket

from orchestrator.runtime.engine import Stream

#: Seconds of silence between two checks of whether the container still runs.
POLL_S = 1.0
_HEADER = struct.Struct(">BxxxL")
_CHUNK = 1 << 16


def read_ahead(sock: Any) -> bytes:
    """The bytes of the stream that the HTTP response read along with its headers.

    ``sock`` is what the SDK returns for a hijacked connection (``socket=True``): the raw
    stream under the response's buffered reader, with the response kept on it. Whatever
    that reader holds is taken without waiting: the socket is non-blocking meanwhile (a read
    of the socket itself returns what is there, or nothing), so call this before anything
    else uses the socket (a thread feeding the command's input). Nothing is read when the
    response is not the one over this socket.
    """
    response = getattr(sock, "_response", None)
    fp = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if not isinstance(fp, io.BufferedReader) or fp.closed:
        return b""
    raw = getattr(fp.raw, "_sock", None)  # the socket under the reader's socket file
    if not isinstance(raw, socket.socket) or sock not in (fp.raw, raw):  # TLS: the socket
        return b""
    timeout = raw.gettimeout()
    raw.setblocking(False)
    try:
        return fp.read1(_CHUNK) or b""
    except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
        return b""
    finally:
        raw.settimeout(timeout)


def frames_until_stopped(
    sock: Any, running: Callable[[], bool] | None = None, ahead: bytes = b""
) -> Iterator[tuple[Stream, bytes]]:
    """Demultiplex a hijacked exec connection's frames (8-byte header: stream, size), from
    ``ahead`` (its :func:`read_ahead`) on, until it ends or ``running()`` (when given) says
    the container has stopped."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    wait_ms = None if running is None else int(POLL_S * 1000)
    buffer = bytearray(ahead)

    def fill(size: int) -> bool:
        while len(buffer) < size:
            if not poller.poll(wait_ms):
                if running is not None and not running():
                    return False
                continue
            chunk = docker_socket.read(sock, max(size - len(buffer), _CHUNK))
            if chunk is None:  # interrupted, or not there after all: wait again
                continue
            if not chunk:
                return False
            buffer.extend(chunk)
        return True

    while fill(_HEADER.size):
        stream, size = _HEADER.unpack_from(buffer)
        del buffer[: _HEADER.size]
        if not fill(size):
            return
        data = bytes(buffer[:size])
        del buffer[:size]
        if data:
            yield ("stdout" if stream == docker_socket.STDOUT else "stderr"), data
