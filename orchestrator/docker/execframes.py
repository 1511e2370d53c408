"""An exec's output frames that end when its container stops, not only when the stream does.

Under gVisor (runsc), when the sandbox dies (the host kills it at its memory limit: the
whole sandbox, not one process), the engine keeps the streams of commands exec'd into it
open: reading them would block until the container is removed. So for a gVisor container
the hijacked connection is polled, and each quiet :data:`POLL_S` the container is asked
whether it still runs; once it does not, the frames end as if the stream had.
"""

from __future__ import annotations

import select
import struct
from collections.abc import Callable, Iterator
from typing import Any

from docker.utils import socket as docker_socket

from orchestrator.runtime.engine import Stream

#: Seconds of silence between two checks of whether the container still runs.
POLL_S = 1.0
_HEADER = struct.Struct(">BxxxL")


def frames_until_stopped(sock: Any, running: Callable[[], bool]) -> Iterator[tuple[Stream, bytes]]:
    """Demultiplex a hijacked exec connection's frames (8-byte header: stream, size) until
    it ends or ``running()`` says the container has stopped."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    buffer = bytearray()

    def fill(size: int) -> bool:
        while len(buffer) < size:
            if not poller.poll(int(POLL_S * 1000)):
                if not running():
                    return False
                continue
            chunk = docker_socket.read(sock, max(size - len(buffer), 1 << 16))
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
