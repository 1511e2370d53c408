"""``orchestrator e2b serve``: an E2B-compatible server over the project's sessions
(docs/e2b.md). Errors are :class:`~orchestrator.errors.OrchestratorError`\\ s (exit 125,
one line)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator.cli.options import project_option

__all__ = ["e2b"]


@click.group("e2b")
def e2b() -> None:
    """Serve E2B's API, so that code written for the e2b SDK runs in this project's sessions."""


@e2b.command("serve")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, help="Port (default: any free one)."
)
@project_option
def serve_command(port: int, project_dir: Path) -> None:
    """Serve E2B's API on 127.0.0.1 until Ctrl-C.

    Prints three `export` lines (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) for the shell
    to evaluate; each sandbox the SDK creates is a session of a worker of the project
    (the template is the worker's name), killed when the server stops.
    """
    from orchestrator.e2b.server import serve

    def announce(url: str, key: str) -> None:
        click.echo(f"export E2B_API_URL={url}")
        click.echo(f"export E2B_SANDBOX_URL={url}")
        click.echo(f"export E2B_API_KEY={key}")
        sys.stdout.flush()

    serve(project_dir, port=port, announce=announce)
