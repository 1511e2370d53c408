"""``orchestrator serve``: a fork server that runs commands at in-process speed.

The server imports what a command needs once (click, the config models and pydantic, the
Docker SDK, the runtime), then waits on a unix socket in a private per-user folder
(:func:`orchestrator.wire.socket_folder`). It opens no engine connection and starts no
thread: each command runs in a fresh ``fork()`` of that pristine process, which takes the
client's argv, working folder, environment and stdin/stdout/stderr, and runs the same
:func:`~orchestrator.cli.main.main` a local command runs. The child's pid owns the run (its
labels), so ``gc`` judges liveness as usual. The server itself only relays: signals from the
client to its child, and the child's exit code back. A client that goes away (even killed)
gets its child terminated: SIGTERM, so the command cleans up, then SIGKILL after a grace.
Only the holder of the folder's lock (``server.lock``, flock) binds the socket. ``--auto``
(a server a command started on first use, :mod:`orchestrator.launcher`) runs from ``/``,
exits quietly when another holds the lock, after ``--idle-exit`` (15 min) without a
command, and once its fingerprint changes (an upgrade).

Security model: same uid only (the folder is 0700, the socket 0600, both checked with
lstat by both sides, and each side checks the other's SO_PEERCRED uid), and only a client
confined as the server is (groups, NoNewPrivs, seccomp, capabilities, namespaces: see
:mod:`orchestrator.cli.peer`; any other runs its command itself), whose umask and resource
limits the command takes; nothing of one command (engine connection, caches, state)
reaches another, since each is a new fork of a process that never ran one.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click

from orchestrator.cli import peer, wire
from orchestrator.errors import OrchestratorError
from orchestrator.exits import Exit

#: The command line's modules that ``orchestrator.cli.main`` imports only when their command
#: is named (``main.ELSEWHERE``); a server has them all loaded.
CLI_MODULES = ("apply", "audit", "batch", "build", "clear", "doctor", "e2b", "engine", "mcp",
               "review", "session", "staged")  # fmt: skip
#: What a command imports before its first engine call, loaded once by the server.
PRELOAD = (
    "ctypes",
    "cryptography.hazmat.primitives.asymmetric.ec",
    "cryptography.x509",
    "docker",
    "yaml",
    "orchestrator.cli.main",
    *(f"orchestrator.cli.{name}" for name in CLI_MODULES),
    "orchestrator.config.loader",
    "orchestrator.config.models",
    "orchestrator.docker.client",
    "orchestrator.docker.engine",
    "orchestrator.plan",
    "orchestrator.policy",
    "orchestrator.runner",
    "orchestrator.runtime",
    "orchestrator.runtime.gc",
    "orchestrator.runtime.run",
    "orchestrator.runtime.session",
    "orchestrator.staging",
)
#: From a client's disconnection to SIGKILL of its command, if SIGTERM was not enough.
KILL_GRACE_S = 10.0
#: The idle exit of a server started on first use (``--auto``).
AUTO_IDLE = "15m"
AUTO_IDLE_S = 15 * 60.0
#: How often a server started on first use checks that its package files are unchanged.
OUTDATED_CHECK_S = 30.0
#: How long a connected client has to send its request.
REQUEST_WAIT_S = 5.0
#: How long ``--stop`` waits for the server to finish its commands and go.
STOP_WAIT_S = KILL_GRACE_S + 5.0
_WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)


#: The command line's entry point, run in each forked child with the client's arguments.
Entry = Callable[[list[str]], object]


def serve_command(entry: Entry) -> click.Command:
    """``orchestrator serve``, whose children run ``entry`` (the CLI's ``main``)."""
    from orchestrator.cli.options import parse_duration_option

    @click.command("serve")
    @click.option("--stop", is_flag=True, help="Stop this user's server, then exit.")
    @click.option(
        "--idle-exit",
        metavar="DURATION",
        callback=parse_duration_option,
        help="Exit after this long without a command (90s, 15m, 2h; default: never, "
        f"or {AUTO_IDLE} with --auto).",
    )
    @click.option(
        "--auto",
        is_flag=True,
        help="As started on first use by a command (docs/server.md): runs from /, exits "
        "quietly if a server already runs, exits when its package files change.",
    )
    @click.option("--lock-fd", type=int, hidden=True, help="The folder's lock, held already.")
    def serve(stop: bool, idle_exit: float | None, auto: bool, lock_fd: int | None) -> None:
        """Serve this user's commands from one warm process (foreground; see docs/server.md).

        Each `orchestrator` command finds the server's socket and runs in a fork of it, with
        the same output, prompts and exit code as when run alone, minus the start-up time.
        Commands run by themselves again when the server is gone or outdated.
        """
        if auto and idle_exit is None:
            idle_exit = AUTO_IDLE_S
        try:
            _serve(entry, stop, Options(idle_exit, auto, lock_fd))
        except Exception as exc:
            if auto:  # nobody sees its output: the next commands read why and wait
                _record_failure(exc)
            raise

    return serve


@dataclass(frozen=True)
class Options:
    """How a server runs: its idle exit (seconds, None: never), whether it was started
    on first use (``--auto``), the lock descriptor it was handed."""

    idle_exit: float | None = None
    auto: bool = False
    lock_fd: int | None = None


def _serve(entry: Entry, stop: bool, options: Options | None = None) -> None:
    from orchestrator.cli.terminal import say

    options = options or Options()
    if stop:
        say(stop_server())
        return
    if options.auto:  # hold no folder of the caller, no descriptor but the lock
        os.chdir("/")
        wire.close_strays(options.lock_fd)
    folder = _prepare_folder()
    path = folder / wire.SOCKET_NAME
    lock = _lock(folder, options.lock_fd)
    if lock is None:
        if options.auto:
            return  # another server starts or runs: it serves
        pid = _listening(path)
        raise OrchestratorError(
            f"a server already listens on {path} (pid {pid}); stop it with "
            "`orchestrator serve --stop`"
            if pid
            else f"a server is starting in {folder}; stop it with `orchestrator serve --stop`"
        )
    pid = _listening(path)
    if pid:  # a server without the lock (an older version) listens
        os.close(lock)
        if options.auto:
            return
        raise OrchestratorError(
            f"a server already listens on {path} (pid {pid}); stop it with "
            "`orchestrator serve --stop`"
        )
    for name in PRELOAD:
        importlib.import_module(name)
    _restore_priority()
    # A fork copies only the calling thread: none may exist, Python's or a native
    # library's (a Go runtime starts several as it loads).
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        raise OrchestratorError("cannot serve: a thread was started while preloading")
    for fd in (0, 1, 2):  # commands' descriptors must never land on 0-2 here
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    listener = _bind(path)
    with contextlib.suppress(FileNotFoundError):
        (folder / wire.FAILED_NAME).unlink()
    say(f"serving on {path} (pid {os.getpid()}); stop with `orchestrator serve --stop`")
    ForkServer(listener, path, entry, options, lock).run()
    say("server stopped")


def _restore_priority() -> None:
    """After a server started on first use loaded at the lowest priority: its own again
    (its commands run at it)."""
    text = os.environ.pop(wire.PRIORITY, "")
    if not text.lstrip("-").isdigit():
        return
    wanted = int(text)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, wanted)
    except OSError as exc:
        raise OrchestratorError(f"cannot serve: cannot restore priority {wanted}: {exc}") from None
    if os.getpriority(os.PRIO_PROCESS, 0) != wanted:
        raise OrchestratorError(f"cannot serve: priority {wanted} was not restored")


def _lock(folder: Path, handed: int | None) -> int | None:
    """The folder's lock (flock), held: its descriptor; None when another process holds it.
    Only its holder binds the socket (or replaces a stale one): two servers starting at
    once do not both listen."""
    import fcntl

    path = folder / wire.LOCK_NAME
    try:
        if handed is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        else:
            fd = handed
            ours, theirs = os.fstat(fd), os.lstat(path)
            if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
                raise OrchestratorError(f"cannot serve: --lock-fd {fd} is not {path}")
            os.set_inheritable(fd, False)
    except OSError as exc:
        raise OrchestratorError(f"cannot serve: {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _listening(path: Path) -> int | None:
    """The pid of the process listening on ``path``, if one does."""
    if not os.path.lexists(path):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return None
        return wire.peer_uid_pid(probe)[1]


def stop_server() -> str:
    """Ask this user's server to stop (SIGTERM) and wait until it has; what happened."""
    try:
        path = wire.socket_path()
    except wire.Unusable as exc:
        return f"no server to stop: {exc}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError as exc:
            return f"no server to stop: {path}: {exc.strerror or exc}"
        uid, pid = wire.peer_uid_pid(sock)
    if uid != os.getuid():
        raise OrchestratorError(f"the process behind {path} runs as uid {uid}; not stopping it")
    _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(pid):
        raise OrchestratorError(f"the server (pid {pid}) is still there after {STOP_WAIT_S:g} s")
    return f"stopped the server (pid {pid})"


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (its commands finished, it has exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _record_failure(exc: Exception) -> None:
    """Write why this server started on first use could not serve, in its folder (the
    commands then start none for a while: :data:`orchestrator.launcher.RETRY_AFTER_S`)."""
    with contextlib.suppress(OSError, wire.Unusable):
        folder = wire.socket_folder()
        wire.check_private(folder, "folder")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(os.path.join(folder, wire.FAILED_NAME), flags, 0o600)
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(f"{exc}\n")


def _prepare_folder() -> Path:
    folder = Path(wire.socket_folder())
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise OrchestratorError(f"cannot serve: cannot create {folder}: {exc.strerror}") from None
    try:
        wire.check_private(str(folder), "folder")
    except wire.Unusable as exc:
        raise OrchestratorError(
            f"cannot serve: {exc}; remove it, or set XDG_RUNTIME_DIR to a private folder"
        ) from None
    return folder


def _bind(path: Path) -> socket.socket:
    """Listen on ``path`` (the caller holds the folder's lock and found no listener: a
    socket there is stale)."""
    if os.path.lexists(path):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(mask)
    os.chmod(path, 0o600)
    listener.listen(64)
    listener.setblocking(False)
    return listener


@dataclass
class Command:
    """One client's command: its connection and the child running it."""

    conn: socket.socket
    pid: int
    kill_at: float | None = None
    connected: bool = True


class ForkServer:
    """The accept/fork/relay loop: one thread, a selector, a self-pipe for signals."""

    def __init__(self, listener: socket.socket, path: Path, entry: Entry,
                 options: Options | None = None, lock: int | None = None) -> None:  # fmt: skip
        self.entry = entry
        self.options = options or Options()
        self.lock = lock
        self.quiet_since = time.monotonic()
        self.checked_at = time.monotonic()
        self.listener: socket.socket | None = listener
        self.path = path
        self.inode = os.lstat(path).st_ino
        self.fingerprint = wire.fingerprint()
        self.confinement = peer.confinement("self")
        self.commands: dict[int, Command] = {}
        self.stopping = False
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def run(self) -> None:
        assert self.listener is not None
        signal.set_wakeup_fd(self.wake_w)
        for sig in _WATCHED:
            signal.signal(sig, self._on_signal)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self.stopping or self.commands:
                if self.stopping and self.listener is not None:
                    self._close_listener()
                    for command in self.commands.values():
                        self._terminate(command)
                for key, _ in self.selector.select(self._timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        os.read(self.wake_r, 512)
                    else:
                        self._from_client(key.data)
                self._reap()
                self._kill_overdue()
                self._stop_if_idle_or_outdated()
        finally:
            self._close_listener()
            signal.set_wakeup_fd(-1)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:
            self.stopping = True

    def _timeout(self) -> float | None:
        deadlines = [c.kill_at for c in self.commands.values() if c.kill_at is not None]
        if self.options.idle_exit is not None and not self.commands and not self.stopping:
            deadlines.append(self.quiet_since + self.options.idle_exit)
        if self.options.auto and not self.stopping:
            deadlines.append(self.checked_at + OUTDATED_CHECK_S)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _stop_if_idle_or_outdated(self) -> None:
        """Stop after the idle time without a command; a server started on first use
        also stops once its package files changed (no client would use it again)."""
        now = time.monotonic()
        idle = self.options.idle_exit
        if idle is not None and not self.commands and now >= self.quiet_since + idle:
            self.stopping = True
        if self.options.auto and now >= self.checked_at + OUTDATED_CHECK_S:
            self.checked_at = now
            if wire.fingerprint() != self.fingerprint:
                self.stopping = True

    def _close_listener(self) -> None:
        if self.listener is None:
            return
        self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None
        try:
            if os.lstat(self.path).st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass
        if self.lock is not None:  # the socket is gone: another server may start
            os.close(self.lock)
            self.lock = None

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except BlockingIOError:
            return
        self.quiet_since = time.monotonic()
        fds: list[int] = []
        pidfd = -1
        try:
            conn.settimeout(REQUEST_WAIT_S)
            uid, client = wire.peer_uid_pid(conn)
            if uid != os.getuid():
                raise ValueError("another uid")
            pidfd, seen = self._check(conn, client)
            conn.sendall(f"{wire.GREETING} {self.fingerprint}\n".encode())
            header, fds, _flags, _addr = socket.recv_fds(conn, wire.HEADER.size, 3)
            while header and len(header) < wire.HEADER.size:
                header += conn.recv(wire.HEADER.size - len(header))
            if len(fds) != 3 or len(header) != wire.HEADER.size:
                raise ValueError("no request")
            (size,) = wire.HEADER.unpack(header)
            payload = bytearray()
            while len(payload) < size:
                chunk = conn.recv(min(size - len(payload), 1 << 20))
                if not chunk:
                    raise ValueError("short request")
                payload += chunk
            argv, cwd, env = wire.decode_request(bytes(payload))
            taken = self._recheck(conn, client, pidfd, seen)
            os.close(pidfd)  # not the child's
            pidfd = -1
            pid = self._fork(conn, fds, argv, cwd, env, taken)
        except (OSError, ValueError, peer.Unreadable):  # a client gone, confused or refused
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
            if pidfd >= 0:
                os.close(pidfd)
        conn.setblocking(False)
        self.commands[pid] = Command(conn, pid)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _check(self, conn: socket.socket, client: int) -> tuple[int, dict[str, str]]:
        """Before the greeting: a pidfd of the client and what confines it, the server's
        own; else the client is told why it must run its command itself (ValueError)."""
        try:
            pidfd = peer.peer_pidfd(conn, client)
        except (OSError, peer.Unreadable) as exc:
            _refuse(conn, f"{wire.GREETING} refused:", str(exc))
        try:
            seen = peer.confinement(client)
            if not peer.still_running(pidfd):
                raise peer.Unreadable(f"the process that connected (pid {client}) is gone")
        except peer.Unreadable as exc:
            os.close(pidfd)
            _refuse(conn, f"{wire.GREETING} refused:", str(exc))
        differ = peer.differences(seen, self.confinement)
        try:
            differ += peer.unmatched_limits(peer.taken(client), self.confinement.get("CapEff", ""))
        except peer.Unreadable as exc:
            differ.append(str(exc))
        if differ:
            os.close(pidfd)
            _refuse(conn, f"{wire.GREETING} refused:", "; ".join(differ))
        return pidfd, seen

    def _recheck(
        self, conn: socket.socket, client: int, pidfd: int, seen: dict[str, str]
    ) -> peer.Taken:
        """After the request: the client's umask and limits, once it is checked to be the
        same process, confined as it was (else it is refused: ValueError)."""
        try:
            now = peer.confinement(client)
            taken = peer.taken(client)
        except peer.Unreadable as exc:
            _refuse(conn, "refused", str(exc))
        if not peer.still_running(pidfd):
            raise ValueError("the client is gone")
        differ = peer.differences(now, seen)
        if differ:
            _refuse(conn, "refused", "it changed since it connected: " + "; ".join(differ))
        above = peer.unmatched_limits(taken, self.confinement.get("CapEff", ""))
        if above:
            _refuse(conn, "refused", "; ".join(above))
        return taken

    def _fork(self, conn: socket.socket, fds: list[int], argv: list[str], cwd: str,
              env: dict[str, str], taken: peer.Taken) -> int:  # fmt: skip
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                _end_with(server)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for sig in _WATCHED[1:]:
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                same_uid = wire.peer_uid_pid(conn)[0] == os.getuid()
                self._close_inherited()
                conn.close()
                os.setsid()  # out of the server's terminal and process group
                code = (
                    _run_command(self.entry, argv, cwd, env, fds, taken) if same_uid else Exit.ERROR
                )
            except BaseException:  # noqa: BLE001 - nothing may unwind into the server's loop
                code = Exit.ERROR
            os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return pid

    def _close_inherited(self) -> None:
        """In a child: drop the server's own descriptors."""
        if self.listener is not None:
            self.listener.close()
        for command in self.commands.values():
            command.conn.close()
        self.selector.close()
        if self.lock is not None:
            os.close(self.lock)
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _from_client(self, pid: int) -> None:
        command = self.commands[pid]
        try:
            data = command.conn.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client is gone: its command must not outlive it
            self._disconnect(command)
            self._terminate(command)
            return
        for signum in data:
            if signum in wire.FORWARDED:
                _kill(pid, signum)

    def _terminate(self, command: Command) -> None:
        if command.kill_at is None:
            _kill(command.pid, signal.SIGTERM)
            command.kill_at = time.monotonic() + KILL_GRACE_S

    def _kill_overdue(self) -> None:
        now = time.monotonic()
        for command in self.commands.values():
            if command.kill_at is not None and command.kill_at <= now:
                _kill(command.pid, signal.SIGKILL)
                command.kill_at = now + KILL_GRACE_S

    def _disconnect(self, command: Command) -> None:
        if command.connected:
            command.connected = False
            self.selector.unregister(command.conn)
            command.conn.close()

    def _reap(self) -> None:
        while self.commands:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            command = self.commands.pop(pid, None)
            if command is None:
                continue
            self.quiet_since = time.monotonic()
            if command.connected:
                try:
                    command.conn.setblocking(True)
                    command.conn.sendall(f"exit {128 - code if code < 0 else code}\n".encode())
                except OSError:
                    pass
                self._disconnect(command)


def _refuse(conn: socket.socket, word: str, reason: str) -> NoReturn:
    """Tell a client why it must run its command itself (one line), then give up on it."""
    with contextlib.suppress(OSError):
        line = f"{word} {' '.join(reason.split())}"[: wire.LINE_LIMIT - 1]
        conn.sendall(f"{line}\n".encode(errors="replace"))
    raise ValueError(reason)


def _end_with(server: int) -> None:
    """In a child: get SIGTERM when the server dies (Linux PR_SET_PDEATHSIG), so that a
    command never outlives the server that relays for its client."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGTERM, 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != server:  # it died before the request took effect
        os._exit(Exit.ERROR)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _run_command(
    entry: Entry, argv: list[str], cwd: str, env: dict[str, str], fds: list[int], taken: peer.Taken
) -> int:
    """In a fresh child: become the client's command, run it, return its exit code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    try:
        peer.apply(taken)  # the client's umask and resource limits
    except (OSError, ValueError) as exc:
        print(f"orchestrator: error: cannot take the caller's limits: {exc}", file=sys.stderr)
        return Exit.ERROR
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["orchestrator", *argv]
    _replace_stdio()
    code = 1
    try:
        try:
            os.chdir(cwd)
        except OSError as exc:
            print(f"orchestrator: error: cannot enter {cwd}: {exc.strerror}", file=sys.stderr)
            return Exit.ERROR
        from orchestrator import labels

        labels.current_owner.cache_clear()  # this child owns its runs
        entry(argv)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # noqa: BLE001 - what an uncaught error does in a local command
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    return code


def _exit_code(code: Any) -> int:
    """What Python makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _replace_stdio() -> None:
    """New ``sys.std*`` objects over the passed descriptors, buffered as Python would."""
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        tty = os.isatty(fd)
        raw: Any = open(fd, "rb" if fd == 0 else "wb", closefd=False)  # noqa: SIM115
        stream = io.TextIOWrapper(
            raw,
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=fd == 2 or (fd == 1 and tty),
            write_through=fd == 2,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
