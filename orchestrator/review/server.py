"""Starting the console: a socket on 127.0.0.1, the printed address, uvicorn until Ctrl-C."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import OrchestratorError

__all__ = ["LOOPBACK", "ReviewError", "serve"]

#: The only address the console listens on.
LOOPBACK = "127.0.0.1"


class ReviewError(OrchestratorError):
    """The console cannot start (a bad address or port, a missing extra)."""


def serve(
    project_dir: Path,
    *,
    port: int = 0,
    listen: str = LOOPBACK,
    announce: Callable[[str], None],
) -> None:
    """Serve the console for ``project_dir`` on ``listen:port`` (0: any free port) until
    interrupted. ``announce`` gets the address to open, token included, once listening."""
    if listen != LOOPBACK:
        raise ReviewError(
            f"--listen {listen}: the review console listens on {LOOPBACK} only "
            "(its pages hold worker output and act with your rights); leave --listen out"
        )
    try:
        import uvicorn

        from orchestrator.review.app import make_app
        from orchestrator.review.guard import Secrets
    except ImportError as exc:
        raise ReviewError(
            f"the review console needs the 'review' extra ({exc.name} is missing): "
            "pip install 'orchestrator[review]'"
        ) from None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(128)  # listening before the address is printed: no refused first try
    except OSError as exc:
        sock.close()
        raise ReviewError(
            f"--port {port}: cannot listen on {LOOPBACK}:{port} ({exc.strerror}); "
            "pick another port or leave --port out"
        ) from None
    keys = Secrets(port=sock.getsockname()[1])
    app = make_app(project_dir, keys)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    announce(keys.url())
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
