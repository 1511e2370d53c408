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

The names are imported lazily: ``orchestrator mcp`` answers its first requests from
:mod:`orchestrator.tools.schemas` and :mod:`orchestrator.tools.catalog` (standard library
only) before the rest of the package is imported.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from orchestrator.tools.approval import Decision, Status, decide
    from orchestrator.tools.schemas import SPECS, InvalidArguments, ToolSpec, validate
    from orchestrator.tools.toolset import Answer, ToolSession, Toolset

_LAZY = {
    "Answer": "orchestrator.tools.toolset",
    "Decision": "orchestrator.tools.approval",
    "InvalidArguments": "orchestrator.tools.schemas",
    "SPECS": "orchestrator.tools.schemas",
    "Status": "orchestrator.tools.approval",
    "ToolSession": "orchestrator.tools.toolset",
    "ToolSpec": "orchestrator.tools.schemas",
    "Toolset": "orchestrator.tools.toolset",
    "decide": "orchestrator.tools.approval",
    "validate": "orchestrator.tools.schemas",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
