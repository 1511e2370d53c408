"""``orchestrator review``: the review console, a local web page (docs/review.md).

The command is meant to be attached to the main command with ``cli.add_command(review)``.
It only starts :func:`orchestrator.review.server.serve`; errors are
:class:`~orchestrator.errors.OrchestratorError`\\ s (exit 125, one line).
"""

from __future__ import annotations

import threading
import webbrowser
from pathlib import Path

import click

from orchestrator.cli.options import project_option

__all__ = ["review"]


@click.command("review")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, help="Port (default: any free one)."
)
@click.option(
    "--listen",
    default="127.0.0.1",
    show_default=True,
    help="Address; any but 127.0.0.1 needs --tls-cert and --tls-key.",
)
@click.option(
    "--tls-cert",
    type=click.Path(path_type=Path),
    help="PEM certificate (chain) to serve HTTPS with.",
)
@click.option("--tls-key", type=click.Path(path_type=Path), help="PEM private key of --tls-cert.")
@click.option("--no-browser", is_flag=True, help="Only print the addresses; open no browser.")
@project_option
def review(
    port: int,
    listen: str,
    tls_cert: Path | None,
    tls_key: Path | None,
    no_browser: bool,
    project_dir: Path,
) -> None:
    """Serve the review console for the project on 127.0.0.1 until Ctrl-C.

    Prints `review console: http://127.0.0.1:PORT/PREFIX/?token=TOKEN` and a file that
    opens it; the browser is given the file, never the token. The token logs one browser
    in, once; the page 'Another browser' makes a new one. Another address only with
    --tls-cert and --tls-key (then https://ADDR:PORT/PREFIX/).
    """
    from orchestrator.review.server import serve

    def announce(url: str, forward: str) -> None:
        click.echo(f"review console: {url}")
        click.echo(f"or open {forward} (the token in both works once, in one browser)")
        if not no_browser:
            # The file's address on the command line, not the token's; in a thread: a
            # browser command that waits until the browser closes must not hold the server.
            threading.Thread(target=webbrowser.open, args=(forward,), daemon=True).start()

    serve(
        project_dir,
        port=port,
        listen=listen,
        tls_cert=tls_cert,
        tls_key=tls_key,
        announce=announce,
    )
