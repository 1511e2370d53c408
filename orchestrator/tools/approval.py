"""Which tool calls run at once, which wait for a person, and which are refused.

:func:`decide` looks only at the call's arguments and the sandbox's security context
(``Session.security_context()``: trust, and per zone the read/write/delete rights and the
``approval`` of writes and deletes). The rules:

===========================  =====================================================
call                         decision
===========================  =====================================================
list, read, stat             pre-approved where the zone is readable; blocked
                             outside every zone and in the outbox (write-only)
write                        blocked in read-only zones and outside every zone;
                             needs approval where the zone's ``approval.write`` is
                             ``ask`` (the change is also reviewed as a change set
                             before it reaches the zone); to the outbox
                             (``/staged``) pre-approved when the session stages
                             host-side writes, blocked otherwise; else pre-approved
delete                       blocked in read-only zones, in the outbox, at a
                             zone's root and where ``approval.delete`` is
                             ``blocked``; needs approval where it is ``ask``;
                             else pre-approved
exec                         pre-approved: the command runs inside the sandbox,
                             as the worker, with exactly the worker's zones,
                             network and limits; it can do nothing the worker
                             itself could not
stage                        pre-approved: it only proposes a change set, which
                             a person approves or rejects later
context                      pre-approved
checkpoint, branch           pre-approved where the worker declares
                             ``checkpoints: true``; blocked otherwise (the
                             forks of ``branch`` get exactly the snapshot's
                             grant, never more)
===========================  =====================================================

The file operations check again when they run (this module never touches the disk), so
a pre-approved call can still be refused, with the same guiding message.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.vocabulary import TOOL_PRE_APPROVED

#: The tool protocol's words (in MCP answers), not the worker file's ``preApproved``: see
#: :mod:`orchestrator.vocabulary`.
Status = Literal["pre_approved", "needs_approval", "blocked"]


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` says about one call. ``description`` is one line for the person
    asked (``needs_approval``); ``reason`` says why a call is ``blocked`` and what to do."""

    status: Status
    description: str
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "description": self.description, "reason": self.reason}


def _zone_of(path: str, zones: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The innermost zone holding ``path`` (already normalised), or None."""
    found = None
    for zone in zones:
        root = zone["path"]
        if (path == root or path.startswith(root.rstrip("/") + "/")) and (
            found is None or len(root) > len(found["path"])
        ):
            found = zone
    return found


def _names(zones: Sequence[Mapping[str, Any]], right: str) -> str:
    names = sorted({z["path"] for z in zones if z.get(right)})
    return ", ".join(names) or "nothing"


def _clean(path: Any) -> str | None:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return None
    if ".." in path.split("/"):
        return None
    return posixpath.normpath(path)


def _is_above_zones(path: str, zones: Sequence[Mapping[str, Any]]) -> bool:
    """``/`` or a folder that only leads to zones (listing it is harmless)."""
    prefix = path.rstrip("/") + "/"
    return any(z["path"].startswith(prefix) for z in zones)


def _size(content: Any) -> str:
    size = len(content.encode("utf-8", "surrogatepass")) if isinstance(content, str) else 0
    return f"{size} byte{'s' if size != 1 else ''}"


def decide(name: str, args: Mapping[str, Any], context: Mapping[str, Any]) -> Decision:
    """The decision for tool ``name`` called with (validated) ``args`` in ``context``."""
    zones: Sequence[Mapping[str, Any]] = context.get("zones", [])
    if name == "exec":
        command = args.get("command")
        shown = command if isinstance(command, str) else " ".join(map(str, command or []))
        return Decision(TOOL_PRE_APPROVED, f"run in the sandbox: {shown}")
    if name == "stage":
        files = ", ".join(args.get("files", []))
        return Decision(TOOL_PRE_APPROVED, f"propose a change set for review: {files}")
    if name == "context":
        return Decision(TOOL_PRE_APPROVED, "show what the sandbox allows")
    if name == "checkpoint":
        session = context.get("session") or {}
        if session.get("checkpoints"):
            return Decision(TOOL_PRE_APPROVED, "save this sandbox's state as a snapshot")
        return Decision(
            "blocked",
            "checkpoint",
            "Cannot checkpoint: this worker does not let its sandbox snapshot itself "
            "(checkpoints: true in its worker file); a person can, with `orchestrator "
            "session snapshot`",
        )
    if name == "branch":
        session = context.get("session") or {}
        count = args.get("count", 1)
        source = args.get("snapshot") or "a checkpoint taken now"
        described = f"start {count} sandbox(es) from {source}"
        if session.get("checkpoints"):
            return Decision(TOOL_PRE_APPROVED, described)
        return Decision(
            "blocked",
            described,
            "Cannot branch: this worker does not let its sandbox checkpoint and branch "
            "itself (checkpoints: true in its worker file); a person can, with `orchestrator "
            "session fork`",
        )
    raw = args.get("path", "/")
    path = _clean(raw)
    verb = {"list": "list", "read": "read", "stat": "stat", "write": "write", "delete": "delete"}[
        name
    ]
    if path is None:
        return Decision(
            "blocked",
            f"{verb} {raw!r}",
            f"Cannot {verb} '{raw}': give an "
            "absolute path without '..'; list '/' to see what exists",
        )
    if name in ("list", "stat") and _is_above_zones(path, zones) and _zone_of(path, zones) is None:
        return Decision(TOOL_PRE_APPROVED, f"{verb} {path}")
    zone = _zone_of(path, zones)
    if zone is None:
        return Decision(
            "blocked",
            f"{verb} {path}",
            f"Cannot {verb} '{path}': outside the sandbox. Readable: {_names(zones, 'read')}",
        )
    if name in ("list", "read", "stat"):
        return _reading(verb, path, zone, zones)
    if name == "write":
        return _writing(path, zone, zones, args, context)
    return _deleting(path, zone, zones)


def _reading(
    verb: str, path: str, zone: Mapping[str, Any], zones: Sequence[Mapping[str, Any]]
) -> Decision:
    if zone.get("kind") == "outbox":
        return Decision(
            "blocked",
            f"{verb} {path}",
            f"Cannot {verb} '{path}': {zone['path']} "
            "is the write-only outbox; what is staged there is seen at review. "
            f"Readable: {_names(zones, 'read')}",
        )
    return Decision(TOOL_PRE_APPROVED, f"{verb} {path}")


def _writing(
    path: str,
    zone: Mapping[str, Any],
    zones: Sequence[Mapping[str, Any]],
    args: Mapping[str, Any],
    context: Mapping[str, Any],
) -> Decision:
    what = "append" if args.get("append") else "write"
    described = f"{what} {_size(args.get('content'))} to {path}"
    writable = _names(zones, "write")
    if not zone.get("write"):
        return Decision(
            "blocked",
            described,
            f"Cannot write '{path}': {zone['path']} is read-only. Writable: {writable}",
        )
    if path == zone["path"]:
        return Decision(
            "blocked", described, f"Cannot write '{path}': it is a folder; name a file in it"
        )
    if zone.get("kind") == "outbox":
        if not context.get("host_staging"):
            return Decision(
                "blocked",
                described,
                f"Cannot write '{path}': {zone['path']} is "
                "filled from inside the sandbox here; write the file with exec, or "
                f"use 'stage'. Writable: {writable}",
            )
        return Decision(TOOL_PRE_APPROVED, f"{described} (staged for review)")
    approval = zone.get("approval", {}).get("write")
    if approval == "ask":
        return Decision(
            "needs_approval",
            f"{described} (zone {zone['path']} asks before "
            "writes; the change is then reviewed before it reaches the zone)",
        )
    return Decision(TOOL_PRE_APPROVED, described)


def _deleting(path: str, zone: Mapping[str, Any], zones: Sequence[Mapping[str, Any]]) -> Decision:
    described = f"delete {path}"
    if not zone.get("write"):
        return Decision(
            "blocked",
            described,
            f"Cannot delete '{path}': {zone['path']} is "
            f"read-only. Writable: {_names(zones, 'write')}",
        )
    if zone.get("kind") == "outbox":
        return Decision(
            "blocked",
            described,
            f"Cannot delete '{path}': {zone['path']} is the "
            "write-only outbox; staged files are dropped at review",
        )
    if path == zone["path"]:
        return Decision(
            "blocked",
            described,
            f"Cannot delete '{path}': it is the root of "
            f"{zone['path']}; delete what is in it instead",
        )
    approval = zone.get("approval", {}).get("delete")
    if approval == "blocked" or not zone.get("delete"):
        return Decision(
            "blocked", described, f"Cannot delete '{path}': deletes in {zone['path']} are blocked"
        )
    if approval == "ask":
        return Decision("needs_approval", f"{described} (zone {zone['path']} asks before deletes)")
    return Decision(TOOL_PRE_APPROVED, described)
