"""``orchestrator mcp WORKER``: one session's sandbox tools as an MCP server on stdio.

stdout carries the protocol and nothing else: messages and logs go to stderr. The client is
answered at once by the stdio front (:mod:`orchestrator.tools.mcp_front`, started by the
entry point before anything heavy is imported, or here); the session opens on a thread of
its own (:class:`~orchestrator.tools.opening.Opening`) while the ``mcp`` SDK is imported,
and the first tool call waits for it. A failure to open is answered to the tool calls, then
the command exits 125.
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
from orchestrator.exits import Exit, signalled
from orchestrator.vocabulary import TRUST_ORDER

if TYPE_CHECKING:
    from orchestrator.runtime.session import Session
    from orchestrator.tools.opening import Opening


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
    exec, stage). The client is answered at once; the session opens in the background, the
    first tool call waits for it, and it closes when the client disconnects. Calls that need
    approval are asked through the client (elicitation) or refused."""
    from orchestrator.tools import catalog, mcp_front

    front = mcp_front.start()  # answering now, unless the entry point started it already

    import anyio

    from orchestrator.cli.terminal import say
    from orchestrator.runtime import Interrupted
    from orchestrator.tools.opening import OpenFailed, Opening

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("orchestrator: %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)

    def open_session() -> Session:
        from orchestrator.runner import Orchestrator

        session = Orchestrator(project_dir).open_session(
            worker, trust=trust, promote=promote, workspace=workspace, idle_timeout=idle_timeout
        )
        say(f"mcp: session {session.id} (run {session.run_id}) for {worker}, on stdio")
        return session

    def failed(failure: OpenFailed) -> None:
        say(f"mcp: {failure}; tool calls are answered so, then the server exits")

    stopped_by: int | None = None
    try:
        # A signal raises Interrupted until the server's own signal handling starts (and
        # after it ends), so the session is still closed and its container removed.
        with signals_interrupt():
            opening = Opening(open_session, on_failure=failed)
            try:
                from orchestrator.tools.mcp_server import serve_front, waiting_for

                tools, version = waiting_for(opening), catalog.server_version()
                stopped_by = anyio.run(lambda: serve_front(front, tools, version=version))
            finally:
                _settle(opening, say)
    except* Interrupted as group:  # bare, or from inside the server's task group
        first = group.exceptions[0]
        stopped_by = first.signum if isinstance(first, Interrupted) else signal.SIGTERM
    if stopped_by is not None:
        say(f"mcp: stopped by signal {stopped_by}")
        raise SystemExit(signalled(stopped_by))
    if opening.failure is not None:
        raise SystemExit(Exit.ERROR)


def _settle(opening: Opening, say: Callable[[str], None]) -> None:
    """Wait for the opening, then close its session; the client sends SIGTERM a moment after
    closing stdin: finish regardless."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        session = opening.settle()
        result = session.close() if session is not None else None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if session is None or result is None:
        return
    removed = "container removed" if result.container_removed else "CONTAINER NOT REMOVED"
    change = getattr(result.outbox, "change_id", None)
    staged = f"; outbox staged as change set {change}" if change else ""
    say(f"mcp: session {session.id} closed{staged}; {removed}")
