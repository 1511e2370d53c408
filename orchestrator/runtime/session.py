"""A live sandbox: one idling container for one worker declaration, driven step by step.

A :class:`Session` is opened by :meth:`orchestrator.Orchestrator.open_session`. Its
container has exactly the plan, hardening, zones, trust, network and limits a run of the
same worker would get, but the worker's command is not run: :meth:`Session.exec` runs
commands in it as the worker's uid, and the file operations (:meth:`~Session.read`,
:meth:`~Session.write`, :meth:`~Session.list`, ...) act on the same zones from the host,
through :class:`orchestrator.sandbox.SandboxFiles` (no link is ever followed). Every
operation, allowed or refused, is an audit entry carrying the session id.

What the session writes to ``/staged`` becomes a pending change set when it closes, like a
run's outbox; :meth:`Session.stage` makes one at once from chosen files. The session is
closed by :meth:`Session.close` (or leaving its ``with`` block), after its idle timeout, and
after its maximum lifetime; the container is removed on every one of these paths, and by
``orchestrator gc`` if the owning process is killed.
"""

from __future__ import annotations

import builtins
import logging
import posixpath
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

from orchestrator.errors import OrchestratorError, PolicyError
from orchestrator.escaping import escape_surrogates
from orchestrator.plan import ContainerSpec
from orchestrator.runtime.engine import Stream
from orchestrator.runtime.execs import ExecResult, exec_request
from orchestrator.runtime.run import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_LIFETIME, Run, RunResult
from orchestrator.runtime.secrets import RedactingSink
from orchestrator.runtime.supervised import TOOL_ENV
from orchestrator.sandbox import (
    DeleteResult,
    FileStat,
    Listing,
    ReadResult,
    Resolved,
    SandboxError,
    SandboxFiles,
    WriteResult,
)

log = logging.getLogger(__name__)

__all__ = ["Session", "SessionClosed", "SessionPaused"]

#: Largest file a host-side write to ``/staged`` may put into the outbox in one call.
MAX_STAGED_WRITE = 64 << 20


class SessionClosed(OrchestratorError):
    """The session is closed (by its owner, its idle timeout or its maximum lifetime)."""


class SessionPaused(OrchestratorError):
    """The session is paused: its processes are frozen until it is resumed."""


class Session:
    """One live sandbox. Use it as a context manager, or call :meth:`close`."""

    def __init__(self, run: Run, *, idle_timeout: float | None, max_lifetime: float | None) -> None:
        prepared = run.prepared
        self._run = run
        self.id = prepared.session_id
        self.run_id = prepared.spec.run_id
        self.worker = prepared.spec.worker
        self.trust = prepared.spec.trust
        self.idle_timeout = idle_timeout
        self.max_lifetime = max_lifetime
        self.files = SandboxFiles(
            prepared.grant,
            owner=(prepared.uid, prepared.gid),
            audit=run.audit,
            session_id=self.id,
            worker=self.worker,
            outbox=_Outbox(self),
            identities=run.sources.identities(),
        )
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_used = self._opened = time.monotonic()
        self._closed_because: str | None = None
        self._result: RunResult | None = None
        self._stop = threading.Event()
        self._closing = False
        self._detached = False
        self._done = threading.Event()
        self._paused = False
        self._paused_at = 0.0
        config = getattr(getattr(prepared, "worker", None), "config", None)
        self.idle_mode: str = getattr(config, "idle", "stop")
        """What the idle timeout does: ``stop`` (close) or ``pause`` (the worker's ``idle``)."""
        self.stop_paused_after: float = float(getattr(config, "stop_paused_after", 3600.0))
        self.checkpoints = bool(getattr(config, "checkpoints", False))
        """Whether the ``checkpoint`` and ``branch`` tools may snapshot and fork it (the
        worker's ``checkpoints``)."""
        """With ``idle: pause``: seconds paused before it is snapshotted and closed."""
        self._branched = 0
        self.orchestrator: Any = None
        """The :class:`~orchestrator.Orchestrator` that opened it (a snapshot's forks use it)."""
        self._watchdog: threading.Thread | None = None
        if idle_timeout is not None or max_lifetime is not None or self.idle_mode == "pause":
            self._watchdog = threading.Thread(
                target=self._watch, name=f"session-{self.id}", daemon=True
            )
            self._watchdog.start()

    # -- files (host side) ----------------------------------------------------------------

    def read(self, path: str, offset: int | None = None, limit: int | None = None) -> ReadResult:
        with self._active():
            return self.files.read(path, offset, limit)

    def read_bytes(self, path: str, limit: int) -> bytes:
        """A regular file's raw bytes, refused when larger than ``limit`` (for copies)."""
        with self._active():
            return self.files.read_bytes(path, limit)

    def write(self, path: str, content: str | bytes, append: bool = False) -> WriteResult:
        with self._active():
            return self.files.write(path, content, append=append)

    def delete(self, path: str) -> DeleteResult:
        with self._active():
            return self.files.delete(path)

    def list(self, path: str = "/") -> Listing:
        with self._active():
            return self.files.list(path)

    def stat(self, path: str) -> FileStat:
        with self._active():
            return self.files.stat(path)

    def exists(self, path: str) -> bool:
        with self._active():
            return self.files.exists(path)

    def can_read(self, path: str) -> bool:
        with self._active():
            return self.files.can_read(path)

    def can_write(self, path: str, size: int | None = None) -> bool:
        with self._active():
            return self.files.can_write(path, size)

    def resolve(self, path: str) -> Resolved:
        with self._active():
            return self.files.resolve(path)

    def security_context(self) -> dict[str, Any]:
        with self._active():
            context = self.files.security_context()
            context["session"] = {
                "id": self.id,
                "run_id": self.run_id,
                "idle_timeout_s": self.idle_timeout,
                "max_lifetime_s": self.max_lifetime,
                "checkpoints": self.checkpoints,
            }
            return context

    # -- commands (inside the container) --------------------------------------------------

    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        on_output: Callable[[Stream, bytes], None] | None = None,
        user: str | None = None,
        resume: bool = False,
    ) -> ExecResult:
        """Run ``command`` in the sandbox as the worker's uid; a string runs under
        ``/bin/sh -c``. ``timeout`` (default: the worker's own timeout) kills the command's
        whole process tree; output is captured (capped) and may also be streamed. ``user``
        (a name or ``uid[:gid]`` of the image's) only for a run as the image's user
        (``image_user``): any other run's commands are the worker's. On a paused session
        the call is refused (:class:`SessionPaused`), unless ``resume`` asks to
        :meth:`resume` it first."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        run = self._run
        spec = run.spec
        if user is not None and not spec.image_user and user != spec.user:
            raise PolicyError(
                [f"Cannot run as user {user!r}: commands run as the worker ({spec.user}); "
                 "another user needs image_user (gVisor)"]
            )  # fmt: skip
        values = {**run.values, **run.egress_values}
        sink = RedactingSink(on_output, values) if on_output and run.redactor else on_output
        if resume and self._paused:
            with suppress(SessionPaused):  # resumed by another caller meanwhile: go on
                self.resume()
        with self._active():
            try:
                request = exec_request(
                    argv,
                    user=user or spec.user,
                    base_env=spec.env,
                    env=env,
                    cwd=cwd or spec.workdir,
                    timeout=spec.limits.timeout_s if timeout is None else timeout,
                    stdin=stdin.encode() if isinstance(stdin, str) else stdin,
                )
                result = run.live.exec(request, sink)
            except OrchestratorError as exc:
                self._record("session.exec", False, argv=argv, reason=str(exc))
                raise
            finally:
                if isinstance(sink, RedactingSink):
                    sink.flush()
            result = _redacted(result, run)
            self._record(
                "session.exec",
                True,
                argv=argv,
                exit_code=result.exit_code,
                timed_out=result.timed_out,
                duration_s=result.duration_s,
            )
            return result

    # -- pause, resume, snapshot ---------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self, *, reason: str | None = None) -> float:
        """Freeze every process of the sandbox (they use no CPU) until :meth:`resume`;
        other calls are refused meanwhile, and the idle timeout does not run (the maximum
        lifetime does). Seconds it took; audited as ``session.pause`` (with ``reason``:
        why, when not asked for)."""
        from orchestrator.runtime.snapshots import engine_of

        with self._active():
            engine, container = engine_of(self._run.live, "pause")
            started = time.monotonic()
            with self._lock:
                if self._paused:
                    raise SessionPaused(f"session {self.id} is paused already")
                engine.pause(container)
                self._paused = True
                self._paused_at = time.monotonic()
            took = round(time.monotonic() - started, 3)
        self._record("session.pause", True, seconds=took, why=reason or "asked")
        return took

    def resume(self) -> float:
        """Let a paused session's processes go on where they were; seconds it took;
        audited as ``session.resume``."""
        from orchestrator.runtime.snapshots import engine_of

        with self._lock:
            if self._closed_because is not None:
                raise SessionClosed(
                    f"session {self.id} is closed ({self._closed_because}); open a new one"
                )
            if not self._paused:
                raise SessionPaused(f"session {self.id} is not paused; nothing to resume")
            engine, container = engine_of(self._run.live, "resume")
            started = time.monotonic()
            engine.unpause(container)
            self._paused = False
            self._last_used = time.monotonic()  # idling counts from now
        took = round(time.monotonic() - started, 3)
        self._record("session.resume", True, seconds=took)
        return took

    def snapshot(self) -> Any:
        """Save the sandbox's own state (root, tmpfs folders, session folders, recipe) as a
        :class:`~orchestrator.runtime.snapshots.Snapshot` of this project; audited as
        ``session.snapshot``. Its :meth:`~orchestrator.runtime.snapshots.Snapshot.fork`
        starts sessions from it."""
        from orchestrator.runtime.snapshots import take

        with self._active():
            try:
                snap = take(self)
            except OrchestratorError as exc:
                self._record("session.snapshot", False, reason=str(exc))
                raise
        self._record(
            "session.snapshot", True, snapshot=snap.id, bytes=snap.bytes, seconds=snap.seconds
        )
        return snap

    def fork(self, count: int = 1, **options: Any) -> builtins.list[Session]:
        """Snapshot this session, then start ``count`` sessions from the snapshot
        (:meth:`~orchestrator.runtime.snapshots.Snapshot.fork`); the snapshot stays in the
        project's list."""
        forks: builtins.list[Session] = self.snapshot().fork(count, **options)
        return forks

    def branch(
        self,
        count: int = 1,
        snapshot: str | None = None,
        *,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_lifetime: float | None = DEFAULT_MAX_LIFETIME,
    ) -> dict[str, Any]:
        """Start ``count`` (1 to :data:`~orchestrator.runtime.owners.BRANCH_AT_ONCE`)
        sessions from a checkpoint of this one: ``snapshot`` (an id this session took) or a
        snapshot taken now. Unlike :meth:`fork`, each fork is held by an owner process of its
        own (as ``orchestrator session fork`` starts them), so it outlives this session and
        its caller: reach it with ``orchestrator session exec/cp/stop ID``. At most
        :data:`~orchestrator.runtime.owners.BRANCH_LIMIT` forks over this session's life.
        ``{"sessions": [ids], "snapshot": id, "seconds": S}``; audited as
        ``session.branch`` here and ``session.fork`` by each fork."""
        from orchestrator.runtime.owners import BRANCH_AT_ONCE, BRANCH_LIMIT, start_forks
        from orchestrator.runtime.snapshots import SnapshotError, get

        started = time.monotonic()
        try:
            if self.orchestrator is None:
                raise SnapshotError(
                    f"session {self.id} was not opened through an Orchestrator; it cannot branch"
                )
            if not 1 <= count <= BRANCH_AT_ONCE:
                raise SnapshotError(f"count {count}: give 1 to {BRANCH_AT_ONCE} forks")
            with self._lock:
                if self._branched + count > BRANCH_LIMIT:
                    raise PolicyError(
                        [f"session {self.id} has started {self._branched} fork(s) already, "
                         f"and may start at most {BRANCH_LIMIT}: stop using it and ask a "
                         "person (`orchestrator session fork`)"]
                    )  # fmt: skip
                self._branched += count  # held while they start: calls at once share it
            try:
                with self._active():
                    if snapshot is None:
                        snap = self.snapshot()
                    else:
                        snap = get(self.orchestrator.project, snapshot, self.orchestrator)
                        if snap.session != self.id:
                            raise PolicyError(
                                [f"snapshot {snapshot} is not a checkpoint of session {self.id} "
                                 f"(it is session {snap.session}'s): give an id this session's "
                                 "checkpoint answered, or none to checkpoint now"]
                            )  # fmt: skip
                    options = {"idle_timeout": idle_timeout, "max_lifetime": max_lifetime}
                    made = start_forks(
                        self.orchestrator.project, snap.worker, snap.id, count, options
                    )
            except BaseException:
                with self._lock:
                    self._branched -= count
                raise
        except OrchestratorError as exc:
            self._record("session.branch", False, reason=str(exc).replace("\n", "; "),
                         snapshot=snapshot, count=count)  # fmt: skip
            raise
        took = round(time.monotonic() - started, 3)
        self._record("session.branch", True, snapshot=snap.id, sessions=made, count=count,
                     seconds=took)  # fmt: skip
        return {"sessions": made, "snapshot": snap.id, "seconds": took}

    # -- review ---------------------------------------------------------------------------

    def stage(self, files: Sequence[str], message: str) -> str:
        """Put these sandbox files (or folders) into a pending change set now; its id.

        Each is staged under its own name (``/session/out/report.md`` → ``report.md``), so
        two with the same name are refused. The files are read inside the container and
        checked on the host like any outbox (links, devices, sizes and names refused).
        """
        if not files:
            raise SandboxError("Nothing to stage: name one or more files, e.g. /session/report.md")
        if not message.strip():
            raise SandboxError("A change set needs a message saying what it holds")
        run = self._run
        with self._active():
            entries: list[tuple[str, str]] = []
            names: dict[str, str] = {}
            for path in files:
                if escape_surrogates(path) != path:  # tar would never find it by this name
                    raise SandboxError(
                        f"Cannot stage '{path}': its name is not valid UTF-8, and change sets "
                        "hold UTF-8 names only; rename it to a UTF-8 name, then stage that"
                    )
                clean = posixpath.normpath(path)
                if not self.files.can_read(path):
                    self.files.resolve(path)  # raises the guiding refusal
                if not self.files.exists(path):
                    raise SandboxError(f"Cannot stage '{path}': it does not exist")
                folder, name = posixpath.split(clean)
                if not folder.startswith("/") or name in {"", ".", ".."}:
                    raise SandboxError(
                        f"Cannot stage '{path}': name a file or folder inside a zone, e.g. "
                        "/session/report.md"
                    )
                if name in names:
                    raise SandboxError(
                        f"Cannot stage '{path}' and '{names[name]}' together: both are "
                        f"named '{name}'; stage them in two change sets"
                    )
                names[name] = path
                entries.append((folder, name))
            if run.staging is None:
                raise SandboxError("This session has no change store to stage into")
            with run.live.archive(entries) as stream:
                staged = run.staging.outbox(run.spec, stream, message=message)
            change_id = getattr(staged, "change_id", None)
            rejected = getattr(staged, "rejected", [])
            self._record(
                "session.stage", change_id is not None, files=list(files), change_id=change_id
            )
            if change_id is None or getattr(staged, "files", 0) == 0:
                reasons = "; ".join(f"{r['path']}: {r['reason']}" for r in rejected)
                raise SandboxError(f"Nothing was staged: {reasons or 'the files were empty'}")
            return str(change_id)

    # -- closing --------------------------------------------------------------------------

    @property
    def idle_s(self) -> float:
        """Seconds since the last operation ended (0 while one is running)."""
        with self._lock:
            return 0.0 if self._in_flight else time.monotonic() - self._last_used

    @property
    def age_s(self) -> float:
        return time.monotonic() - self._opened

    @property
    def closed(self) -> bool:
        return self._closed_because is not None

    @property
    def spec(self) -> ContainerSpec:
        """The plan this session's container has (its user, working folder, zones, limits);
        read-only."""
        return self._run.spec

    def close(self) -> RunResult:
        """Stage ``/staged`` and ``ask`` zones, remove the container; the run's result."""
        return self._close("closed by its owner")

    def detach(self) -> None:
        """Leave the container running after this process ends, for a person to look into
        (an eval harness's "keep the sandbox"). The session takes no more operations, no
        timeout closes it, and closing it is refused; ``orchestrator gc`` removes the
        container and the run's folders once this process has ended. Its outbox and ``ask``
        zones are never staged."""
        with self._lock:
            if self._closing or self._result is not None:
                raise SessionClosed(f"session {self.id} is already closed; nothing to keep")
            self._detached = True
            self._closed_because = "detached: left for `orchestrator gc`"
        self._stop.set()
        self._record("session.detached", True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close("closed by its owner" if kind is None else f"closed on {kind.__name__}")

    def _close(self, because: str) -> RunResult:
        with self._lock:
            if self._detached:
                raise SessionClosed(
                    f"session {self.id} was detached: its container is left for `orchestrator gc`"
                )
            if self._result is not None:
                return self._result
            closing = self._closing
            self._closing = True
            if self._closed_because is None:
                self._closed_because = because
        if closing:  # another thread (the watchdog, a signal's handler) is closing it
            self._done.wait()
            if self._result is None:
                raise SessionClosed(f"session {self.id} failed to close ({self._closed_because})")
            return self._result
        self._stop.set()
        run = self._run
        if self._paused:  # its outbox is read by exec, which a frozen sandbox never answers
            from orchestrator.runtime.snapshots import engine_of

            with self._lock:
                try:
                    engine, container = engine_of(run.live, "resume")
                    engine.unpause(container)
                except OrchestratorError as exc:
                    log.warning("session %s: could not resume it to close it: %s", self.id, exc)
                self._paused = False
        failed = False
        try:
            run.outcome.status, run.outcome.exit_code = "closed", 0
            run.collect()
        except BaseException:
            failed = True
            raise
        finally:
            try:
                self.files.close()
                result = run.close(failed=failed)
                with self._lock:
                    self._result = result
                # before waiters go on: a close() that waited on this one finds it audited
                self._record("session.closed", True, reason=because)
            finally:
                self._done.set()
        return result

    def handed_over(self) -> None:
        """The session is its user's from now: idling counts from here, not from when it
        was made (its owner process tells ``session start`` it is ready only after that;
        on a loaded machine the difference ate a short idle timeout before the first
        call could come)."""
        with self._lock:
            self._last_used = time.monotonic()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the ``with`` block as an operation of the session: the idle timeout does
        not close it meanwhile (a tool call waiting for a person's answer); the maximum
        lifetime still does. Raises :class:`SessionClosed` when it is closed already."""
        with self._active():
            yield

    # -- internals ------------------------------------------------------------------------

    @contextmanager
    def _active(self) -> Iterator[None]:
        with self._lock:
            if self._closed_because is not None:
                raise SessionClosed(
                    f"session {self.id} is closed ({self._closed_because}); open a new one"
                )
            if self._paused:
                raise SessionPaused(
                    f"session {self.id} is paused: resume it first (`orchestrator session "
                    f"resume {self.id}`, or Session.resume())"
                )
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._last_used = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(timeout=self._poll_interval()):
            now = time.monotonic()
            with self._lock:
                idle = self._in_flight == 0 and not self._paused and now - self._last_used
                paused_for = now - self._paused_at if self._paused else 0.0
            pausing = self.idle_mode == "pause"
            if self.max_lifetime is not None and now - self._opened >= self.max_lifetime:
                because = f"it reached its maximum lifetime of {self.max_lifetime:g} s"
            elif self.idle_timeout is not None and idle and idle >= self.idle_timeout:
                if pausing:
                    self._pause_when_idle()
                    continue
                because = f"idle for {self.idle_timeout:g} s"
            elif pausing and paused_for >= self.stop_paused_after:
                because = self._save_when_paused()
            else:
                continue
            try:
                self._close(because)
            except (OrchestratorError, OSError) as exc:  # said, never silent
                log.error("closing session %s (%s) failed: %s", self.id, because, exc)
            return

    def _pause_when_idle(self) -> None:
        """``idle: pause``: freeze it instead of closing it (a failure is said and audited;
        the session is then closed as idle would)."""
        try:
            self.pause(reason=f"idle for {self.idle_timeout:g} s")
        except (OrchestratorError, OSError) as exc:
            log.error("pausing idle session %s failed: %s", self.id, exc)
            self._record("session.pause", False, reason=str(exc))

    def _save_when_paused(self) -> str:
        """``idle: pause``, paused for ``stop_paused_after``: resumed, saved as a snapshot,
        then closed; the reason to close it (naming the snapshot, or why there is none)."""
        paused = f"paused for {self.stop_paused_after:g} s"
        try:
            self.resume()
            snap = self.snapshot()
        except (OrchestratorError, OSError) as exc:
            log.error("saving paused session %s failed: %s", self.id, exc)
            return f"{paused}; its snapshot failed: {exc}"
        return f"{paused}; saved as snapshot {snap.id}"

    def _poll_interval(self) -> float:
        limits = [t for t in (self.idle_timeout, self.max_lifetime) if t is not None]
        if self.idle_mode == "pause":
            limits.append(self.stop_paused_after)
        return max(0.05, min([5.0, *(t / 4 for t in limits)]))

    def _record(self, operation: str, allowed: bool, **metadata: Any) -> None:
        spec = self._run.spec
        reason = metadata.pop("reason", None)
        self._run.audit.record(
            operation,
            allowed=allowed,
            reason=reason,
            worker=spec.worker,
            run_id=spec.run_id,
            session_id=self.id,
            trust_level=spec.trust,
            metadata=metadata,
        )


class _Outbox:
    """Host-side writes to ``/staged``: the outbox is a tmpfs inside the container, so the
    bytes go in by exec, as the worker's uid. At ``untrusted``, only new files: staged work
    is never overwritten or appended to (as the worker itself cannot)."""

    SCRIPT = (
        'mkdir -p -- "$(dirname -- "$1")" || exit 1; '
        'if [ "$2" = append ]; then cat >> "$1" || exit 1; '
        'elif [ "$2" = new ]; then set -C; cat > "$1" || exit 1; '
        'else cat > "$1" || exit 1; fi; '
        'wc -c < "$1"'
    )

    def __init__(self, session: Session) -> None:
        self.session = session

    def stage_write(self, relative: str, data: bytes, *, append: bool) -> WriteResult:
        run = self.session._run
        spec = run.spec
        path = f"{spec.outbox}/{relative}"
        if len(data) > MAX_STAGED_WRITE:
            raise SandboxError(
                f"Cannot write '{path}': {len(data)} bytes is more than the "
                f"{MAX_STAGED_WRITE >> 20} MiB one write may stage"
            )
        untrusted = spec.trust == "untrusted"
        if untrusted and append:
            raise PolicyError(
                [f"Cannot append to '{path}': at trust untrusted, staged files are never "
                 "changed once written; write a new file"]
            )  # fmt: skip
        mode = "new" if untrusted else ("append" if append else "replace")
        assert spec.outbox is not None
        created = not _exists_in_container(run, path)
        request = exec_request(
            ["/bin/sh", "-c", self.SCRIPT, "stage", path, mode],
            user=spec.user,
            base_env=TOOL_ENV,
            cwd="/",
            timeout=60.0,
            stdin=data,
        )
        result = run.live.exec(request)
        if result.exit_code != 0:
            reason = result.stderr.strip().splitlines()[-1:] or ["the write failed"]
            if untrusted and not created:
                raise PolicyError(
                    [f"Cannot write '{path}': it is already staged, and at trust untrusted "
                     "staged files are never overwritten; write a new file"]
                )  # fmt: skip
            raise SandboxError(f"Cannot write '{path}': {reason[0]}")
        size = int(result.stdout.strip() or 0)
        return WriteResult(
            path=path,
            size=size,
            written=len(data),
            created=created,
            appended=append,
            zone="staged",
            review=True,
        )


def _exists_in_container(run: Run, path: str) -> bool:
    probe = exec_request(
        ["/bin/sh", "-c", 'test -e "$1" || test -L "$1"', "probe", path],
        user=run.spec.user,
        base_env=TOOL_ENV,
        cwd="/",
        timeout=30.0,
    )
    return run.live.exec(probe).exit_code == 0


def _redacted(result: ExecResult, run: Run) -> ExecResult:
    if not run.redactor:
        return result
    return replace(
        result, stdout=run.redactor.text(result.stdout), stderr=run.redactor.text(result.stderr)
    )
