"""The stdio front of ``orchestrator mcp``: ``initialize`` and ``tools/list`` answered at once.

Standard library only. Importing the ``mcp`` SDK and opening the session's container take
seconds, and stdio clients give a server a few seconds to answer ``initialize`` (some five).
So the console entry point starts a :class:`Front` before anything heavy is imported: it
owns the process's stdin and stdout for the whole run, and until the SDK server attaches it
answers the handshake itself, from :mod:`orchestrator.tools.catalog`, the data the SDK
server answers from too:

- ``initialize`` (the first one, well formed): the same result the SDK server gives;
- ``tools/list`` and ``ping`` after it;
- ``server/discover``, the probe of the 2026-07-28 protocol's clients, at any time: refused
  as "method not found", as a server of the handshake era does, so the client falls back to
  ``initialize``. Approvals ask the person through elicitation, a request from the server
  to the client, which the handshake era carries on stdio.

Everything else (tool calls, notifications, anything it does not answer, ``initialize``
included) is held, in order, for the SDK server, which gets it on :meth:`Front.attach`,
followed by every later line as it arrives. The ``initialize`` it answered is replayed
into the SDK server under :data:`REPLAY_ID`, so the SDK's connection knows the client's
capabilities (elicitation) and protocol version; the SDK's answer to it is dropped.

While the front runs, descriptor 0 reads the null device and descriptor 1 writes to
stderr: stdout carries the protocol and nothing else, whatever prints.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from orchestrator.tools import catalog

__all__ = ["REPLAY_ID", "Front", "Line", "current", "start"]

#: The id under which the answered ``initialize`` is replayed into the SDK server; its
#: answer, already sent by the front, is dropped.
REPLAY_ID = "orchestrator-front-initialize"
#: ``_meta`` keys of the 2026-07-28 per-request envelope: a request that carries one is the
#: SDK's to answer (it refuses it on a handshake connection).
RESERVED_META = "io.modelcontextprotocol/"

#: The 2026-07-28 era's opening probe, declined (see :meth:`Front._declined`).
DISCOVER = "server/discover"
METHOD_NOT_FOUND = -32601

#: A line from the client for the SDK server, or None at the end of stdin.
Line = str | None

_current: Front | None = None
_current_lock = threading.Lock()


class Front:
    """Reads the client's lines on a thread of its own; answers or holds them until
    :meth:`attach`, then passes each on. :meth:`write` sends one line to the client."""

    def __init__(self, reader: Any, writer_fd: int, *, version: str | None = None) -> None:
        """``reader``: a binary file the client's lines come from; ``writer_fd``: where the
        answers go; ``version``: the server's (default: the installed package's)."""
        self._reader = reader  # a binary file: readline() -> bytes
        self._writer_fd = writer_fd
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._held: list[str] = []
        self._ended = False
        self._deliver: Callable[[Line], None] | None = None
        self._answered_initialize = False
        self._version = version
        self.answered: list[str] = []
        """The methods the front answered itself, in order (for tests and the bench)."""
        self._handshake = threading.Event()
        self._thread = threading.Thread(target=self._read, name="mcp-front", daemon=True)

    @classmethod
    def on_stdio(cls) -> Front:
        """A front over this process's stdin and stdout, which it takes for itself: the
        protocol moves to private descriptors, 0 reads the null device, 1 goes to stderr."""
        sys.stdout.flush()
        wire_in = os.dup(0)
        wire_out = os.dup(1)
        os.set_inheritable(wire_in, False)
        os.set_inheritable(wire_out, False)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)
        return cls(os.fdopen(wire_in, "rb", buffering=0), wire_out)

    def start(self) -> Front:
        self._thread.start()
        return self

    def wait_for_handshake(self, timeout: float) -> bool:
        """Wait until the client's handshake is answered (its ``tools/list``, or anything
        the front holds for the SDK server, or the end of stdin), at most ``timeout``
        seconds: the heavy imports that follow would slow the front's answers down."""
        return self._handshake.wait(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the client's stdin has ended (and is closed); False on timeout."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def attach(self, deliver: Callable[[Line], None]) -> None:
        """From now on every line goes to ``deliver``: first what was held (the answered
        ``initialize`` as :data:`REPLAY_ID`), then each as it arrives, then None at the
        end of stdin. ``deliver`` must not block: it is called under the front's lock."""
        with self._lock:
            for line in self._held:
                deliver(line)
            self._held.clear()
            if self._ended:
                deliver(None)
            self._deliver = deliver

    def detach(self) -> None:
        """The server is gone: drop every later line (the process is ending)."""
        with self._lock:
            self._deliver = _drop

    def write(self, line: str) -> None:
        """Send one JSON-RPC message (a line without its newline) to the client."""
        data = (line + "\n").encode("utf-8")
        with self._write_lock:
            view = memoryview(data)
            while view:
                written = os.write(self._writer_fd, view)
                view = view[written:]

    def _read(self) -> None:
        if self._version is None:  # before the client asks: it takes a while to compute
            self._version = catalog.server_version()
        while True:
            try:
                raw = self._reader.readline()
            except (OSError, ValueError):
                raw = b""
            line = raw.decode("utf-8", errors="replace") if raw else None
            if line is None:
                self._reader.close()
            with self._lock:
                if line is None:
                    self._ended = True
                    self._handshake.set()
                    if self._deliver is not None:
                        self._deliver(None)
                    return
                if self._declined(line):
                    continue
                if self._deliver is not None:
                    self._deliver(line)
                    continue
                if not self._answer(line):
                    self._held.append(line)
                    if _is_request(line):  # a call waits for the SDK server: go on at once
                        self._handshake.set()

    def _declined(self, line: str) -> bool:
        """Refuse the 2026-07-28 era's ``server/discover`` probe as a handshake-only server
        does (method not found): the client then sends ``initialize``. Approvals need the
        handshake era's back-channel (elicitation), so the SDK server never sees a probe."""
        if DISCOVER not in line:
            return False
        try:
            message = json.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("method") != DISCOVER:
            return False
        self.answered.append(DISCOVER)
        if "id" in message:
            error = {"code": METHOD_NOT_FOUND, "message": "Method not found", "data": DISCOVER}
            self.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}))
        return True

    def _answer(self, line: str) -> bool:
        """Answer ``line`` here if it is ours to answer; False to hold it."""
        try:
            message = json.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return False
        ident, method, params = message.get("id"), message.get("method"), message.get("params")
        if not isinstance(ident, (str, int)) or isinstance(ident, bool):
            return False
        if params is not None and not isinstance(params, dict):
            return False
        if method == "initialize" and not self._answered_initialize:
            if params is None or not _well_formed_initialize(params):
                return False
            if self._version is None:
                self._version = catalog.server_version()
            result = catalog.initialize_result(params["protocolVersion"], self._version)
            self._held.append(json.dumps({**message, "id": REPLAY_ID}))
            self._answered_initialize = True
        elif method == "tools/list" and self._answered_initialize and _plain(params, "cursor"):
            result = {"tools": catalog.tool_entries()}
            self._handshake.set()
        elif method == "ping" and self._answered_initialize and _plain(params):
            result = {}
        else:
            return False
        self.answered.append(method)
        self.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}))
        return True


def _is_request(line: str) -> bool:
    try:
        message = json.loads(line)
    except ValueError:
        return True  # the SDK server answers it
    return not isinstance(message, dict) or "id" in message


def _drop(line: Line) -> None:
    pass


def _well_formed_initialize(params: dict[str, Any]) -> bool:
    """Whether the SDK would accept these ``initialize`` params (else it answers itself)."""
    if not isinstance(params.get("protocolVersion"), str):
        return False
    info = params.get("clientInfo")
    if not isinstance(params.get("capabilities"), dict) or not isinstance(info, dict):
        return False
    return isinstance(info.get("name"), str) and isinstance(info.get("version"), str)


def _plain(params: dict[str, Any] | None, *strings: str) -> bool:
    """Params the SDK answers as the front does: only ``strings`` (as strings) and a
    ``_meta`` without the per-request envelope's keys."""
    if params is None:
        return True
    meta = params.get("_meta", {})
    if not isinstance(meta, dict) or any(str(k).startswith(RESERVED_META) for k in meta):
        return False
    rest = {k: v for k, v in params.items() if k != "_meta"}
    return all(k in strings and isinstance(v, str) for k, v in rest.items())


def start() -> Front:
    """This process's front on stdio, started once (the entry point's fast path, or the
    ``mcp`` command itself when it runs another way, e.g. under the fork server)."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Front.on_stdio().start()
        return _current


def current() -> Front | None:
    """The front started in this process, if any."""
    return _current
