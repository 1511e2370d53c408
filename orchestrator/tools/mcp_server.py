"""The sandbox tools served over the Model Context Protocol (the official ``mcp`` SDK).

One server serves one session's :class:`~orchestrator.tools.Toolset` until the client
disconnects (or the process gets SIGTERM, SIGINT or SIGHUP); the caller closes the session
then. The toolset may still be opening (:class:`~orchestrator.tools.opening.Opening`):
``initialize`` and ``tools/list`` need no session, the first tool call waits for it, and a
failure to open answers that call as a tool error and ends the server
(:func:`serve_front`).

A call that needs approval is never run without it: when the client declared the
elicitation capability, the person is asked through an elicitation form (approve: yes/no);
otherwise the call is refused with "needs approval: ..." and audited.

Importing this module imports ``mcp``: only ``orchestrator mcp`` does, inside the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from orchestrator.errors import OrchestratorError
from orchestrator.escaping import json_safe
from orchestrator.tools import catalog, mcp_front
from orchestrator.tools.approval import Decision
from orchestrator.tools.mcp_front import REPLAY_ID, Front, Line
from orchestrator.tools.opening import OpenFailed, Opening
from orchestrator.tools.schemas import InvalidArguments
from orchestrator.tools.toolset import Answer, Toolset, refusal

#: Where the tools come from: a toolset, or a wait for one (raising :class:`OpenFailed`).
ToolsetSource = Toolset | Callable[[], Awaitable[Toolset]]

log = logging.getLogger(__name__)

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
    """The tools from :mod:`orchestrator.tools.catalog`, the front's source too."""
    return [types.Tool.model_validate(entry, by_name=False) for entry in catalog.tool_entries()]


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


@contextlib.contextmanager
def waiting_on_a_person(toolset: Toolset) -> Iterator[None]:
    """While the person is asked, the session counts as busy: its idle timeout does not
    close it under a call waiting for an answer (a closed session is left to refuse the
    call)."""
    waiting = getattr(toolset.session, "waiting", None)
    with contextlib.ExitStack() as stack:
        if waiting is not None:
            with contextlib.suppress(OrchestratorError):
                stack.enter_context(waiting())
        yield


def build_server(
    toolset: ToolsetSource,
    *,
    version: str = "",
    on_open_failed: Callable[[types.RequestId], None] | None = None,
) -> Server[Any]:
    """The server for ``toolset``, or for the toolset a source waits for. A call answered
    with a failure to open is passed to ``on_open_failed`` (its request id)."""
    tools: Callable[[], Awaitable[Toolset]]
    if isinstance(toolset, Toolset):
        ready_toolset = toolset

        async def ready() -> Toolset:
            return ready_toolset

        tools = ready
    else:
        tools = toolset

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_definitions())

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            toolset = await tools()
        except OpenFailed as exc:
            if on_open_failed is not None and ctx.request_id is not None:
                on_open_failed(ctx.request_id)
            return to_result(refusal(str(exc), "failed"))
        try:
            return await answer_call(ctx, params, toolset)
        except Exception as exc:  # never let one call take the server down
            log.exception("tool %r failed unexpectedly", params.name)
            message = f"{params.name} failed unexpectedly: {type(exc).__name__}: {exc}"
            return to_result(refusal(message, "failed"))

    async def answer_call(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams, toolset: Toolset
    ) -> types.CallToolResult:
        name, args = params.name, params.arguments or {}
        approved = False
        try:
            decision = await anyio.to_thread.run_sync(toolset.needs_approval, name, args)
        except InvalidArguments:
            decision = None  # call() answers it, with the same message, and audits it
        if decision is not None and decision.status == "needs_approval" and can_elicit(ctx):
            with waiting_on_a_person(toolset):
                approved = await ask(ctx, decision)
            if not approved:
                answer = await anyio.to_thread.run_sync(toolset.decline, name, args, decision)
                return to_result(answer)
        answer = await anyio.to_thread.run_sync(lambda: toolset.call(name, args, approved=approved))
        return to_result(answer)

    return Server(
        catalog.NAME,
        version=version,
        instructions=catalog.INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _until_signal(scope: anyio.CancelScope, received: list[int]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            received.append(int(signum))
            scope.cancel()
            return


async def serve_stdio(toolset: ToolsetSource, *, version: str = "") -> int | None:
    """Serve over this process's stdin/stdout (through its :mod:`~orchestrator.tools.mcp_front`,
    started here if it is not yet) until the client closes stdin (None) or a signal arrives
    (its number)."""
    return await serve_front(mcp_front.start(), toolset, version=version)


def waiting_for(opening: Opening) -> Callable[[], Awaitable[Toolset]]:
    """A toolset source for a session still opening: the first call waits for it."""
    made: list[Toolset] = []

    async def tools() -> Toolset:
        session = await anyio.to_thread.run_sync(opening.wait, abandon_on_cancel=True)
        if not made:
            made.append(Toolset(session))
        return made[0]

    return tools


async def serve_front(
    front: Front, toolset: ToolsetSource, *, version: str = "", signals: bool = True
) -> int | None:
    """Serve the client behind ``front`` (which may have answered its ``initialize``
    already) until stdin ends (None), a signal arrives (its number), or a call was
    answered that the session could not be opened (None; the caller knows why).
    ``signals``: stop at SIGTERM, SIGINT or SIGHUP (only on the main thread)."""
    loop = asyncio.get_running_loop()
    inbound, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)
    write_stream, outbound = anyio.create_memory_object_stream[SessionMessage](0)
    last_answers: set[types.RequestId] = set()

    def put(line: Line) -> None:  # on the loop, in the order the lines came
        if line is None:
            inbound.close()
            return
        item: SessionMessage | Exception
        try:
            item = SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValidationError as exc:  # as the SDK's stdio transport: the server answers it
            item = exc
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            inbound.send_nowait(item)

    async def write_out(scope: anyio.CancelScope) -> None:
        async with outbound:
            async for sent in outbound:
                message = sent.message
                answer_to = getattr(message, "id", None)
                if answer_to == REPLAY_ID and not isinstance(message, types.JSONRPCRequest):
                    continue  # the front answered this initialize already
                line = message.model_dump_json(by_alias=True, exclude_unset=True)
                await anyio.to_thread.run_sync(front.write, line)
                if answer_to in last_answers and not isinstance(message, types.JSONRPCRequest):
                    scope.cancel()
        scope.cancel()

    server = build_server(toolset, version=version, on_open_failed=last_answers.add)
    received: list[int] = []
    async with anyio.create_task_group() as group:
        if signals:
            group.start_soon(_until_signal, group.cancel_scope, received)
        group.start_soon(write_out, group.cancel_scope)

        def deliver(line: Line) -> None:  # on the front's reader thread
            loop.call_soon_threadsafe(put, line)

        front.attach(deliver)
        try:
            await server.run(read_stream, write_stream, server.create_initialization_options())
        finally:
            front.detach()
            inbound.close()
    return received[0] if received else None
