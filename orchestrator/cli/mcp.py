"""``orchestrator mcp WORKER``: one session's sandbox tools as an MCP server on stdio.

stdout carries the protocol and nothing else: messages and logs go to stderr. The ``mcp``
SDK is imported inside the command, so ``orchestrator --help`` stays fast.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import parse_duration_option, project_option, signals_interrupt
from orchestrator.exits import signalled
from orchestrator.vocabulary import TRUST_ORDER

if TYPE_CHECKING:
    from orchestrator.runtime.session import Session


@click.command()
@click.argument("worker")
@project_option
@click.option(
    "--trust",
    type=click.Choice(TRUST_ORDER),
    help="Open the session at this trust level (only lower than declared, unless --promote).",
)
@click.option("--promote", is_flag=True, help="Allow --trust above the declared level.")
@click.option("--workspace", default="default", show_default=True, help="Workspace name.")
@click.option(
    "--idle-timeout",
    default="15m",
    show_default=True,
    callback=parse_duration_option,
    help="Close the session after this long without a tool call (e.g. 90s, 15m; 'never').",
)
def mcp(
    worker: str,
    project_dir: Path,
    trust: str | None,
    promote: bool,
    workspace: str,
    idle_timeout: float | None,
) -> None:
    """Serve WORKER's sandbox to an MCP client over stdio (list, read, write, delete, stat,
    exec, stage). The session opens now and closes when the client disconnects; calls that
    need approval are asked through the client (elicitation) or refused."""
    import anyio

    from orchestrator.cli.terminal import say
    from orchestrator.runner import Orchestrator
    from orchestrator.runtime import Interrupted
    from orchestrator.tools import Toolset
    from orchestrator.tools.mcp_server import serve_stdio

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("orchestrator: %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)

    orch = Orchestrator(project_dir)
    stopped_by: int | None = None
    try:
        # Until the server's own signal handling starts, and while the container starts, a
        # signal raises Interrupted, so the session is still closed and its container removed.
        with signals_interrupt():
            session = orch.open_session(
                worker, trust=trust, promote=promote, workspace=workspace, idle_timeout=idle_timeout
            )
            try:
                say(f"mcp: session {session.id} (run {session.run_id}) for {worker}, on stdio")
                stopped_by = anyio.run(lambda: serve_stdio(Toolset(session), version=_version()))
            finally:
                _close(session, say)
    except* Interrupted as group:  # bare, or from inside the server's task group
        first = group.exceptions[0]
        stopped_by = first.signum if isinstance(first, Interrupted) else signal.SIGTERM
    if stopped_by is not None:
        say(f"mcp: stopped by signal {stopped_by}")
        raise SystemExit(signalled(stopped_by))


def _close(session: Session, say: Callable[[str], None]) -> None:
    """Close the session; the client sends SIGTERM after a moment: finish closing regardless."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = session.close()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    removed = "container removed" if result.container_removed else "CONTAINER NOT REMOVED"
    change = getattr(result.outbox, "change_id", None)
    staged = f"; outbox staged as change set {change}" if change else ""
    say(f"mcp: session {session.id} closed{staged}; {removed}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orchestrator")
    except PackageNotFoundError:
        return ""
