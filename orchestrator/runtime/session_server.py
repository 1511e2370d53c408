"""A session that outlives one command: its owner process and the private control socket.

``orchestrator session start`` spawns an owner process that opens the session (the
container carries the owner's labels, so ``gc`` removes it if the owner is SIGKILLed) and
serves ``<sandbox root>/control/<session id>.sock``: a unix socket, mode 0600, in a folder
of mode 0700, answering only peers of the same uid (checked with ``SO_PEERCRED``).

The protocol is JSON lines. A client sends one request (at most :data:`MAX_REQUEST`
bytes) and reads answers until the final one:

- ``{"op": "info"}`` → the session's id, run id, worker, trust, zones, age and idle time;
- ``{"op": "exec", "argv", "cwd", "env", "timeout", "stdin", "resume"}`` →
  ``{"event": "output", "stream", "data"}`` lines while the command prints, then its
  :class:`ExecResult` (``"resume": true`` resumes a paused session first);
- ``{"op": "read", "path", "limit"}`` → the file's bytes; ``{"op": "write", "path",
  "data"}`` → the :class:`WriteResult` (bytes travel as base64);
- ``{"op": "tool", "name", "args", "wait"}`` → the answer of one sandbox tool call
  (:class:`~orchestrator.tools.Toolset`). A call that needs approval first sends
  ``{"event": "waiting", "approval": {...}}`` and waits (at most ``wait`` seconds, default
  :data:`APPROVAL_WAIT_S`) for an ``answer``; unanswered, it is declined;
- ``{"op": "approvals"}`` → the calls waiting for a person (id, tool, args, description,
  asked_at); ``{"op": "answer", "id", "approve", "by", "via"}`` → answers one, audited as
  ``tool.approval`` with who and through what;
- ``{"op": "pause"}``, ``{"op": "resume"}`` → ``{"seconds": S}``; ``{"op": "snapshot"}`` →
  ``{"snapshot": id, "bytes": N, "seconds": S}`` (:mod:`orchestrator.runtime.snapshots`);
- ``{"op": "stop"}`` → the closed session's :class:`RunResult`; the owner then exits
  (waiting calls are declined first).

The final answer is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "<one
line>", "kind": "<exception class>", "exit_code": 125}``. Every operation goes through the
:class:`~orchestrator.runtime.session.Session` API, so policy and audit are the Python API's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.exits import Exit
from orchestrator.runtime.control import (
    SUFFIX,
    ControlError,
    _at,
    connect,
    control_dir,
    request,
    socket_name,
)
from orchestrator.runtime.session import Session
from orchestrator.sandbox import as_dict
from orchestrator.tools.waiting import Answered, PendingApprovals

log = logging.getLogger(__name__)

__all__ = [
    "APPROVAL_WAIT_S",
    "MAX_COPY",
    "MAX_REQUEST",
    "SUFFIX",
    "ControlError",
    "SessionServer",
    "connect",
    "control_dir",
    "request",
]

#: Largest file ``session cp`` carries either way.
MAX_COPY = 32 << 20
#: Largest request line (a copied file travels as base64 inside it).
MAX_REQUEST = MAX_COPY * 4 // 3 + (64 << 10)
#: How long a tool call waits for a person's answer unless the request says otherwise.
APPROVAL_WAIT_S = 600.0


def _connected(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` is still there (it sends nothing after its request: any
    readable state means it closed or reset the connection)."""
    poller = select.poll()
    poller.register(conn, select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return not poller.poll(0)


def describe(session: Session) -> dict[str, Any]:
    zones = sorted(session.files.grant.zones, key=lambda z: z.target)
    return {
        "id": session.id,
        "run_id": session.run_id,
        "worker": session.worker,
        "trust": session.trust,
        "zones": [{"path": z.target, "mode": z.mode} for z in zones],
        "pid": os.getpid(),
    }


class SessionServer:
    """Serves one session on its control socket until stopped, closed or timed out."""

    def __init__(self, session: Session, control_fd: int) -> None:
        self.session = session
        self.stop = threading.Event()
        self._fd = control_fd
        self._name = socket_name(session.id)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        existing = connect(control_fd, session.id)
        if existing is not None:
            existing.close()
            self._sock.close()
            raise ControlError(f"session {session.id} already has a live owner")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._name, dir_fd=control_fd)  # a dead owner's socket
        old = os.umask(0o177)
        try:
            self._sock.bind(_at(control_fd, self._name))
        finally:
            os.umask(old)
        os.chmod(self._name, 0o600, dir_fd=control_fd, follow_symlinks=False)
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._handlers: list[threading.Thread] = []
        self.approvals = PendingApprovals()
        self._toolset: Any = None

    def serve(self) -> None:
        """Answer connections until :attr:`stop` is set or the session closes by itself."""
        try:
            while not self.stop.is_set() and not self.session.closed:
                try:
                    conn, _ = self._sock.accept()
                except TimeoutError:
                    continue
                handler = threading.Thread(target=self._handle, args=(conn,), daemon=True)
                handler.start()
                self._handlers = [t for t in self._handlers if t.is_alive()] + [handler]
        finally:
            self.approvals.cancel_all()
            self.finish(2.0)
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._name, dir_fd=self._fd)

    def finish(self, wait_s: float) -> None:
        """Give answers in flight (a ``stop``'s) up to ``wait_s`` seconds to reach clients."""
        deadline = time.monotonic() + wait_s
        for handler in self._handlers:
            handler.join(max(0.0, deadline - time.monotonic()))

    # -- one connection -------------------------------------------------------------------

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if uid != os.geteuid():
                log.warning("refused a control connection from uid %s", uid)
                return
            send_lock = threading.Lock()

            def send(answer: dict[str, Any]) -> None:
                with send_lock:
                    conn.sendall(json.dumps(answer, default=str).encode() + b"\n")

            try:
                with conn.makefile("rb") as lines:
                    line = lines.readline(MAX_REQUEST + 1)
                if len(line) > MAX_REQUEST or not line.endswith(b"\n"):
                    raise ControlError(f"a request must be one line of at most {MAX_REQUEST} bytes")
                message = json.loads(line)
                if not isinstance(message, dict):
                    raise ControlError("a request must be a JSON object")
                result = self._dispatch(message, send, lambda: _connected(conn))
                send({"ok": True, "result": result})
                if message.get("op") == "stop":
                    self.stop.set()
            except OrchestratorError as exc:
                send({"ok": False, "error": str(exc).replace("\n", "; "),
                      "kind": type(exc).__name__, "exit_code": exc.exit_code})  # fmt: skip
            except (ValueError, TypeError, KeyError) as exc:
                send({"ok": False, "error": f"bad request: {exc}", "kind": "ControlError",
                      "exit_code": int(Exit.ERROR)})  # fmt: skip
            except OSError as exc:  # the client went away, or an operation failed
                with contextlib.suppress(OSError):
                    send({"ok": False, "error": f"failed: {exc}", "kind": "OSError",
                          "exit_code": 1})  # fmt: skip
            except Exception as exc:  # a client always hears an answer
                log.exception("session %s: a request failed", self.session.id)
                with contextlib.suppress(OSError):
                    send({"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}",
                          "kind": type(exc).__name__, "exit_code": int(Exit.ERROR)})  # fmt: skip

    def _dispatch(
        self,
        message: dict[str, Any],
        send: Callable[[dict[str, Any]], None],
        connected: Callable[[], bool] = lambda: True,
    ) -> Any:
        session = self.session
        op = message.get("op")
        if op == "info":
            return {**describe(session), "age_s": session.age_s, "idle_s": session.idle_s,
                    "closed": session.closed, "paused": session.paused}  # fmt: skip
        if op == "exec":
            argv = message["argv"]
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError("argv must be a non-empty list of strings")
            stdin = message.get("stdin")

            def output(stream: str, chunk: bytes) -> None:
                data = base64.b64encode(chunk).decode()
                with contextlib.suppress(OSError):
                    send({"event": "output", "stream": stream, "data": data})

            done = session.exec(
                argv,
                cwd=message.get("cwd"),
                env=message.get("env"),
                timeout=message.get("timeout"),
                stdin=base64.b64decode(stdin) if stdin is not None else None,
                on_output=output,
                resume=message.get("resume") is True,
            )
            return done.to_dict()
        if op == "read":
            limit = min(int(message.get("limit", MAX_COPY)), MAX_COPY)
            return base64.b64encode(session.read_bytes(str(message["path"]), limit)).decode()
        if op == "write":
            data = base64.b64decode(message["data"], validate=True)
            return as_dict(session.write(str(message["path"]), data))
        if op == "tool":
            args = message.get("args") or {}
            if not isinstance(args, dict):
                raise ValueError("args must be a JSON object")
            wait = float(message.get("wait", APPROVAL_WAIT_S))
            return self._tool(str(message["name"]), args, wait, send, connected)
        if op == "approvals":
            return [pending.to_dict() for pending in self.approvals.waiting()]
        if op == "answer":
            approve = message["approve"]
            if not isinstance(approve, bool):
                raise ValueError("approve must be true or false")
            answer = Answered(approve, str(message.get("by") or "unknown"),
                              str(message.get("via") or "control socket"))  # fmt: skip
            if self.approvals.answer(str(message["id"]), answer) is None:
                raise ControlError(
                    f"no call waits for approval '{message['id']}' in session {session.id} "
                    "(answered already, timed out, or never asked)"
                )
            return {"id": message["id"], "approve": approve}
        if op == "pause":
            return {"session": session.id, "paused": True, "seconds": session.pause()}
        if op == "resume":
            return {"session": session.id, "paused": False, "seconds": session.resume()}
        if op == "snapshot":
            snap = session.snapshot()
            return {"snapshot": snap.id, "bytes": snap.bytes, "seconds": snap.seconds,
                    "session": session.id, "worker": snap.worker}  # fmt: skip
        if op == "stop":
            self.approvals.cancel_all()
            return session.close().to_dict()
        raise ValueError(
            f"unknown op {op!r}; use info, exec, read, write, tool, approvals, answer, pause, "
            "resume, snapshot or stop"
        )

    def _tool(
        self,
        name: str,
        args: dict[str, Any],
        wait: float,
        send: Callable[[dict[str, Any]], None],
        connected: Callable[[], bool],
    ) -> Any:
        """One tool call; one that needs approval waits here for a person's answer, while
        its caller is still connected (a call nobody waits for is never run).

        The whole call counts as an operation of the session, from its arrival: the idle
        timeout does not close the session between a call's arrival and its wait for a
        person (making the toolset and deciding whether it asks took longer than a short
        idle timeout on a loaded machine)."""
        with self.session.waiting():
            return self._tool_call(name, args, wait, send, connected)

    def _tool_call(
        self,
        name: str,
        args: dict[str, Any],
        wait: float,
        send: Callable[[dict[str, Any]], None],
        connected: Callable[[], bool],
    ) -> Any:
        from orchestrator.tools import InvalidArguments, Toolset

        if self._toolset is None:
            self._toolset = Toolset(self.session)
        tools: Toolset = self._toolset
        try:
            decision = tools.needs_approval(name, args)
        except InvalidArguments:
            return tools.call(name, args)  # answered (and audited) as invalid arguments
        if decision.status != "needs_approval":
            return tools.call(name, args)

        def listed(pending: Any) -> None:
            with contextlib.suppress(OSError):
                send({"event": "waiting", "approval": pending.to_dict()})

        pending, answer = self.approvals.ask(
            name, args, decision.description, timeout=wait, on_waiting=listed,
            still_wanted=connected,
        )  # fmt: skip
        if answer is None:
            why = f"not answered within {wait:g} s" if connected() else "the caller went away"
            answer = Answered(False, "nobody", why)
        if tools.audit is not None:
            tools.audit.record(
                "tool.approval",
                allowed=answer.approve,
                reason=decision.description,
                worker=self.session.worker,
                run_id=self.session.run_id,
                session_id=self.session.id,
                trust_level=self.session.trust,
                path=args.get("path") if isinstance(args.get("path"), str) else None,
                metadata={
                    "tool": name,
                    "request": pending.id,
                    "decision": "approved" if answer.approve else "declined",
                    "by": answer.by,
                    "via": answer.via,
                },
            )
        if not answer.approve or self.session.closed:
            return tools.decline(name, args, decision)
        return tools.call(name, args, approved=True)
