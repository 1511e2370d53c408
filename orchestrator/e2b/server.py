"""Starting the E2B server: its key (a 0600 file in the project's state root), a socket
on 127.0.0.1, the printed exports, uvicorn until Ctrl-C or SIGTERM, every sandbox killed
on the way out."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import OrchestratorError

__all__ = ["KEY_FILE", "LOOPBACK", "E2bError", "serve"]

#: The only address the server listens on.
LOOPBACK = "127.0.0.1"
#: The key's file in the project's state root.
KEY_FILE = "e2b-api-key"


class E2bError(OrchestratorError):
    """The E2B server cannot start (a bad port, a missing extra, an unreadable key)."""


def api_key(state_fd: int) -> str:
    """The server's key: read from :data:`KEY_FILE` in the state root (``state_fd``), or
    made there (mode 0600, never through a link) on the first start."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(KEY_FILE, flags, dir_fd=state_fd)
    except FileNotFoundError:
        key = "e2b_" + secrets.token_hex(20)
        try:
            fd = os.open(
                KEY_FILE,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=state_fd,
            )
        except FileExistsError:  # another server made it meanwhile
            return api_key(state_fd)
        with os.fdopen(fd, "w") as out:
            out.write(key + "\n")
        return key
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise E2bError(f"{KEY_FILE} in the state root is a link; remove it") from None
        raise
    with os.fdopen(fd) as held:
        info = os.fstat(held.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise E2bError(
                f"{KEY_FILE} in the state root is not yours alone (mode "
                f"{info.st_mode & 0o777:04o}); remove it and start again for a new key"
            )
        key = held.read().strip()
    if not key:
        raise E2bError(f"{KEY_FILE} in the state root is empty; remove it")
    return key


def serve(project_dir: Path, *, port: int = 0, announce: Callable[[str, str], None]) -> None:
    """Serve the E2B API for ``project_dir`` on 127.0.0.1:``port`` (0: any free port)
    until interrupted; ``announce`` gets the base address and the key once listening."""
    try:
        import uvicorn

        from orchestrator.e2b.app import make_app
    except ImportError as exc:
        raise E2bError(
            f"the E2B server needs the 'e2b' extra ({exc.name} is missing): "
            "pip install 'orchestrator[e2b]'"
        ) from None
    from orchestrator.config import load_project
    from orchestrator.e2b.sandboxes import Sandboxes
    from orchestrator.review.server import _cleaned_up_on_sigterm
    from orchestrator.runtime.state_root import open_state_root

    project = load_project(project_dir.resolve())
    state_fd = open_state_root(project)
    try:
        key = api_key(state_fd)
    finally:
        os.close(state_fd)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise E2bError(
            f"--port {port}: cannot listen on {LOOPBACK}:{port} ({exc.strerror}); "
            "pick another port or leave --port out"
        ) from None
    sandboxes = Sandboxes(project.root)
    with _cleaned_up_on_sigterm(), contextlib.ExitStack() as stack:
        stack.callback(sock.close)
        stack.callback(sandboxes.close)
        config = uvicorn.Config(
            make_app(sandboxes, key), log_level="warning", access_log=False, lifespan="off"
        )
        server = uvicorn.Server(config)
        announce(f"http://{LOOPBACK}:{sock.getsockname()[1]}", key)
        server.run(sockets=[sock])
