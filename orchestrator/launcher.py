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
``ORCHESTRATOR_NO_SERVER=1`` never asks. The wire protocol and the checks are in
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

from orchestrator import TYPE_CHECKING
from orchestrator.cli.wire import (
    FORWARDED,
    GREETING,
    HEADER,
    Unusable,
    encode_request,
    fingerprint,
    peer_uid_pid,
    read_line,
    socket_path,
)
from orchestrator.exits import Exit, signalled

if TYPE_CHECKING:
    from types import FrameType
    from typing import NoReturn

NO_SERVER = "ORCHESTRATOR_NO_SERVER"
DEBUG = "ORCHESTRATOR_SERVER_DEBUG"
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
            raise Unusable(
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
    if os.environ.get(NO_SERVER, "") not in {"", "0"}:
        return True
    words = [word for word in argv if not word.startswith("-")]
    return any(tuple(words[: len(command)]) == command for command in LOCAL_ONLY)


def serves_mcp(argv: list[str]) -> bool:
    """Whether ``argv`` is ``mcp WORKER ...``, whose client must be answered at once
    (docs/mcp.md); not its help."""
    return argv[:1] == ["mcp"] and not {"-h", "--help"} & set(argv)


def main() -> NoReturn:
    """``orchestrator``: through the fork server when one is usable, else in this process."""
    argv = sys.argv[1:]
    if local(argv):
        _debug(f"not using the server: {NO_SERVER} is set, or this command always runs here")
    else:
        try:
            raise SystemExit(through_server(argv))
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
        # The process ends here. Its objects move out of the collector's reach, so the
        # interpreter's last collections do not walk the hundreds of thousands the imports
        # made (tens of milliseconds of a plain command: docs/performance.md). atexit
        # handlers still run, and objects not in a cycle are still freed as before.
        gc.freeze()
