"""What the MCP server says of itself, as the wire carries it: its name and version, its
instructions, its capabilities, the protocol versions it negotiates, and its tools (the
schemas of :mod:`orchestrator.tools.schemas` with their hints).

Standard library only. The one source for both answers to ``initialize`` and
``tools/list``: the stdio front (:mod:`orchestrator.cli.mcp_front`) sends them before the
``mcp`` SDK is imported, and the SDK server (:mod:`orchestrator.tools.mcp_server`) builds
its own from the same data. ``tests/unit/test_mcp_front.py`` holds the two equal, field for
field, for every protocol version, and these constants to the SDK's own.
"""

from __future__ import annotations

from typing import Any

from orchestrator.tools.schemas import SPECS

__all__ = [
    "CAPABILITIES",
    "DESTRUCTIVE",
    "HANDSHAKE_VERSIONS",
    "INSTRUCTIONS",
    "NAME",
    "READ_ONLY",
    "initialize_result",
    "negotiate",
    "server_version",
    "tool_entries",
]

NAME = "orchestrator"
INSTRUCTIONS = (
    "A sandbox for one worker: list '/' to see its folders, read and write files, "
    "run commands with exec, and stage results for a person to review. Call "
    "'context' to see what is readable, writable and needs approval."
)
#: What the server offers: tools only, a fixed list.
CAPABILITIES: dict[str, Any] = {"tools": {"listChanged": False}}
#: The protocol revisions reachable through the ``initialize`` handshake, oldest first (the
#: SDK's ``mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS``; a test keeps them equal).
HANDSHAKE_VERSIONS: tuple[str, ...] = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")

READ_ONLY = frozenset({"list", "read", "stat", "context"})
DESTRUCTIVE = frozenset({"delete", "write", "exec"})


def tool_entries() -> list[dict[str, Any]]:
    """The tools as ``tools/list`` lists them (wire names: ``inputSchema``, ``readOnlyHint``)."""
    return [
        {
            "name": spec.name,
            "description": spec.description,
            "inputSchema": spec.input_schema,
            "annotations": {
                "readOnlyHint": spec.name in READ_ONLY,
                "destructiveHint": spec.name in DESTRUCTIVE,
                "openWorldHint": False,
            },
        }
        for spec in SPECS
    ]


def negotiate(requested: object) -> str:
    """The protocol version answered to a client asking for ``requested``: its own when the
    handshake reaches it, else the newest the handshake reaches."""
    if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS:
        return requested
    return HANDSHAKE_VERSIONS[-1]


def initialize_result(requested: object, version: str) -> dict[str, Any]:
    """The ``initialize`` result for a client asking for protocol ``requested``."""
    return {
        "protocolVersion": negotiate(requested),
        "capabilities": CAPABILITIES,
        "serverInfo": {"name": NAME, "version": version},
        "instructions": INSTRUCTIONS,
    }


def server_version() -> str:
    """The installed package's version ('' when it is not installed as a distribution)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orchestrator")
    except PackageNotFoundError:
        return ""
