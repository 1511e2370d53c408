"""Tools for LLMs over a live session: JSON-schema definitions, approvals and calls.

::

    from orchestrator.tools import Toolset

    tools = Toolset(session)
    tools.definitions()                       # hand these to the model
    tools.needs_approval("delete", {"path": "/data/a.txt"})
    # Decision(status="needs_approval", description="delete /data/a.txt (zone /data asks ...)")
    tools.call("read", {"path": "/input/notes.txt"})   # {"ok": True, "result": {...}}

The approval rules are in :mod:`orchestrator.tools.approval`; ``orchestrator mcp`` serves
the same tools over the Model Context Protocol.
"""

from orchestrator.tools.approval import Decision, Status, decide
from orchestrator.tools.schemas import SPECS, InvalidArguments, ToolSpec, validate
from orchestrator.tools.toolset import Answer, ToolSession, Toolset

__all__ = [
    "SPECS",
    "Answer",
    "Decision",
    "InvalidArguments",
    "Status",
    "ToolSession",
    "ToolSpec",
    "Toolset",
    "decide",
    "validate",
]
