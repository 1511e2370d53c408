"""The ``orchestrator`` console entry point: hand the command to a fork server, or run it here.

Standard library only, so that the path through a running ``orchestrator serve`` costs an
interpreter start and little else (docs/server.md). If a server of the same user listens on
its private socket and was started from the same package files, this process passes it the
command's argv, working folder, environment and its own stdin/stdout/stderr descriptors
(SCM_RIGHTS), forwards SIGINT/SIGTERM/SIGHUP, and exits with the code the server reports.
Anything else (no server, a refused or stale socket, a folder or socket with the wrong owner
or modes, an outdated server, a server that does not serve this process because it is
confined otherwise than the server: see :mod:`orchestrator.cli.peer`) runs the command line
in this process instead: silently, or saying why when ``ORCHESTRATOR_SERVER_DEBUG=1``.
When no server was there at all, the command then starts one as it ends
(:func:`start_server`: ``orchestrator serve --auto``, detached, the folder's lock handed
over), unless :func:`autostart_refusal` says why not (``ORCHESTRATOR_NO_AUTOSTART=1``,
``mcp``, a process under NoNewPrivs or seccomp). ``ORCHESTRATOR_NO_SERVER=1`` never asks
and never starts one. A background job whose stdin is its terminal runs here (the
terminal is not its to hand over). The wire protocol and the checks are in
:mod:`orchestrator.cli.wire`. ``orchestrator mcp`` run here starts its stdio front first
(:mod:`orchestrator.tools.mcp_front`, standard library too), so its client's ``initialize``
is answered while the rest is imported.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time

from orchestrator import TYPE_CHECKING
from orchestrator.cli.wire import (
    FAILED_NAME,
    FORWARDED,
    GREETING,
    HEADER,
    LOCK_NAME,
    PRIORITY,
    Absent,
    Unusable,
    check_private,
    close_strays,
    encode_request,
    fingerprint,
    peer_uid_pid,
    read_line,
    socket_folder,
    socket_path,
)
from orchestrator.exits import Exit, signalled

if TYPE_CHECKING:
    from types import FrameType
    from typing import NoReturn

NO_SERVER = "ORCHESTRATOR_NO_SERVER"
NO_AUTOSTART = "ORCHESTRATOR_NO_AUTOSTART"
DEBUG = "ORCHESTRATOR_SERVER_DEBUG"
#: How long a server started on first use waits for a command before it exits.
IDLE = "ORCHESTRATOR_SERVER_IDLE"
IDLE_DEFAULT = "15m"
#: After a server started on first use failed, how long commands start no other.
RETRY_AFTER_S = 15 * 60
#: The pid of the command that started a server (set for ``serve --auto`` only).
STARTER = "ORCHESTRATOR_SERVER_STARTER"
#: How long a server started on first use waits for its starter to exit, at most.
STARTER_WAIT_S = 30.0
_CAP_SYS_NICE = 23
#: Commands that run here and never start a server: ``mcp`` is a long-lived process its
#: client starts and ends; a server it left behind would outlive that client's control.
NO_AUTOSTART_COMMANDS = (("mcp",),)
#: What of the environment a started server keeps (it serves each command with that
#: command's own environment): what its interpreter, locale and socket folder depend on.
SERVER_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV",
              "XDG_RUNTIME_DIR")  # fmt: skip
SERVER_ENV_PREFIXES = ("LC_", "PYTHON")
#: Commands that always run here: the server itself, and the session owner it would
#: otherwise hold (``session start`` spawns it detached, as a process of its own).
LOCAL_ONLY = (("serve",), ("session", "serve"))
#: How long ``orchestrator mcp`` lets its front answer the client's handshake alone before
#: importing the command line (clients send it at once; see docs/mcp.md).
MCP_HANDSHAKE_WAIT_S = 0.5
#: How long a client waits for a server's greeting before running the command itself.
GREETING_WAIT_S = 2.0


def connect() -> tuple[socket.socket, int]:
    """A checked connection to this user's up-to-date server, and the server's pid."""
    path = socket_path()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(GREETING_WAIT_S)
        try:
            sock.connect(path)
        except OSError as exc:
            problem = (
                Absent if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)) else Unusable
            )
            raise problem(
                f"cannot connect to {path}: {exc.strerror or exc} (a stale socket?)"
            ) from None
        uid, pid = peer_uid_pid(sock)
        if uid != os.getuid():
            raise Unusable(f"the process behind {path} runs as uid {uid}, not {os.getuid()}")
        try:
            greeting = read_line(sock)
        except (OSError, EOFError):
            raise Unusable(f"the server (pid {pid}) did not greet") from None
        if greeting.startswith(f"{GREETING} refused: "):
            reason = greeting.removeprefix(f"{GREETING} refused: ")
            raise Unusable(f"the server (pid {pid}) does not serve this process: {reason}")
        name, _, theirs = greeting.rpartition(" ")
        if name != GREETING:
            raise Unusable(f"the server (pid {pid}) speaks another protocol: {greeting!r}")
        if theirs != fingerprint():
            raise Unusable(
                f"the server (pid {pid}) was started from other package files or another "
                "Python; restart it: `orchestrator serve --stop` then `orchestrator serve`"
            )
    except BaseException:
        sock.close()
        raise
    return sock, pid


def _debug(message: str) -> None:
    if os.environ.get(DEBUG, "") not in {"", "0"}:
        print(f"orchestrator: {message}", file=sys.stderr, flush=True)


def through_server(argv: list[str]) -> int:
    """Run ``argv`` in a child of the server; its exit code. :class:`Unusable` before
    anything was started (the caller may then run the command itself)."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) != os.getpgrp():
            # A background job: here, reading the terminal stops it (SIGTTIN); a command
            # forked by the server has no controlling terminal and would take the input.
            raise Unusable("stdin is a terminal this process is not in the foreground of")
    except OSError:
        pass  # not this process's controlling terminal: no job control to keep
    sock, pid = connect()
    try:
        payload = encode_request(argv, os.getcwd(), dict(os.environ))
        try:
            socket.send_fds(sock, [HEADER.pack(len(payload))], [0, 1, 2])
        except OSError as exc:
            raise Unusable(f"cannot pass this command to the server (pid {pid}): {exc}") from None
        sock.settimeout(None)
        sock.sendall(payload)
        _debug(f"through the server (pid {pid})")

        def forward(signum: int, _frame: FrameType | None) -> None:
            try:  # noqa: SIM105 - contextlib is an import the entry point does without
                sock.send(bytes([signum]))
            except OSError:
                pass

        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        try:
            word, _, code = read_line(sock).partition(" ")
        except (OSError, EOFError):
            word, code = "", ""
        if word == "refused":  # checked again after the request: nothing was started
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            raise Unusable(f"the server (pid {pid}) does not serve this process: {code}")
        if word != "exit" or not code.lstrip("-").isdigit():
            print(
                f"orchestrator: the server (pid {pid}) ended the connection before the "
                "command's end; see the server's own output",
                file=sys.stderr,
            )
            return Exit.ERROR
        return int(code)
    finally:
        sock.close()


def local(argv: list[str]) -> bool:
    """Whether ``argv`` must run in this process whatever the server."""
    if _on(NO_SERVER, os.environ):
        return True
    words = _command(argv)
    return any(tuple(words[: len(command)]) == command for command in LOCAL_ONLY)


def _on(name: str, environ: dict[str, str] | os._Environ[str]) -> bool:
    return environ.get(name, "") not in {"", "0"}


def _command(argv: list[str]) -> list[str]:
    return [word for word in argv if not word.startswith("-")]


def parse_idle(text: str) -> int:
    """Seconds of ``90``, ``90s``, ``15m``, ``2h`` (ValueError otherwise)."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    if not number.isdigit() or int(number) == 0:
        raise ValueError(f"not a duration: {text!r}")
    return int(number) * units[unit]


def autostart_refusal(argv: list[str], environ: dict[str, str] | os._Environ[str],
                      status: dict[str, str]) -> str | None:  # fmt: skip
    """Why a command that found no server and ran here starts none (None: it starts one).
    ``status`` is this process's ``/proc/self/status`` as name: value."""
    if _on(NO_AUTOSTART, environ):
        return f"{NO_AUTOSTART} is set"
    words = _command(argv)
    if any(tuple(words[: len(command)]) == command for command in NO_AUTOSTART_COMMANDS):
        return f"`orchestrator {words[0]}` never starts one"
    confined = [name for name in ("NoNewPrivs", "Seccomp") if status.get(name, "0") != "0"]
    if confined:
        return (f"this process runs with {' and '.join(confined)} set; a server started "
                "from it would keep that confinement and refuse the others")  # fmt: skip
    idle = environ.get(IDLE, "")
    if idle:
        try:
            parse_idle(idle)
        except ValueError:
            return f"{IDLE}={idle!r} is not a duration such as 90s, 15m or 2h"
    return None


def own_status() -> dict[str, str]:
    """This process's ``/proc/self/status`` lines as name: value."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            return {n: v.strip() for n, _, v in (line.partition(":") for line in handle)}
    except OSError:
        return {"Seccomp": "unknown"}  # unreadable: treated as confined


def start_server(environ: dict[str, str] | os._Environ[str]) -> str:
    """Start ``orchestrator serve --auto`` in the background (a session of its own, stdio
    on /dev/null, this interpreter and package, the folder's lock handed over): what was
    done, for the debug line. Nothing is started when the lock is held (a server starts or
    runs) or the folder is not private."""
    import fcntl

    folder = socket_folder()
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"not starting a server: cannot create {folder}: {exc.strerror}"
    try:
        check_private(folder, "folder")
    except Unusable as exc:
        return f"not starting a server: {exc}"
    failed = os.path.join(folder, FAILED_NAME)
    try:
        if time.time() - os.lstat(failed).st_mtime < RETRY_AFTER_S:
            return (f"not starting a server: the last one failed (see {failed}; "
                    "`orchestrator serve` says why); trying again 15 min after it")  # fmt: skip
    except OSError:
        pass
    path = os.path.join(folder, LOCK_NAME)
    try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"not starting a server: {path}: {exc.strerror}"
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return "not starting a server: another one is starting or running"
        os.set_inheritable(lock, True)
        env = {k: v for k, v in environ.items()
               if k in SERVER_ENV or k.startswith(SERVER_ENV_PREFIXES)}  # fmt: skip
        env[STARTER] = str(os.getpid())
        idle = environ.get(IDLE, "") or IDLE_DEFAULT
        argv = [sys.executable, "-P", "-m", "orchestrator", "serve", "--auto",
                f"--lock-fd={lock}", f"--idle-exit={idle}"]  # fmt: skip
        pid = os.posix_spawn(
            sys.executable,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE),
        )
    except OSError as exc:
        return f"not starting a server: {exc}"
    finally:
        os.close(lock)  # the server holds the lock through its own copy
    return f"started a server (pid {pid}; it exits after {idle} without a command)"


def settle_started_server(argv: list[str]) -> None:
    """In ``serve --auto ...`` (``argv``), before anything is imported: drop the
    descriptors inherited but the lock; when a command started it, wait until that command
    has exited (it ends at once), so that the loading never shares its time; then load at
    the lowest priority if this process may restore its own afterwards (named in
    :data:`~orchestrator.cli.wire.PRIORITY`, restored by the server before it serves: a
    command it serves runs at the priority it had)."""
    handed = [word.partition("=")[2] for word in argv if word.startswith("--lock-fd=")]
    close_strays(int(handed[0]) if handed and handed[0].isdigit() else None)
    starter = os.environ.pop(STARTER, "")
    if starter.isdigit():
        deadline = time.monotonic() + STARTER_WAIT_S
        while os.getppid() == int(starter) and time.monotonic() < deadline:
            time.sleep(0.01)
    import resource

    before = os.getpriority(os.PRIO_PROCESS, 0)
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    allowed = soft == resource.RLIM_INFINITY or 20 - before <= soft
    if allowed or int(own_status().get("CapEff", "0"), 16) >> _CAP_SYS_NICE & 1:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        os.environ[PRIORITY] = str(before)


def serves_mcp(argv: list[str]) -> bool:
    """Whether ``argv`` is ``mcp WORKER ...``, whose client must be answered at once
    (docs/mcp.md); not its help."""
    return argv[:1] == ["mcp"] and not {"-h", "--help"} & set(argv)


def main() -> NoReturn:
    """``orchestrator``: through the fork server when one is usable, else in this process."""
    argv = sys.argv[1:]
    autostart = False
    if argv[:2] == ["serve", "--auto"]:
        settle_started_server(argv)
    if local(argv):
        _debug(f"not using the server: {NO_SERVER} is set, or this command always runs here")
    else:
        try:
            raise SystemExit(through_server(argv))
        except Absent as exc:
            _debug(f"not using the server: {exc}")
            refusal = autostart_refusal(argv, os.environ, own_status())
            autostart = refusal is None
            if refusal is not None:
                _debug(f"not starting a server: {refusal}")
        except (Unusable, OSError) as exc:
            _debug(f"not using the server: {exc}")
        except KeyboardInterrupt:
            raise SystemExit(signalled(signal.SIGINT)) from None
    if serves_mcp(argv):
        # Answer the MCP client's handshake now, before the command line is imported.
        from orchestrator.tools import mcp_front

        mcp_front.start().wait_for_handshake(MCP_HANDSHAKE_WAIT_S)
    from orchestrator.cli.main import main as cli_main

    try:
        cli_main(argv)
    finally:
        if autostart:  # after the command: its own time is not shared with the preloading
            _debug(start_server(os.environ))
        # The process ends here. Its objects move out of the collector's reach, so the
        # interpreter's last collections do not walk the hundreds of thousands the imports
        # made (tens of milliseconds of a plain command: docs/performance.md). atexit
        # handlers still run, and objects not in a cycle are still freed as before.
        gc.freeze()
