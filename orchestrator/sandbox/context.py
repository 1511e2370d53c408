"""What a sandbox allows, as plain data: for ``security_context()`` and for listing ``/``.

Nothing here touches the file system, and nothing reveals host paths, masked paths or the
outbox's host-side workings: only what the worker itself can see and do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.policy import Grant, ZoneGrant
from orchestrator.policy.network import describe
from orchestrator.sandbox.content import ReadCaps
from orchestrator.vocabulary import PRE_APPROVED


def virtual_children(grant: Grant, folder: str) -> list[str]:
    """Names directly under ``folder`` that lead to a zone (``/`` gives the zones' first
    components: ``input``, ``session``, ...)."""
    prefix = folder.rstrip("/") + "/"
    names = {z.target[len(prefix) :].split("/")[0] for z in grant.zones
             if z.target.startswith(prefix)}  # fmt: skip
    return sorted(names)


def _approval(zone: ZoneGrant) -> dict[str, str | None]:
    if zone.outbox:
        return {"write": "review", "delete": None}  # staged files are reviewed on the host
    if zone.read_only:
        return {"write": None, "delete": None}
    write = "ask" if zone.ask_base is not None else PRE_APPROVED
    return {"write": write, "delete": zone.delete}


def _zone(zone: ZoneGrant) -> dict[str, Any]:
    writable = not zone.read_only
    return {
        "path": zone.target,
        "kind": "outbox" if zone.outbox else "folder",
        "read": not zone.outbox,
        "list": not zone.outbox,
        "write": writable,
        "delete": writable and not zone.outbox and zone.delete != "blocked",
        "approval": _approval(zone),
        "suffixes": list(zone.suffixes) if zone.suffixes is not None else None,
        "max_file_size": zone.max_file_size,
    }


def security_context(grant: Grant, caps: ReadCaps, *, staging: bool) -> dict[str, Any]:
    """Trust level, per-zone rights and approvals, network and limits (JSON-ready).

    ``staging`` says whether host-side writes to the outbox are offered (a session hook).
    """
    zones = [_zone(z) for z in sorted(grant.zones, key=lambda z: z.target)]
    return {
        "trust": grant.trust,
        "zones": zones,
        "host_staging": staging,
        "network": describe(grant.network),
        "limits": dataclasses.asdict(grant.limits),
        "read_caps": dataclasses.asdict(caps),
    }
