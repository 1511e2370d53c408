"""Starting the console: a socket on 127.0.0.1 (or, with a TLS certificate and key, on the
``--listen`` address), the printed address, uvicorn until Ctrl-C."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
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
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    announce: Callable[[str, str], None],
) -> None:
    """Serve the console for ``project_dir`` on ``listen:port`` (0: any free port) until
    interrupted. ``announce`` gets, once listening, the address to open (its single-use
    token included) and the ``file://`` address of the forward file that logs a browser
    in without that token on its command line (:mod:`orchestrator.review.opener`). Any
    address but :data:`LOOPBACK` needs ``tls_cert`` and ``tls_key`` (HTTPS)."""
    if (tls_cert is None) != (tls_key is None):
        raise ReviewError("--tls-cert and --tls-key go together: give both, or neither")
    tls = tls_cert is not None and tls_key is not None
    if listen != LOOPBACK and not tls:
        raise ReviewError(
            f"--listen {listen}: the review console listens on {LOOPBACK} only unless it "
            "serves HTTPS (its pages hold worker output and act with your rights); add "
            "--tls-cert FILE --tls-key FILE, or leave --listen out"
        )
    family = _family(listen)
    if tls_cert is not None and tls_key is not None:
        _check_tls(tls_cert, tls_key)
    try:
        import uvicorn

        from orchestrator.review.app import make_app
        from orchestrator.review.guard import Secrets
        from orchestrator.review.opener import ForwardFile
    except ImportError as exc:
        raise ReviewError(
            f"the review console needs the 'review' extra ({exc.name} is missing): "
            "pip install 'orchestrator[review]'"
        ) from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((listen, port))
        sock.listen(128)  # listening before the address is printed: no refused first try
    except OSError as exc:
        sock.close()
        raise ReviewError(
            f"--port {port}: cannot listen on {listen}:{port} ({exc.strerror}); "
            "pick another port or leave --port out"
        ) from None
    with _cleaned_up_on_sigterm(), contextlib.ExitStack() as stack:
        stack.callback(sock.close)
        keys = Secrets(sock.getsockname()[1], address=listen, tls=tls)
        app = make_app(project_dir, keys)
        try:
            forward = stack.enter_context(ForwardFile(keys.login, keys.token))
        except OSError as exc:
            where = exc.filename or "a new folder"
            raise ReviewError(
                f"cannot write the file that opens the browser ({where}: {exc.strerror}); "
                "set XDG_RUNTIME_DIR or TMPDIR to a folder you can write"
            ) from None
        keys.on_first_login = forward.remove  # the file holds the token: gone once spent
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ssl_certfile=str(tls_cert) if tls_cert is not None else None,
            ssl_keyfile=str(tls_key) if tls_key is not None else None,
        )
        server = uvicorn.Server(config)
        announce(keys.url(), forward.uri)
        server.run(sockets=[sock])


class _Terminated(BaseException):
    """SIGTERM, raised once uvicorn has shut down, so that the forward file goes too."""


@contextlib.contextmanager
def _cleaned_up_on_sigterm() -> Iterator[None]:
    """Run the block with SIGTERM raising :class:`_Terminated`: uvicorn shuts down on it,
    then raises it again with the handler it found, and the default one would end the
    process before the block's clean-up (the forward file's removal). Once the block is
    left, the process ends by SIGTERM as it would have."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM) from None  # should the signal not end it
    finally:
        if signal.getsignal(signal.SIGTERM) is terminated:
            signal.signal(signal.SIGTERM, previous)


def _family(listen: str) -> socket.AddressFamily:
    """The socket family of ``listen``, an IP address (names are refused: say which one)."""
    try:
        address = ipaddress.ip_address(listen)
    except ValueError:
        raise ReviewError(
            f"--listen {listen}: give an IP address (such as 127.0.0.1 or 192.0.2.10), not a name"
        ) from None
    if address.is_unspecified:
        raise ReviewError(
            f"--listen {listen}: give the one address the console is opened at (the Host "
            "header of every request is checked against it), not every address"
        )
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


def _check_tls(cert: Path, key: Path) -> None:
    """Refuse, in one line, a certificate or key that cannot be loaded, before starting."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise ReviewError(
            f"--tls-cert/--tls-key: {exc.filename} does not exist; give PEM files"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise ReviewError(
            f"--tls-cert {cert} --tls-key {key}: cannot be loaded as a PEM certificate and "
            f"its private key ({getattr(exc, 'reason', None) or exc}); check both files"
        ) from None
