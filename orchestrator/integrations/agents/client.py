"""The sandbox client for the openai-agents SDK (the only module importing ``agents``).

``RunConfig(sandbox=SandboxRunConfig(client=OrchestratorSandboxClient(), options=
OrchestratorSandboxClientOptions(project=..., worker=...)))``: each sandbox session the
SDK asks for is one session of this project (see docs/agents-sandbox.md): the hardened
container a run of the worker gets (gVisor for untrusted workers, no capabilities, a
read-only root, limits, zones with their modes, the network the worker declares and the
project allows), audited. Commands run by exec as the worker's uid in the manifest's root;
files move by exec too (:mod:`orchestrator.integrations.transfer`), so the SDK sees the
container as its commands do. Refused, one line each (:mod:`.mapping`): exposed ports,
manifest users or groups (``run_as``), mount entries, and commands or file operations as
another user.
"""

from __future__ import annotations

import asyncio
import io
import logging
import posixpath
import tarfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agents.sandbox.entries import Mount
from agents.sandbox.errors import (
    ConfigurationError,
    ErrorCode,
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile
from pydantic import Field

from orchestrator.config import load_project
from orchestrator.errors import OrchestratorError
from orchestrator.integrations import transfer
from orchestrator.integrations.agents import mapping
from orchestrator.integrations.projects import one_line, orchestrator_for
from orchestrator.integrations.tmpfs import with_tmpfs
from orchestrator.integrations.transfer import Capture, TooMuch
from orchestrator.runtime.session import Session
from orchestrator.timeouts import MAX_SESSION_S

log = logging.getLogger(__name__)

__all__ = [
    "OrchestratorSandboxClient",
    "OrchestratorSandboxClientOptions",
    "OrchestratorSandboxSession",
    "OrchestratorSandboxSessionState",
]

#: The SDK's name for this backend (options and session state carry it as ``type``).
BACKEND = "orchestrator"
#: The most output kept of one stream of a command (bytes); more stops and fails it.
MAX_OUTPUT = 64 << 20
#: The largest file (or workspace, as a tar stream) moved in or out (bytes).
MAX_TRANSFER = 1 << 30
#: How long one transfer may take (seconds).
TRANSFER_TIMEOUT = 600.0
#: The default size of the workspace's tmpfs, when it needs one.
WORKSPACE_SIZE = 256 << 20
#: The default longest life of a session (seconds).
MAX_LIFETIME = 8 * 3600.0


class OrchestratorSandboxClientOptions(BaseSandboxClientOptions):
    """Which project and worker a session is, and how long it may live. Give either
    ``worker`` (a name in the project's workers folder or a path to a ``.worker`` file)
    or the inline fields (``image`` ... ``env``), as for the Inspect provider."""

    type: Literal["orchestrator"] = "orchestrator"
    project: str = "."
    """The project folder (holding ``orchestrator.yaml``); relative to the current one."""
    worker: str | None = None
    image: str | None = None
    zones: list[dict[str, Any]] | None = None
    network: Any = None
    """``none`` (default), ``{allow: [HOST, ...]}`` or ``full`` where the project allows it."""
    resources: dict[str, Any] | None = None
    isolation: str | None = None
    env: dict[str, str] | None = None
    trust: str | None = None
    workspace_size: int = Field(default=WORKSPACE_SIZE, gt=0)
    """Size of the workspace's tmpfs when it needs one (bytes; at most the memory limit)."""
    idle_timeout: float | None = Field(default=None, gt=0, le=MAX_SESSION_S)
    max_lifetime: float | None = Field(default=MAX_LIFETIME, gt=0, le=MAX_SESSION_S)
    exposed_ports: tuple[int, ...] = ()
    """Refused when not empty: a worker's container publishes no ports."""


class OrchestratorSandboxSessionState(SandboxSessionState):
    """What the SDK keeps of a session (``RunState``): the options to open it again, and
    which of this project's sessions it is."""

    type: Literal["orchestrator"] = "orchestrator"
    options: OrchestratorSandboxClientOptions
    orchestrator_session: str = ""
    run_id: str = ""
    uid: int = -1
    gid: int = -1


@dataclass
class _Opened:
    session: Session
    workdir: str
    uid: int
    gid: int


_lock = threading.Lock()
_live: dict[str, _Opened] = {}


def _one_line(exc: OrchestratorError) -> str:
    text = one_line(exc)
    return text if text.startswith(mapping.PREFIX) else mapping.PREFIX + text


def _check(manifest: Manifest, options: OrchestratorSandboxClientOptions) -> None:
    mounts = [str(path) for _, path in manifest.mount_targets()]
    mounts += [str(key) for key, entry in manifest.entries.items() if isinstance(entry, Mount)]
    problems = mapping.refusals(
        exposed_ports=options.exposed_ports,
        users=[user.name for user in manifest.users],
        groups=[group.name for group in manifest.groups],
        mounts=sorted(set(mounts)),
        host_grants=[g.path for g in manifest.extra_path_grants if g.host_path is not None],
        root=manifest.root,
    )
    if problems:
        raise ValueError(_one_line(mapping.refuse("; ".join(problems))))


def _open(options: OrchestratorSandboxClientOptions, root: str) -> _Opened:
    """Open a session of the worker ``options`` give, with ``root`` writable (blocking)."""
    try:
        project = load_project(Path(options.project).expanduser().resolve())
        env = mapping.environment_of(options.model_dump())
        extra: dict[str, Any] = {}
        if env.worker is not None and env.trust:
            extra["trust"] = env.trust
        orch = orchestrator_for(project.root)
        prepared = orch.prepare(mapping.worker_of(env, project, Path.cwd()), **extra)
        if mapping.workspace_tmpfs(prepared.spec, root):
            folder = (posixpath.normpath(root), options.workspace_size)
            prepared = with_tmpfs(prepared, [folder], owned=True)
        session = orch.open_session(
            prepared, idle_timeout=options.idle_timeout, max_lifetime=options.max_lifetime
        )
    except OrchestratorError as exc:
        raise ValueError(_one_line(exc)) from None
    spec = prepared.spec
    opened = _Opened(session, spec.workdir, spec.uid, spec.gid)
    with _lock:
        _live[session.id] = opened
    return opened


async def _open_async(options: OrchestratorSandboxClientOptions, root: str) -> _Opened:
    """:func:`_open` in a thread; when the caller is cancelled meanwhile, the session it
    opens is closed as soon as it exists (nobody else would)."""
    task = asyncio.ensure_future(asyncio.to_thread(_open, options, root))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_close_unwanted)
        raise


def _close_unwanted(task: asyncio.Future[_Opened]) -> None:
    if not task.cancelled() and task.exception() is None:
        threading.Thread(target=_close, args=(task.result().session,), daemon=False).start()


def _close(session: Session) -> None:
    with _lock:
        _live.pop(session.id, None)
    try:
        session.close()
    except (OrchestratorError, OSError) as exc:
        log.warning("closing session %s failed: %s (orchestrator gc removes what is left)",
                    session.id, exc)  # fmt: skip


class OrchestratorSandboxSession(BaseSandboxSession):
    """One of this project's sessions, as the SDK's sandbox session."""

    state: OrchestratorSandboxSessionState

    def __init__(self, state: OrchestratorSandboxSessionState, opened: _Opened) -> None:
        self.state = state
        self._opened: _Opened | None = opened
        self._uid, self._gid = opened.uid, opened.gid
        self._env: dict[str, str] | None = None
        self._root_ready = False

    @property
    def orchestrator_session(self) -> Session | None:
        """This project's session (None once shut down)."""
        return None if self._opened is None else self._opened.session

    # -- lifecycle ------------------------------------------------------------------------

    async def _prepare_backend_workspace(self) -> None:
        self._env = await self.state.manifest.environment.resolve()
        root = self.state.manifest.root
        made = await self._exec(["mkdir", "-p", "--", root], cwd="/", timeout=60.0)
        if made.exit_code != 0:
            said = made.stderr.decode(errors="replace").strip() or "no message"
            raise WorkspaceArchiveWriteError(
                path=Path(root), message=f"{mapping.PREFIX}cannot make the root {root}: {said}"
            )
        self._root_ready = True

    async def running(self) -> bool:
        session = self.orchestrator_session
        return session is not None and not session.closed

    async def _shutdown_backend(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            await asyncio.to_thread(_close, opened.session)

    # -- commands -------------------------------------------------------------------------

    def _check_user(self, user: str | User | None) -> None:
        name = user.name if isinstance(user, User) else user
        if not mapping.user_allowed(name, self._uid, self._gid):
            raise ConfigurationError(
                message=(
                    f"{mapping.PREFIX}user {name!r} is refused: commands and files act as the "
                    f"worker's own uid ({self._uid}) only; workers never run as root or "
                    "switch users"
                ),
                error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
                op="exec",
                context={"user": name},
            )

    async def exec(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
    ) -> ExecResult:
        self._check_user(user)
        return await super().exec(*command, timeout=timeout, shell=shell, user=None)

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        return await self._exec([str(part) for part in command], timeout=timeout)

    async def _exec(
        self,
        argv: list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        capture: Capture | None = None,
    ) -> ExecResult:
        """Run ``argv`` in the session as the worker (in the root once it exists)."""
        opened = self._opened
        if opened is None:
            raise ExecTransportError(command=argv, message=f"{mapping.PREFIX}session is shut down")
        capture = capture or Capture(MAX_OUTPUT, MAX_OUTPUT)
        workdir = cwd or (self.state.manifest.root if self._root_ready else opened.workdir)
        try:
            result = await asyncio.to_thread(
                opened.session.exec,
                argv,
                cwd=workdir,
                env=self._env or None,
                timeout=timeout,
                stdin=stdin,
                on_output=capture.add,
            )
        except TooMuch as exc:
            raise ExecTransportError(
                command=argv,
                message=(
                    f"{mapping.PREFIX}the command's {exc.stream} went over "
                    f"{capture.caps[exc.stream] >> 20} MiB; it was stopped"
                ),
                retryable=False,
            ) from None
        except OrchestratorError as exc:
            raise ExecTransportError(
                command=argv, message=_one_line(exc), retryable=False
            ) from None
        if result.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(
            stdout=bytes(capture.data["stdout"]),
            stderr=bytes(capture.data["stderr"]),
            exit_code=result.exit_code,
        )

    # -- files ----------------------------------------------------------------------------

    async def _transfer(
        self, script: str, path: Path, capture: Capture, stdin: bytes | None, doing: str
    ) -> OSError | None:
        """Run a transfer script on ``path``; the failure it stands for, if it failed."""
        argv = ["/bin/sh", "-c", script, doing, str(path)]
        result = await self._exec(argv, timeout=TRANSFER_TIMEOUT, stdin=stdin, capture=capture)
        if result.exit_code == 0:
            return None
        return transfer.failure(str(path), result.stderr.decode(errors="replace"), doing)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        self._check_user(user)
        target = await self._validate_path_access(path)
        capture = Capture(MAX_TRANSFER, 64 << 10)
        try:
            failed = await self._transfer(transfer.READ, target, capture, None, "read")
        except ExecTransportError as exc:
            raise WorkspaceArchiveReadError(path=path, context={"reason": exc.message}) from None
        if isinstance(failed, FileNotFoundError):
            raise WorkspaceReadNotFoundError(path=path)
        if failed is not None:
            raise WorkspaceArchiveReadError(path=path, context={"reason": failed.strerror})
        return io.BytesIO(bytes(capture.data["stdout"]))

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._check_user(user)
        target = await self._validate_path_access(path, for_write=True)
        payload = await asyncio.to_thread(_read_all, data, path)
        failed = await self._transfer(transfer.WRITE, target, Capture(0, 64 << 10), payload,
                                      "write")  # fmt: skip
        if failed is not None:
            raise WorkspaceArchiveWriteError(
                path=target, message=f"failed to write {target}: {failed.strerror}"
            )

    async def persist_workspace(self) -> io.IOBase:
        """The workspace (the manifest's root) as a tar stream of relative paths."""
        root = Path(self.state.manifest.root)
        capture = Capture(MAX_TRANSFER, 64 << 10)
        try:
            failed = await self._transfer(transfer.TAR, root, capture, None, "persist_workspace")
        except ExecTransportError as exc:
            raise WorkspaceArchiveReadError(path=root, context={"reason": exc.message}) from None
        if failed is not None:
            raise WorkspaceArchiveReadError(path=root, context={"reason": failed.strerror})
        return io.BytesIO(bytes(capture.data["stdout"]))

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """A tar stream (from :meth:`persist_workspace`) unpacked into the workspace; one
        with a member outside it (``..``, an absolute path, a link pointing out) is refused
        as the SDK's Docker sandbox refuses it, before anything is written."""
        root = Path(self.state.manifest.root)
        payload = await asyncio.to_thread(_read_all, data, root)
        try:
            with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as tar:
                validate_tarfile(tar, allow_external_symlink_targets=False)
        except (UnsafeTarMemberError, tarfile.TarError) as exc:
            raise WorkspaceArchiveWriteError(
                path=root, message=f"{mapping.PREFIX}the snapshot is refused: {exc}"
            ) from None
        failed = await self._transfer(transfer.UNTAR, root, Capture(64 << 10, 64 << 10), payload,
                                      "hydrate_workspace")  # fmt: skip
        if failed is not None:
            raise WorkspaceArchiveWriteError(
                path=root, message=f"failed to restore the workspace: {failed.strerror}"
            )


def _read_all(data: io.IOBase, path: Path) -> bytes:
    """The whole of a payload stream, at most :data:`MAX_TRANSFER` bytes."""
    chunk = data.read(MAX_TRANSFER + 1)
    payload = chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk or b"")
    if len(payload) > MAX_TRANSFER:
        raise WorkspaceArchiveWriteError(
            path=path, message=f"{path}: over {MAX_TRANSFER >> 20} MiB, too large to write"
        )
    return payload


class OrchestratorSandboxClient(BaseSandboxClient[OrchestratorSandboxClientOptions]):
    """Sandbox sessions that are this project's sessions. ``options`` given here are the
    default for runs that give none in their ``SandboxRunConfig``."""

    backend_id = BACKEND

    def __init__(self, options: OrchestratorSandboxClientOptions | None = None) -> None:
        super().__init__()
        self.default_options = options
        self.supports_default_options = options is not None

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: OrchestratorSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or self.default_options
        if not isinstance(options, OrchestratorSandboxClientOptions):
            raise ValueError(
                f"{mapping.PREFIX}give OrchestratorSandboxClientOptions(project=..., "
                "worker=...) in SandboxRunConfig(options=...) or to the client"
            )
        manifest = self._validate_manifest_for_create(manifest or Manifest())
        _check(manifest, options)
        options = _absolute(options)
        opened = await _open_async(options, manifest.root)
        session_id = uuid.uuid4()
        state = OrchestratorSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            options=options,
            **_identity(opened),
        )
        return self._wrap_session(OrchestratorSandboxSession(state, opened))

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, OrchestratorSandboxSession):
            raise TypeError("OrchestratorSandboxClient.delete expects its own sessions")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """The same session while it is open in this process; otherwise a new one from the
        same options, its workspace restored from the snapshot (when there is one)."""
        if not isinstance(state, OrchestratorSandboxSessionState):
            raise TypeError("OrchestratorSandboxClient.resume expects its own session state")
        _check(state.manifest, state.options)
        with _lock:
            opened = _live.get(state.orchestrator_session)
        preserved = opened is not None and not opened.session.closed
        if opened is None or not preserved:
            opened = await _open_async(state.options, state.manifest.root)
            state.workspace_root_ready = False
        for name, value in _identity(opened).items():
            setattr(state, name, value)
        inner = OrchestratorSandboxSession(state, opened)
        inner._root_ready = preserved and state.workspace_root_ready
        inner._set_start_state_preserved(preserved)
        return self._wrap_session(inner)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, OrchestratorSandboxSessionState)


def _absolute(options: OrchestratorSandboxClientOptions) -> OrchestratorSandboxClientOptions:
    """``options`` with the project folder and a worker file's path made absolute, so that
    a session state resumed from another folder means the same."""
    update: dict[str, str] = {"project": str(Path(options.project).expanduser().resolve())}
    worker = options.worker
    if worker is not None and ("/" in worker or worker.endswith(".worker")):
        update["worker"] = str(Path(worker).expanduser().resolve())
    return options.model_copy(update=update)


def _identity(opened: _Opened) -> dict[str, Any]:
    session = opened.session
    return {"orchestrator_session": session.id, "run_id": session.run_id, "uid": opened.uid,
            "gid": opened.gid}  # fmt: skip
