"""The sandbox tools served over the Model Context Protocol (the official ``mcp`` SDK).

One server serves one session's :class:`~orchestrator.tools.Toolset` until the client
disconnects (or the process gets SIGTERM, SIGINT or SIGHUP); the caller closes the session
then. A call that needs approval is never run without it: when the client declared the
elicitation capability, the person is asked through an elicitation form (approve: yes/no);
otherwise the call is refused with "needs approval: ..." and audited.

Importing this module imports ``mcp``: only ``orchestrator mcp`` does, inside the command.
"""

from __future__ import annotations

import json
import logging
import signal
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from orchestrator.escaping import json_safe
from orchestrator.tools.approval import Decision
from orchestrator.tools.schemas import SPECS, InvalidArguments
from orchestrator.tools.toolset import Answer, Toolset, refusal

log = logging.getLogger(__name__)

READ_ONLY = {"list", "read", "stat", "context"}
APPROVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "Let the sandbox do this once.",
        }
    },
    "required": ["approve"],
}


def tool_definitions() -> list[types.Tool]:
    return [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema,
            annotations=types.ToolAnnotations(
                read_only_hint=spec.name in READ_ONLY,
                destructive_hint=spec.name in ("delete", "write", "exec"),
                open_world_hint=False,
            ),
        )
        for spec in SPECS
    ]


def to_result(answer: Answer) -> types.CallToolResult:
    """A tool answer as MCP content: an image read as an image, the rest as JSON text.

    Lone surrogates (a worker's file name that is not UTF-8) are escaped as ``\\xNN``
    first: the SDK writes UTF-8, which cannot carry them."""
    answer = json_safe(answer)
    if not answer["ok"]:
        return types.CallToolResult(
            content=[types.TextContent(text=answer["error"])],
            structured_content=answer,
            is_error=True,
        )
    result = answer["result"]
    if isinstance(result, dict) and result.get("kind") == "image":
        meta = {k: v for k, v in result.items() if k != "data"}
        return types.CallToolResult(
            content=[
                types.ImageContent(data=result["data"], mime_type=result["mime"]),
                types.TextContent(text=json.dumps(meta)),
            ],
            structured_content=meta,
        )
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(result, ensure_ascii=False))],
        structured_content=result if isinstance(result, dict) else {"result": result},
    )


def can_elicit(ctx: ServerRequestContext[Any]) -> bool:
    """Whether this client declared form elicitation and can be asked right now."""
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return False
    elicitation = capabilities.elicitation
    form_ok = elicitation.form is not None or elicitation.url is None  # {} means form
    return form_ok and ctx.session.can_send_request


async def ask(ctx: ServerRequestContext[Any], decision: Decision) -> bool:
    """Ask the person through the client; True only for an explicit approval."""
    try:
        reply = await ctx.session.elicit_form(
            message=f"The sandbox asks to {decision.description}. Approve?",
            requested_schema=APPROVE_SCHEMA,
            related_request_id=ctx.request_id,
        )
    except (MCPError, ValidationError, anyio.BrokenResourceError) as exc:  # not an approval
        log.warning("approval request failed: %s", exc)
        return False
    return reply.action == "accept" and (reply.content or {}).get("approve") is True


def build_server(toolset: Toolset, *, version: str = "") -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_definitions())

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            return await answer_call(ctx, params)
        except Exception as exc:  # never let one call take the server down
            log.exception("tool %r failed unexpectedly", params.name)
            message = f"{params.name} failed unexpectedly: {type(exc).__name__}: {exc}"
            return to_result(refusal(message, "failed"))

    async def answer_call(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name, args = params.name, params.arguments or {}
        approved = False
        try:
            decision = await anyio.to_thread.run_sync(toolset.needs_approval, name, args)
        except InvalidArguments:
            decision = None  # call() answers it, with the same message, and audits it
        if decision is not None and decision.status == "needs_approval" and can_elicit(ctx):
            approved = await ask(ctx, decision)
            if not approved:
                answer = await anyio.to_thread.run_sync(toolset.decline, name, args, decision)
                return to_result(answer)
        answer = await anyio.to_thread.run_sync(lambda: toolset.call(name, args, approved=approved))
        return to_result(answer)

    return Server(
        "orchestrator",
        version=version,
        instructions=(
            "A sandbox for one worker: list '/' to see its folders, read and write files, "
            "run commands with exec, and stage results for a person to review. Call "
            "'context' to see what is readable, writable and needs approval."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _until_signal(scope: anyio.CancelScope, received: list[int]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            received.append(int(signum))
            scope.cancel()
            return


async def serve_stdio(toolset: Toolset, *, version: str = "") -> int | None:
    """Serve over this process's stdin/stdout until the client closes stdin (None) or a
    signal arrives (its number)."""
    server = build_server(toolset, version=version)
    received: list[int] = []
    async with anyio.create_task_group() as group:
        group.start_soon(_until_signal, group.cancel_scope, received)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        group.cancel_scope.cancel()
    return received[0] if received else None
