"""The broker: how a running worker asks the host for a child worker.

A parent whose grant lists ``children`` gets one narrow request channel: a unix socket in a
folder of its own, mounted read-only at ``/run/orchestrator``. Containers never get the
Docker socket. For each request the host checks that the child is in the parent's
``children:`` list, computes the child's grant with the parent's as ceiling, checks that
every attachment is readable in both grants, runs the child in its own disposable container
(which may, in turn, get a broker of its own), and answers with the child's result. Every
call and every refusal goes to the audit log with its reason: a request that is no JSON
object, too big, too deep, or too slow to come (``bad request: ...``), one that names no
child or attachments of the wrong type, a child or attachment the policy refuses, and a call
beyond :data:`MAX_CONCURRENT` at once. Past :data:`MAX_AUDITED_REFUSALS` in one parent run,
refusals are counted and the count recorded once at the end (``broker.flood``); the
parent's strings in an entry are cut to a bounded length.

Protocol: the client sends one JSON line ``{"child": NAME, "attach": [PATH, ...]}`` and
reads one JSON line back: ``{"ok": true, "run_id", "exit_code", "status", "stdout",
"stderr"}`` or ``{"ok": false, "error": MESSAGE}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeGuard

from orchestrator.audit import AuditLog
from orchestrator.config import load_worker
from orchestrator.errors import OrchestratorError, PolicyError
from orchestrator.policy import RunPaths, ZoneView, restrict
from orchestrator.prepare import Prepared, compile_prepared, new_id

log = logging.getLogger(__name__)

SOCKET_NAME = "broker.sock"
MAX_REQUEST = 64 << 10
MAX_DEPTH = 4
#: Child calls one parent may have in flight; more are refused at once.
MAX_CONCURRENT = 4
#: Seconds a client has to send its whole request line.
READ_TIMEOUT = 10.0
#: Refusals recorded one by one per parent run; past that they are only counted, and the
#: count is recorded once when the broker closes (``broker.flood``): a parent looping on bad
#: requests cannot fill the audit log.
MAX_AUDITED_REFUSALS = 100
#: Characters of a request's strings (the child's name, each attachment, a reason) and
#: attachments per entry kept in the audit log.
AUDIT_TEXT = 256
AUDIT_ATTACHMENTS = 20
#: Seconds to wait for cancelled children's threads to wind down.
CANCEL_GRACE = 10.0
RunChild = Callable[[Prepared, int], Any]


class Broker:
    """Serves one parent run's request socket until :meth:`close`."""

    def __init__(
        self,
        parent: Prepared,
        *,
        depth: int,
        run_child: RunChild,
        cancel_child: Callable[[str], None],
        audit: AuditLog | None,
    ) -> None:
        self.parent = parent
        self.depth = depth
        self.run_child = run_child
        self.cancel_child = cancel_child
        self.audit = audit
        self.path = parent.paths.broker_dir / SOCKET_NAME
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._refusals = 0
        #: A child may only use what is left of its parent's time.
        self.deadline = time.monotonic() + parent.grant.limits.timeout

    def start(self) -> None:
        if self.path.exists():
            self.path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Socket paths are limited to 108 bytes; bind through a directory fd instead.
        folder = os.open(self.path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            server.bind(f"/proc/self/fd/{folder}/{SOCKET_NAME}")
        finally:
            os.close(folder)
        os.chmod(self.path, 0o600)
        if os.getuid() == 0:
            os.chown(self.path, self.parent.uid, self.parent.gid)
        server.listen(8)
        self._server = server
        thread = threading.Thread(target=self._accept, name="broker", daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self, *, cancel: bool = False) -> None:
        """Stop accepting. In-flight children finish within their own timeouts, or, with
        ``cancel`` (the parent was interrupted or failed), have their containers removed."""
        self._closing.set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
        if cancel:
            with self._lock:
                running = list(self._in_flight)
            for run_id in running:
                self.cancel_child(run_id)
        wait = CANCEL_GRACE if cancel else self.parent.grant.limits.timeout
        for thread in self._threads:
            thread.join(timeout=wait)
        self.path.unlink(missing_ok=True)
        with self._lock:
            refused = self._refusals
        if refused > MAX_AUDITED_REFUSALS:
            self._record(
                "broker.flood",
                False,
                None,
                reason=f"{refused} requests refused; the first {MAX_AUDITED_REFUSALS} are "
                "recorded one by one (broker.refused), the rest only counted",
                refused=refused,
                recorded=MAX_AUDITED_REFUSALS,
            )

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closing.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                with conn:
                    conn.settimeout(1)
                    try:  # read it first, so closing does not reset the client
                        request: dict[str, Any] = _read_request(conn)
                    except (OSError, ValueError):
                        request = {}
                    busy = f"more than {MAX_CONCURRENT} child calls at once; wait for one"
                    _send(conn, self._refused(busy, request.get("child")))
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        finally:
            self._slots.release()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(READ_TIMEOUT)
            try:
                request = _read_request(conn)
            except (OSError, ValueError) as exc:  # a timeout, not JSON, too big or too deep
                _send(conn, self._refused(f"bad request: {str(exc) or type(exc).__name__}", None))
                return
            conn.settimeout(None)
            _send(conn, self.handle(request))

    def _refused(self, reason: str, child: object, **fields: Any) -> dict[str, Any]:
        """Audit one refusal with its reason (every one, whatever was wrong with the
        request); the answer the client gets."""
        name = child if isinstance(child, str) else None
        with self._lock:
            self._refusals += 1
            one_by_one = self._refusals <= MAX_AUDITED_REFUSALS
        if one_by_one:
            self._record("broker.refused", False, name, reason=reason, **fields)
        return {"ok": False, "error": reason}

    def _record(self, operation: str, allowed: bool, child: str | None, **fields: Any) -> None:
        if self.audit is None:
            return
        spec = self.parent.spec
        reason = fields.pop("reason", None)
        if "attach" in fields:  # the parent's strings, bounded
            attach = fields["attach"]
            fields["attach"] = [_short(path) for path in attach[:AUDIT_ATTACHMENTS]]
            if len(attach) > AUDIT_ATTACHMENTS:
                fields["attachments"] = len(attach)
        self.audit.record(
            operation,
            allowed=allowed,
            reason=None if reason is None else _short(reason, 4 * AUDIT_TEXT),
            worker=spec.worker,
            run_id=spec.run_id,
            session_id=spec.session_id,
            trust_level=spec.trust,
            metadata={"child": None if child is None else _short(child), **fields},
        )

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Check and run one child request; never raises for a refusal."""
        name = request.get("child")
        attach = request.get("attach", [])
        if not isinstance(name, str) or not _paths(attach):
            reason = "request needs 'child' (a name) and 'attach' (a list of paths)"
            return self._refused(reason, name)
        try:
            child = self._prepare_child(name, attach)
        except OrchestratorError as exc:
            return self._refused(str(exc), name, attach=attach)
        self._record("broker.call", True, name, child_run=child.spec.run_id, attach=attach)
        run_id = child.spec.run_id
        with self._lock:
            self._in_flight.add(run_id)
        try:
            result = self.run_child(child, self.depth + 1)
        except OrchestratorError as exc:
            self._record("broker.failed", False, name, reason=str(exc))
            return {"ok": False, "error": str(exc)}
        finally:
            with self._lock:
                self._in_flight.discard(run_id)
        return {
            "ok": True,
            "run_id": child.spec.run_id,
            "exit_code": result.exit_code,
            "status": result.status,
            "stdout": result.stdout,
            "stderr": result.stderr,
        }

    def _prepare_child(self, name: str, attach: list[str]) -> Prepared:
        parent = self.parent
        parent_name = parent.spec.worker
        if name not in parent.grant.children:
            allowed = ", ".join(parent.grant.children) or "none"
            raise PolicyError(
                [f"parent '{parent_name}' may not call '{name}' (its children: {allowed})"]
            )
        if self.depth + 1 > MAX_DEPTH:
            raise PolicyError([f"child calls nest deeper than {MAX_DEPTH}; refusing '{name}'"])
        project = parent.project
        child = load_worker(project, name)
        run_id = new_id()
        paths = RunPaths.of(
            project,
            session_id=parent.session_id,
            workspace=parent.paths.workspace.name,
            run_id=run_id,
        )
        grant = restrict(parent.grant, parent_name, project, child, paths)
        for path in attach:
            ZoneView(parent.grant).check_read(path)
            try:
                ZoneView(grant).check_read(path)
            except PolicyError as exc:
                raise PolicyError(
                    [f"attachment '{path}' is not readable by child '{name}': {exc}"]
                ) from None
        prepared = compile_prepared(
            project, child, grant, paths, run_id=run_id, session_id=parent.session_id
        )
        env = {
            **prepared.spec.env,
            "ORCHESTRATOR_PARENT_RUN": parent.spec.run_id,
            "ORCHESTRATOR_ATTACHMENTS": json.dumps(attach),
        }
        left = max(1.0, round(self.deadline - time.monotonic(), 1))
        limits = replace(prepared.spec.limits, timeout_s=min(prepared.spec.limits.timeout_s, left))
        return replace(prepared, spec=replace(prepared.spec, env=env, limits=limits))


def _paths(attach: object) -> TypeGuard[list[str]]:
    return isinstance(attach, list) and all(isinstance(path, str) for path in attach)


def _short(text: str, limit: int = AUDIT_TEXT) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _send(conn: socket.socket, answer: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(answer).encode() + b"\n")


def _read_request(conn: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError("request larger than 64 KiB")
    try:
        request = json.loads(data.decode("utf-8"))
    except RecursionError:  # e.g. 64 KiB of '[': the parser recurses once per level
        raise ValueError("request nested too deeply") from None
    except UnicodeDecodeError:
        raise ValueError("request is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"request is not JSON ({exc.msg} at byte {exc.pos})") from None
    except ValueError:  # the only other: an integer of more digits than Python converts
        raise ValueError("request holds an integer too long to read") from None
    if not isinstance(request, dict):
        raise ValueError("request must be a JSON object")
    return request
