"""The words a person reads and writes, spelled once: trust levels, approvals, backends.

A leaf (imports nothing of the package, nor pydantic), so that the command line's option
lists are built from here without loading the configuration models, which re-export
these names. Two vocabularies name "may go ahead without asking"; both are on the wire
and stay as they are:

- the worker file's approvals (``write:``/``delete:`` of a zone, and ``plan --json``):
  ``preApproved``, ``ask``, ``blocked``;
- the tool protocol's call statuses (:mod:`orchestrator.tools.approval`, MCP answers):
  ``pre_approved``, ``needs_approval``, ``blocked``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Final, Literal

__all__ = [
    "BACKENDS",
    "PRE_APPROVED",
    "TOOL_PRE_APPROVED",
    "TRUST_ORDER",
    "Approval",
    "BackendName",
    "Trust",
    "did_you_mean",
]

Trust = Literal["untrusted", "session", "workspace", "full"]
#: Trust levels from least to most access: every ``--trust`` choice list is built from it.
TRUST_ORDER: tuple[Trust, ...] = ("untrusted", "session", "workspace", "full")

#: Worker-file vocabulary: a zone's ``write:`` or ``delete:``.
Approval = Literal["preApproved", "ask", "blocked"]
#: Worker-file vocabulary: changes go ahead directly (``write: preApproved``).
PRE_APPROVED: Final = "preApproved"

#: Tool-protocol vocabulary (a :class:`~orchestrator.tools.approval.Decision`'s status, in
#: MCP answers): the call may go ahead without asking anyone.
TOOL_PRE_APPROVED: Final = "pre_approved"

BackendName = Literal["docker", "swarm"]
#: Where runs run (``--engine``): a container on this engine, or a service on its swarm.
BACKENDS: tuple[BackendName, ...] = ("docker", "swarm")


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"did you mean 'resources'?"`` when ``word`` looks like a misspelling of one of
    ``known`` (difflib's closest match), else the empty string: the hint a one-line error
    about an unknown field, zone, worker or credential name carries."""
    close = difflib.get_close_matches(word, sorted(set(known) - {word}), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""
