"""The E2B sandboxes: each one a session of the project (blocking; engine calls).

A template names a worker of the project (``base``: the worker named ``base``, which
the project must have). The session is opened, used and closed through the library's
own API (:meth:`~orchestrator.runner.Orchestrator.open_session`), so it is the hardened
container any session of that worker gets, audited the same way. E2B's timeout (how
long until the sandbox is killed, set again by ``set_timeout``) is kept here and a
thread closes the sessions whose time is up; the session's own ``max_lifetime`` bounds
it as for any session.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.e2b.wire import ENVD_VERSION
from orchestrator.errors import OrchestratorError
from orchestrator.integrations.projects import one_line, orchestrator_for
from orchestrator.runtime.session import Session

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_TIMEOUT", "MAX_TIMEOUT", "Refused", "Sandbox", "Sandboxes", "Watcher"]

#: E2B's default sandbox timeout (seconds) when a create gives none.
DEFAULT_TIMEOUT = 300
#: The longest timeout a sandbox may be given (seconds): E2B's own ceiling (24 hours).
MAX_TIMEOUT = 24 * 3600


class Refused(Exception):
    """A request this server will not do, with the HTTP status and the one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Watcher:
    """A watched folder: what was in it at the last look (path → kind, size, mtime)."""

    path: str
    depth: int
    seen: dict[str, tuple[str, int, float]]


@dataclass
class Sandbox:
    """One E2B sandbox: its session, the token its in-sandbox calls carry, its times."""

    id: str
    template: str
    session: Session
    token: str
    metadata: dict[str, str]
    started: float
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_pid: int = 1000
    running: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The commands running now, by the pid the SDK was told: their ``ProcessConfig``."""
    watchers: dict[str, Watcher] = field(default_factory=dict)
    """The folders watched (``files.watch_dir``), by watcher id."""
    processes: dict[int, Any] = field(default_factory=dict)
    """The commands running now, by pid: their :class:`~orchestrator.e2b.processes.Process`."""

    def pid(self) -> int:
        with self.lock:
            self.next_pid += 1
            return self.next_pid

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def detail(self) -> dict[str, Any]:
        """E2B's ``SandboxDetail`` / ``ListedSandbox`` of it."""
        spec = self.session.spec
        return {
            "templateID": self.template,
            "alias": self.template,
            "sandboxID": self.id,
            "clientID": "orchestrator",
            "startedAt": _iso(self.started),
            "endAt": _iso(self.deadline),
            "envdVersion": ENVD_VERSION,
            "cpuCount": max(1, round(spec.limits.cpus)),
            "memoryMB": spec.limits.memory >> 20,
            "diskSizeMB": 0,
            "state": "paused" if self.session.paused else "running",
            "metadata": dict(self.metadata),
        }


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def timeout_of(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TIMEOUT:
        raise Refused(
            400, f"timeout: {value!r} must be a whole number of seconds, 1 to {MAX_TIMEOUT}"
        )
    return value


class Sandboxes:
    """The server's live sandboxes, over the project at ``project_dir``."""

    def __init__(self, project_dir: Path) -> None:
        self.project_dir = project_dir
        self._lock = threading.Lock()
        self._live: dict[str, Sandbox] = {}
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="e2b-timeouts", daemon=True)
        self._reaper.start()

    # -- lifecycle ------------------------------------------------------------------------

    def create(self, body: dict[str, Any]) -> Sandbox:
        """Open a session of the template's worker (``POST /v2/sandboxes``)."""
        template = body.get("templateID")
        if not isinstance(template, str) or not template:
            raise Refused(400, "templateID: give a worker's name of the project")
        timeout = timeout_of(body.get("timeout"), DEFAULT_TIMEOUT)
        metadata = body.get("metadata") or {}
        envs = body.get("envVars") or {}
        for name, value in (("metadata", metadata), ("envVars", envs)):
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise Refused(400, f"{name}: give an object of strings")
        refuse_unsupported(body)
        orch = orchestrator_for(self.project_dir)
        names = _worker_names(orch.project)
        if template not in names:
            hint = (
                "the project has no worker named 'base': add workers/base.worker (the "
                "worker E2B's default template runs)"
                if template == "base"
                else f"the project's workers are: {', '.join(sorted(names)) or 'none'}"
            )
            raise Refused(400, f"template {template!r} is not a worker of the project; {hint}")
        try:
            prepared = orch.prepare(template, env=envs)
            prepared = _narrowed(orch, prepared, template, envs, body)
            session = orch.open_session(prepared, idle_timeout=None, max_lifetime=MAX_TIMEOUT)
        except OrchestratorError as exc:
            raise Refused(400, f"template {template!r}: {one_line(exc)}") from None
        return self.add(session, template, metadata, timeout)

    def add(
        self, session: Session, template: str, metadata: dict[str, str], timeout: int
    ) -> Sandbox:
        """Serve an open ``session`` as a sandbox of ``template`` (a create, a fork)."""
        now = time.time()
        sandbox = Sandbox(
            id=session.id,
            template=template,
            session=session,
            token=secrets.token_urlsafe(32),
            metadata=dict(metadata),
            started=now,
            deadline=now + timeout,
        )
        with self._lock:
            self._live[sandbox.id] = sandbox
        return sandbox

    def get(self, sandbox_id: str) -> Sandbox:
        with self._lock:
            sandbox = self._live.get(sandbox_id)
        if sandbox is None or sandbox.session.closed:
            raise Refused(404, f"sandbox {sandbox_id!r} not found")
        return sandbox

    def find(self, sandbox_id: str) -> Sandbox | None:
        with self._lock:
            return self._live.get(sandbox_id)

    def all(self) -> list[Sandbox]:
        with self._lock:
            return [s for s in self._live.values() if not s.session.closed]

    def set_timeout(self, sandbox_id: str, timeout: Any) -> None:
        seconds = timeout_of(timeout, DEFAULT_TIMEOUT)
        sandbox = self.get(sandbox_id)
        sandbox.deadline = time.time() + seconds

    def kill(self, sandbox_id: str) -> None:
        with self._lock:
            sandbox = self._live.pop(sandbox_id, None)
        if sandbox is None:
            raise Refused(404, f"sandbox {sandbox_id!r} not found")
        _close(sandbox)

    def close(self) -> None:
        """Kill every sandbox (the server is stopping)."""
        self._stop.set()
        with self._lock:
            live, self._live = list(self._live.values()), {}
        for sandbox in live:
            _close(sandbox)

    def _reap(self) -> None:
        while not self._stop.wait(1.0):
            now = time.time()
            with self._lock:
                due = [
                    s
                    for s in self._live.values()
                    if (s.deadline <= now and not s.session.paused) or s.session.closed
                ]
                for sandbox in due:
                    del self._live[sandbox.id]
            for sandbox in due:
                _close(sandbox)


def _worker_names(project: Any) -> set[str]:
    """The names of the project's workers (a template is one of them, never a path)."""
    from orchestrator.config.loader import WORKER_SUFFIX

    folder = project.workers_dir
    if not folder.is_dir():
        return set()
    return {p.name[: -len(WORKER_SUFFIX)] for p in folder.glob(f"*{WORKER_SUFFIX}")}


def refuse_unsupported(body: dict[str, Any]) -> None:
    """The create options this slice does not map yet, refused rather than ignored."""
    problems = []
    for name in ("mcp", "volumeMounts", "iam"):
        if body.get(name):
            problems.append(f"{name}: not supported (docs/e2b.md)")
    if body.get("autoPause"):
        problems.append(
            "lifecycle on_timeout 'pause': a sandbox is killed when its timeout passes "
            "(pause it with Sandbox.pause)"
        )
    if problems:
        raise Refused(400, "; ".join(problems))


def _narrowed(
    orch: Any, prepared: Any, template: str, envs: dict[str, str], body: dict[str, Any]
) -> Any:
    """``prepared``, or the worker prepared again with the narrower network the create
    asks for (:mod:`orchestrator.e2b.network`), judged by the project's rules as any."""
    from dataclasses import replace

    from orchestrator.config.loader import load_worker
    from orchestrator.config.models import Allowlist
    from orchestrator.e2b.network import NetworkRefused, narrowed

    spec = prepared.spec.network
    try:
        chosen = narrowed(body, template, spec.mode, list(spec.allow))
    except NetworkRefused as exc:
        raise Refused(400, str(exc)) from None
    if chosen is None:
        return prepared
    network = chosen if isinstance(chosen, str) else Allowlist(allow=chosen)
    worker = load_worker(orch.project, template)
    worker = replace(worker, config=worker.config.model_copy(update={"network": network}))
    return orch.prepare(worker, env=envs)


def _close(sandbox: Sandbox) -> None:
    try:
        sandbox.session.close()
    except (OrchestratorError, OSError) as exc:
        log.warning(
            "closing sandbox %s failed: %s (orchestrator gc removes what is left)",
            sandbox.id,
            exc,
        )
