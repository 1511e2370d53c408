"""The Docker engine adapter: what the runtime asks of an engine, done with the SDK.

:class:`DockerEngine` implements :class:`orchestrator.runtime.engine.Engine` with the
low-level client (one request per step, no implicit inspects): it stamps the owner labels
on everything it creates, retries transient failures a bounded number of times (see
:mod:`.client`), and leaves networks and egress proxies to :mod:`.networks`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import requests
from docker import errors as docker_errors
from docker.utils import socket as docker_socket

from orchestrator import labels
from orchestrator.docker import (
    buildnames,
    credproxy,
    credproxy_spares,
    execframes,
    execlimits,
    hostconfig,
    kernel_log,
    podman,
    runtimes,
)
from orchestrator.docker.cabundle import CaBundles
from orchestrator.docker.client import DockerClient, engine_errors, retrying, wait_exit
from orchestrator.docker.hostpaths import (
    HostView,
    engine_socket,
    engine_sockets,
    mapping_problem,
    own_container_id,
    same_mount_namespace,
    socket_problem,
)
from orchestrator.errors import (
    ContainerStopped,
    EngineError,
    EngineUnreachable,
    ImageMissing,
    OrchestratorError,
    StartFailure,
)
from orchestrator.exits import Exit, signalled
from orchestrator.plan import ContainerSpec
from orchestrator.runtime.engine import (
    EgressLog,
    ExitState,
    ImageDefaults,
    ManagedObject,
    Stream,
)

#: A container killed by SIGKILL, as the engine reports it (an OOM kill among others).
EXIT_SIGKILL = signalled(signal.SIGKILL)
#: How long past a SIGKILLed container's exit its OOM event may still arrive.
LATE_OOM_GRACE_S = 2.0


#: How Docker (runc) reports, as an exec's first output, a command it could not start.
EXEC_FAILED = b"OCI runtime exec failed"


def start_failure_code(message: str) -> int | None:
    """The exit code for an engine's report that a command cannot run, Docker's (and a
    shell's) convention: 127 not found, 126 not runnable; None for any other failure."""
    lowered = message.lower()
    if "executable file not found" in lowered or "no such file or directory" in lowered:
        return Exit.NOT_FOUND
    if "permission denied" in lowered or "exec format error" in lowered:
        return Exit.CANNOT_INVOKE
    return None


class DockerExec:
    """One exec'd command: its output frames, then its exit code.

    Docker reports a command it could not start (not found, not runnable) as the exec's
    own output (``OCI runtime exec failed: ...``, Podman's words are turned into these by
    :func:`.podman.exec_frames`) and exit code 126: :meth:`exit_code` then raises
    :class:`~orchestrator.errors.StartFailure` instead, with the code a shell would give.
    """

    def __init__(self, engine: DockerEngine, exec_id: str, frames: Iterator[tuple[Stream, bytes]]):
        self.engine = engine
        self.exec_id = exec_id
        self.failure: bytearray | None = None
        """The start of the output, when it is the engine's report of a failed start."""
        self.frames = self._watched(frames)

    def _watched(self, frames: Iterator[tuple[Stream, bytes]]) -> Iterator[tuple[Stream, bytes]]:
        first = True
        try:
            for stream, chunk in frames:
                if stream == "stdout":
                    if first and chunk.startswith((EXEC_FAILED, execlimits.FAILED)):
                        self.failure = bytearray()
                    first = False
                    if self.failure is not None and len(self.failure) < 4096:
                        self.failure += chunk
                yield stream, chunk
        finally:
            close = getattr(frames, "close", None)
            if close is not None:  # closing this closes the connection at once
                close()

    def exit_code(self) -> int | None:
        with engine_errors("reading a command's exit code"):
            code = self.engine.api.exec_inspect(self.exec_id).get("ExitCode")
        if code is None:
            return None
        if self.failure is not None and int(code) in (Exit.CANNOT_INVOKE, Exit.NOT_FOUND):
            message = self.failure.decode("utf-8", errors="replace").strip()
            raise StartFailure(message, code=start_failure_code(message) or Exit.CANNOT_INVOKE)
        return int(code)


class DockerEngine(DockerClient):
    """:class:`~orchestrator.runtime.engine.Engine` over the Docker SDK's low-level client."""

    # -- one container's life -------------------------------------------------------------

    #: Runtimes seen on an engine (by its address) in this process. Only their presence is
    #: remembered: a missing one is asked about again, so that setting it up while a
    #: long-lived process (a session server) runs is noticed.
    _seen_runtimes: ClassVar[set[tuple[str, str]]] = set()
    #: Images' CA bundles read in this process (a run with egress credentials needs its
    #: image's).
    ca_bundles: ClassVar[CaBundles] = CaBundles()
    #: This process's making of spare credential proxies for the next runs.
    spares: ClassVar[credproxy_spares.SparePool] = credproxy_spares.SparePool()

    def runtime_for(self, spec: ContainerSpec) -> str:
        podman.check_spec(self, spec)  # what Podman cannot run, before its runtime names
        name = runtimes.runtime_name(
            spec.isolation, spec.network.mode, broker=spec.calls_children, capture=spec.root_capture
        )
        if name == runtimes.RUNC:
            return name  # Docker's own, always there
        key = (str(self.api.base_url), name)
        if key not in self._seen_runtimes:
            if name not in runtimes.engine_runtimes(self):
                raise EngineError(runtimes.missing_message(spec.worker, spec.trust, name))
            self._seen_runtimes.add(key)
        return name

    _host_view: HostView | None = None
    _host_view_read = False

    def check_mounts(self, spec: ContainerSpec) -> None:
        """Refuse a mount that would hand the container the engine's socket, or a host
        folder other than the one the orchestrator checked (when it runs in a container
        itself: see :mod:`.hostpaths`). Nothing is created before this passes."""
        sockets = engine_sockets()
        problems = [p for m in spec.mounts if (p := socket_problem(m.source, m.target, sockets))]
        view = self.host_view() if spec.mounts and not problems else None
        if view is not None:
            problems = [p for m in spec.mounts if (p := mapping_problem(view, m.source, m.target))]
        if problems:
            more = f" (and {len(problems) - 1} more mounts)" if len(problems) > 1 else ""
            raise OrchestratorError(f"{problems[0]}{more}")

    def host_view(self) -> HostView | None:
        """The orchestrator's own container and its mounts, read once; None outside a
        container, or in one this engine does not know."""
        if not self._host_view_read:
            container = own_container_id()
            if container is not None:
                with engine_errors("inspecting the orchestrator's own container"):
                    try:
                        inspected = self.api.inspect_container(container)
                    except docker_errors.NotFound:
                        inspected = None
                if inspected is not None:
                    self._host_view = HostView.from_inspect(container, inspected)
            self._host_view_read = True
        return self._host_view

    _pins: bool | None = None

    def pins_mounts(self) -> bool:
        """Root, outside a container, and the engine's socket served by a process in this
        mount namespace (its ``SO_PEERCRED`` pid): a bind mount made here is the engine's."""
        if self._pins is None:
            socket_path = engine_socket()
            self._pins = (
                os.geteuid() == 0
                and socket_path is not None
                and self.host_view() is None
                and same_mount_namespace(socket_path)
            )
        return self._pins

    def _run_hosts(self, spec: ContainerSpec) -> dict[str, str] | None:
        """An allowlisted run's ``proxy`` in /etc/hosts (:func:`.networks.run_hosts`)."""
        if spec.network.mode != "allowlist":
            return None
        from orchestrator.docker import networks

        return networks.run_hosts(self, spec)

    def create(self, spec: ContainerSpec) -> str:
        self.check_mounts(spec)
        runtime = self.runtime_for(spec)
        config = hostconfig.host_config(spec, runtime)
        config["security_opt"] = podman.security_opt_for(self, config["security_opt"])
        config["ulimits"] = podman.ulimits_for(self, config["ulimits"]) or None
        config["tmpfs"] = podman.tmpfs_for(
            self,
            config["tmpfs"],
            read_only=spec.read_only_rootfs,
            binds=[m.target for m in spec.mounts],
        )
        host_config = self.api.create_host_config(**config, extra_hosts=self._run_hosts(spec))
        options = hostconfig.container_config(spec)

        # Named after the run: a create retried after a lost reply finds the first one
        # instead of leaving a second, unnoticed container behind.
        name = f"orchestrator-{spec.run_id}" if spec.run_id else None

        def create() -> str:
            try:
                result = self.api.create_container(
                    name=name,
                    **options,
                    labels=self.labels_for(spec.labels),
                    host_config=host_config,
                    use_config_proxy=False,  # a worker gets exactly the plan's proxy settings
                    stdin_open=False,
                    tty=False,
                )
            except docker_errors.APIError as exc:
                if exc.status_code != 409 or name is None:
                    raise
                existing = self.api.inspect_container(name)
                if (existing["Config"].get("Labels") or {}).get(labels.RUN_ID) != spec.run_id:
                    raise
                return str(existing["Id"])
            return str(result["Id"])

        with engine_errors(f"creating the container for '{spec.worker}'"):
            try:
                container_id = retrying(create)
                gvisor = runtimes.is_gvisor(runtime)
                self._gvisor_containers[container_id] = gvisor
                limits = [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in spec.ulimits]
                self._exec_nofile[container_id] = execlimits.nofile(gvisor, limits)
                return container_id
            except docker_errors.ImageNotFound:
                raise ImageMissing(spec.image) from None
            except docker_errors.NotFound as exc:
                if "image" in str(exc.explanation or "").lower():
                    raise ImageMissing(spec.image) from None
                raise

    def attach(self, container_id: str) -> Iterator[tuple[Stream, bytes]]:
        with engine_errors("attaching to the container"):
            frames = self.api.attach(
                container_id, stdout=True, stderr=True, stream=True, logs=True, demux=True
            )
        return self._frames(frames)

    @staticmethod
    def _frames(frames: Any) -> Iterator[tuple[Stream, bytes]]:
        try:
            for out, err in frames:
                if out:
                    yield "stdout", out
                if err:
                    yield "stderr", err
        except (requests.exceptions.RequestException, OSError, ValueError):
            return  # the connection closed as the container went away
        finally:
            # Closes the hijacked connection's fd. The SDK leaves the socket wrapper itself
            # to the garbage collector, which then warns about an already closed socket
            # (docker/docker-py#3282); pyproject's pytest settings filter exactly that.
            frames.close()

    def start(self, container_id: str) -> None:
        try:
            with engine_errors("starting the container"):
                retrying(lambda: self.api.start(container_id))
        except EngineError as exc:
            code = start_failure_code(str(exc))
            if code is None or isinstance(exc, EngineUnreachable):
                raise
            raise StartFailure(str(exc), code=code) from exc

    def wait(self, container_id: str, timeout: float | None) -> int | None:
        result = wait_exit(self.api, container_id, timeout, "waiting for the container")
        if result is None:
            return None
        return podman.exit_code_for(self, container_id, int(result.get("StatusCode", -1)))

    def exit_state(self, container_id: str) -> ExitState:
        with engine_errors("reading the container's exit state"):
            inspected = retrying(lambda: self.api.inspect_container(container_id))
        state, host_config = inspected["State"], inspected.get("HostConfig") or {}
        code, oom = int(state.get("ExitCode", -1)), bool(state.get("OOMKilled"))
        # gVisor: the worker may fail by itself (a refused allocation) while the host's OOM
        # killer hit its sandbox; the kernel's log says so.
        gvisor = runtimes.is_gvisor(str(host_config.get("Runtime") or ""))
        if gvisor and code not in (0, EXIT_SIGKILL) and not oom and state.get("Status") == "exited":
            oom = kernel_log.oom_kill_logged(container_id) is True
        if code == EXIT_SIGKILL and not oom and state.get("Status") == "exited":
            oom = kernel_log.oom_kill_logged(container_id) or self._late_oom_event(
                container_id, str(state.get("StartedAt", ""))
            )
        return ExitState(exit_code=code, oom_killed=oom)

    def memory_peaked(self, container_id: str) -> bool:
        """From the engine's one-shot stats: the memory cgroup's high-water mark against its
        limit (cgroup v1 reports it; under cgroup v2 there is none, so False)."""
        with engine_errors("reading the container's memory use"):
            try:
                stats = self.api.stats(container_id, stream=False, one_shot=True)
            except docker_errors.NotFound:
                return False
        memory = stats.get("memory_stats") or {}
        peak, limit = memory.get("max_usage"), memory.get("limit")
        return isinstance(peak, int) and isinstance(limit, int) and 0 < limit <= peak

    def usage(self, container_id: str) -> dict[str, int]:
        """The container's resource use now, from the engine's one-shot stats (bytes and
        nanoseconds): ``cpu_ns`` (CPU time used since it started), ``mem_used`` (as
        ``docker stats`` shows it: the usage without inactive file pages), ``mem_cache``,
        ``mem_limit``."""
        with engine_errors("reading the container's resource use"):
            stats = self.api.stats(container_id, stream=False, one_shot=True)
        cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
        memory = stats.get("memory_stats") or {}
        detail = memory.get("stats") or {}
        usage = int(memory.get("usage") or 0)
        inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))
        cache = detail.get("cache", detail.get("file", 0))
        return {
            "cpu_ns": int(cpu.get("total_usage") or 0),
            "mem_used": max(0, usage - int(inactive or 0)),
            "mem_cache": int(cache or 0),
            "mem_limit": int(memory.get("limit") or 0),
        }

    def _late_oom_event(self, container_id: str, started_at: str) -> bool:
        """Whether the engine reports an OOM of this container, waiting briefly for it.

        The engine sets ``OOMKilled`` only when the OOM event reaches it before the exit
        event; under gVisor the sandbox's death often comes first (up to ~0.2 s measured),
        so a SIGKILLed container is given a short grace. Under load the event can be lost
        for good; the kernel's log (:mod:`orchestrator.docker.kernel_log`) is asked first.
        """
        try:
            since = int(datetime.fromisoformat(started_at[:19] + "+00:00").timestamp())
        except ValueError:
            return False
        with engine_errors("reading the container's events"):
            stream = self.api.events(
                since=since,
                until=int(time.time() + LATE_OOM_GRACE_S) + 1,
                filters={"container": container_id, "event": "oom"},
                decode=True,
            )
            try:
                return any(True for _ in stream)
            finally:
                stream.close()

    def kill(self, container_id: str) -> None:
        with engine_errors("killing the container"):
            try:
                self.api.kill(container_id)
            except docker_errors.APIError as exc:
                if exc.status_code in (404, 409):  # gone, or not running any more
                    return
                raise

    def remove(self, container_id: str) -> bool:
        def remove() -> None:
            try:
                self.api.remove_container(container_id, force=True, v=True)
            except docker_errors.NotFound:
                return
            except docker_errors.APIError as exc:
                if "already in progress" not in str(exc.explanation or ""):
                    raise

        with engine_errors("removing the container"):
            retrying(remove)
        self._gvisor_containers.pop(container_id, None)
        self._starting.pop(container_id, None)
        with self._start_locks_guard:
            self._start_locks.pop(container_id, None)
        return True

    # -- pause, resume, snapshots (orchestrator.runtime.snapshots) ----------------------

    def pause(self, container_id: str) -> None:
        """Freeze every process of the container (the cgroup freezer; gVisor's sandbox as a
        whole under runsc).

        Never while a command of this process is starting in it: the engine refuses an exec
        into a paused container only when the exec is created, and ``exec_start`` answers
        before the runtime has started the process, so a freeze in between left the
        runtime's ``exec`` waiting on a frozen process, holding the container, and every
        later ``unpause`` of it waiting too (seen with runc). So starts and pauses of a
        container take turns, and a pause first waits for the commands started before it
        to be running (or ended)."""
        with self._no_starts(container_id), engine_errors("pausing the container"):
            self.api.pause(container_id)

    @contextlib.contextmanager
    def _no_starts(self, container_id: str) -> Iterator[None]:
        """No command starts in the container meanwhile, and those started lately run."""
        with self._starts(container_id):
            for exec_id in self._starting.pop(container_id, {}):
                self._until_started(exec_id)
            yield

    #: Per container: the lock starts and pauses take turns on, and the execs started
    #: lately (id -> when) whose process may not be running yet.
    _start_locks: ClassVar[dict[str, threading.Lock]] = {}
    _starting: ClassVar[dict[str, dict[str, float]]] = {}
    #: An exec started longer ago than this is running (or ended) by the time of a pause.
    _STARTED_WITHIN_S: ClassVar[float] = 30.0
    _start_locks_guard: ClassVar[threading.Lock] = threading.Lock()

    def _starts(self, container_id: str) -> threading.Lock:
        with self._start_locks_guard:
            return self._start_locks.setdefault(container_id, threading.Lock())

    def _started(self, container_id: str, exec_id: str) -> None:
        """Note an exec just started (under the container's start lock; see :meth:`pause`)."""
        now = time.monotonic()
        recent = self._starting.setdefault(container_id, {})
        for old in [e for e, at in recent.items() if now - at > self._STARTED_WITHIN_S]:
            del recent[old]
        recent[exec_id] = now

    def _until_started(self, exec_id: str, within: float = 10.0) -> None:
        """Wait until the runtime started ``exec_id``'s process (it has a pid) or it ended."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                state = self.api.exec_inspect(exec_id)
            except docker_errors.NotFound:
                return
            ended = not state.get("Running") and state.get("ExitCode") is not None
            if state.get("Pid") or ended:
                return
            time.sleep(0.005)

    def unpause(self, container_id: str) -> None:
        with engine_errors("resuming the container"):
            self.api.unpause(container_id)

    def commit(
        self, container_id: str, repository: str, tag: str, image_labels: dict[str, str]
    ) -> str:
        """The container's root filesystem changes as a new local image ``repository:tag``
        (the container is paused meanwhile); its id. ``image_labels`` are added to it."""
        changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in image_labels.items()]
        with (
            self._no_starts(container_id),  # it pauses too: see pause()
            engine_errors("committing the container's root filesystem"),
        ):
            made = self.api.commit(container_id, repository=repository, tag=tag, pause=True,
                                   changes=changes)  # fmt: skip
        return str(made["Id"])

    def tag_image(self, image: str, repository: str, tag: str) -> str:
        """Name ``image`` ``repository:tag`` too (it stays while the name does); its id."""
        with engine_errors(f"naming image '{image}'"):
            image_id = str(self.api.inspect_image(image)["Id"])  # type: ignore[no-untyped-call]
            self.api.tag(image_id, repository, tag)
        return image_id

    def image_size(self, image: str) -> int:
        """Bytes of the image's own top layer (what a commit added)."""
        with engine_errors(f"reading image '{image}'"):
            history = self.api.history(image)  # type: ignore[no-untyped-call]
        return int(history[0].get("Size") or 0) if history else 0

    def remove_image(self, image: str) -> bool:
        """Remove a local image (its tag and, unused, its layers); False when it was gone."""
        with engine_errors(f"removing image '{image}'"):
            try:
                self.api.remove_image(image, force=True)
            except docker_errors.ImageNotFound:
                return False
        return True

    def images_labelled(self, label: str) -> list[tuple[str, list[str], dict[str, str]]]:
        """Local images carrying ``label`` (``key`` or ``key=value``): id, tags, labels."""
        with engine_errors("listing images"):
            found = self.api.images(filters={"label": label})
        return [(str(i["Id"]), list(i.get("RepoTags") or []), dict(i.get("Labels") or {}))
                for i in found]  # fmt: skip

    # -- garbage collection ---------------------------------------------------------------

    def image_argv(self, image: str, command: list[str] | None) -> list[str]:
        with engine_errors(f"reading the command of image '{image}'"):
            config = self.api.inspect_image(image).get("Config") or {}  # type: ignore[no-untyped-call]
        return [*(config.get("Entrypoint") or []), *(command or config.get("Cmd") or [])]

    def image_defaults(self, image: str) -> ImageDefaults:
        with engine_errors(f"reading the configuration of image '{image}'"):
            config = self.api.inspect_image(image).get("Config") or {}  # type: ignore[no-untyped-call]
        return ImageDefaults(str(config.get("User") or "0"), str(config.get("WorkingDir") or "/"))

    def exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
    ) -> DockerExec:
        with self._starts(container_id), engine_errors("starting a command in the container"):
            if container_id not in self._exec_nofile:
                self._learn(container_id)
            try:
                exec_id = self.api.exec_create(
                    container_id,
                    execlimits.wrapped(argv, self._exec_nofile[container_id]),
                    stdout=True,
                    stderr=True,
                    stdin=stdin is not None,
                    user=user,
                    environment=env,
                    workdir=workdir,
                )["Id"]
            except docker_errors.APIError as exc:
                if podman.stopped_refusal(exc.status_code, str(exc.explanation or "")):
                    raise ContainerStopped(
                        f"container {container_id[:12]} is no longer running: no command "
                        "can start in it"
                    ) from None
                raise
            watch = self._under_gvisor(container_id)
            # Always the hijacked socket, demultiplexed here: the SDK's own stream loses
            # output read along with the response's headers (see :mod:`.execframes`).
            sock = self.api.exec_start(exec_id, socket=True)
            self._started(container_id, exec_id)
        running = (lambda: self._running(container_id)) if watch else None
        fed = self._fed_frames(sock, stdin, running)
        return DockerExec(self, exec_id, podman.exec_frames_for(self, fed))

    #: Whether a container (by id) runs under gVisor, as created here or inspected once.
    _gvisor_containers: ClassVar[dict[str, bool]] = {}
    #: The nofile limit an exec into a container sets itself (:mod:`.execlimits`), likewise.
    _exec_nofile: ClassVar[dict[str, tuple[int, int] | None]] = {}

    def _under_gvisor(self, container_id: str) -> bool:
        if container_id not in self._gvisor_containers:
            self._learn(container_id)
        return self._gvisor_containers[container_id]

    def _learn(self, container_id: str) -> None:
        """What execs need to know of a container this process did not create."""
        with engine_errors("inspecting the container"):
            host = self.api.inspect_container(container_id).get("HostConfig") or {}
        gvisor = runtimes.is_gvisor(str(host.get("Runtime") or ""))
        self._gvisor_containers[container_id] = gvisor
        self._exec_nofile[container_id] = execlimits.nofile(gvisor, host.get("Ulimits"))

    def _running(self, container_id: str) -> bool:
        """Whether the container still runs (an unanswered question counts as yes)."""
        try:
            state = self.api.inspect_container(container_id).get("State") or {}
        except docker_errors.NotFound:
            return False
        except (docker_errors.DockerException, requests.exceptions.RequestException):
            return True
        return bool(state.get("Running"))

    @staticmethod
    def _fed_frames(
        sock: Any, stdin: bytes | None, running: Callable[[], bool] | None = None
    ) -> Iterator[tuple[Stream, bytes]]:
        """Feed ``stdin``, if any, from a thread (a command that reads no input, or reads it
        slowly, must not stop its output being read), close the write side (end of file for
        the command), and demultiplex the hijacked connection's frames ourselves, those read
        with the response's headers first. With ``running``, the frames also end once the
        container stops (gVisor: see :mod:`.execframes`)."""
        raw: socket.socket = getattr(sock, "_sock", sock)

        def feed() -> None:
            assert stdin is not None
            try:
                view = memoryview(stdin)
                while view:
                    sent = raw.send(view[: 1 << 16])
                    view = view[sent:]
                raw.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the command ended (or closed its input) before reading it all

        try:
            ahead = execframes.read_ahead(sock)  # first: the socket is non-blocking while it reads
            if stdin is not None:
                threading.Thread(target=feed, name="exec-stdin", daemon=True).start()
            yield from execframes.frames_until_stopped(sock, running, ahead)
        except (docker_socket.SocketError, OSError, ValueError):
            return  # the connection closed as the container went away
        finally:
            # The HTTP response the SDK keeps on the socket first: closed after its file
            # (at garbage collection), Python 3.13 reports a flush of a closed file.
            response = getattr(sock, "_response", None)
            if response is not None:
                with contextlib.suppress(OSError, ValueError):
                    response.close()
            sock.close()
            raw.close()

    def flavour(self) -> str:
        return podman.engine_kind(self).flavour

    # The networks module (and the egress proxy's, which it imports) is loaded only when
    # a run needs a network: a ``none`` run does not pay for importing it.
    def set_up_network(self, spec: ContainerSpec) -> ManagedObject | None:
        if spec.network.mode == "none":
            return None
        from orchestrator.docker import networks

        return networks.set_up_network(self, spec)

    def network_decisions(self, spec: ContainerSpec, since: datetime) -> EgressLog:
        from orchestrator.docker import networks

        return networks.network_decisions(self, spec, since)

    def collect_shared(self, idle_seconds: float) -> list[str]:
        from orchestrator.docker import networks

        return networks.collect_shared(self, idle_seconds)

    # -- a run's credential proxy --------------------------------------------------------

    def image_ca_bundle(self, image: str) -> bytes:
        return self.ca_bundles.read(self, image)

    def start_credential_proxy(self, spec: ContainerSpec, state: Path, user: str) -> str:
        podman.check_spec(self, spec)
        return credproxy.start_proxy(self, spec, state, user, spares=self.spares)

    def credential_proxy_log(self, container_id: str) -> str:
        return credproxy.proxy_log(self, container_id)

    def list_managed(self) -> list[ManagedObject]:
        # Only ``managed=true``: a container made from an image whose labels say otherwise
        # carries this label explicitly (labels.NEUTRAL), never the image's.
        label = {"label": f"{labels.MANAGED}=true"}
        found: list[ManagedObject] = []
        with engine_errors("listing the orchestrator's objects"):
            # Images carrying an owner (its builder refuses them; a commit of a run's
            # container carries one): a container whose owner and run id are its image's
            # was made by someone else.
            owners = {
                str(i["Id"]): _owner_of(i.get("Labels") or {})
                for i in self.api.images(all=True, filters={"label": labels.MANAGED})
            }
            for c in self.api.containers(all=True, filters=label):
                name = (c.get("Names") or [""])[0].lstrip("/")
                given = c.get("Labels") or {}
                if owners.get(str(c.get("ImageID") or "")) == _owner_of(given):
                    continue
                tags = credproxy_spares.owner_labels(name, given)
                found.append(ManagedObject("container", c["Id"], name, tags))
            # Build steps' containers carry no labels (they would pass into the image):
            # their names say who owns them (docker/build.py).
            for c in self.api.containers(all=True, filters={"name": buildnames.NAME_PREFIX}):
                name = (c.get("Names") or [""])[0].lstrip("/")
                owner = buildnames.owner_labels(name)
                if owner is not None:
                    found.append(ManagedObject("container", c["Id"], name, owner))
            for n in self.api.networks(filters=label):
                found.append(ManagedObject("network", n["Id"], n["Name"], n.get("Labels") or {}))
            for v in self.api.volumes(filters=label).get("Volumes") or []:
                found.append(ManagedObject("volume", v["Name"], v["Name"], v.get("Labels") or {}))
        return found

    def remove_object(self, obj: ManagedObject) -> bool:
        if obj.kind == "network":  # a run's network: the shared proxy leaves it first
            from orchestrator.docker import networks

            if not networks.release_network(self, obj.id):
                raise EngineError(f"network {obj.name} is still in use")
            return True
        with engine_errors(f"removing {obj.kind} {obj.name}"):
            try:
                if obj.kind == "container":
                    self.api.remove_container(obj.id, force=True, v=True)
                else:
                    self.api.remove_volume(obj.id, force=True)
            except docker_errors.NotFound:
                pass
            except docker_errors.APIError as exc:
                if "already in progress" not in str(exc.explanation or ""):
                    raise  # another gc is removing it: as good as gone
        return True


def _owner_of(found: dict[str, str]) -> tuple[str, str, str, str]:
    """The owner labels of a container (or an image) and its run id, as ``gc`` compares
    them: a container the orchestrator made has its owner and a run id of its own (a
    container made from a snapshot of a run gets a new run id), never all its image's."""
    return (found.get(labels.OWNER_PID, ""), found.get(labels.OWNER_START, ""),
            found.get(labels.OWNER_NS, ""), found.get(labels.RUN_ID, ""))  # fmt: skip
