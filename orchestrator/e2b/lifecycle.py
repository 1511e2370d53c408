"""Pause, resume, snapshots and fork of E2B sandboxes, on the sessions' own lifecycle
(docs/sessions.md): nothing here keeps a state of its own (blocking; engine calls).

- ``pause`` is :meth:`Session.pause` (the engine's freezer); a paused sandbox is not
  running for the in-sandbox API (502, as E2B's edge answers) and its timeout does not
  run; ``connect`` resumes it (:meth:`Session.resume`) and gives it its timeout anew.
- ``create_snapshot`` is :meth:`Session.snapshot`: a snapshot of the project, named by
  its id; ``list_snapshots`` is the project's list; ``delete_snapshot`` removes one.
- ``Sandbox.create(snapshot_id)`` and ``fork`` are the project's forks of a snapshot
  (a fork snapshots first): the same grant, never more (docs/sessions.md#forks).

A snapshot never holds the processes' memory (docs/sessions.md): what E2B calls
``mode="filesystem"``; a sandbox made from one starts without the source's processes.
"""

from __future__ import annotations

import contextlib
from typing import Any

from orchestrator.e2b.sandboxes import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    Refused,
    Sandbox,
    Sandboxes,
    refuse_unsupported,
    timeout_of,
)
from orchestrator.errors import OrchestratorError
from orchestrator.integrations.projects import one_line, orchestrator_for
from orchestrator.runtime.session import SessionPaused

__all__ = [
    "MAX_FORKS",
    "connect",
    "create_from_snapshot",
    "delete_snapshot",
    "fork",
    "is_snapshot",
    "list_snapshots",
    "pause",
    "snapshot",
]

#: How a snapshot's id begins (``snap-`` and hex digits): a template naming one is a fork.
SNAPSHOT_PREFIX = "snap-"
#: The most forks one call may ask for (E2B's own ceiling).
MAX_FORKS = 20


def is_snapshot(template: Any) -> bool:
    return isinstance(template, str) and template.startswith(SNAPSHOT_PREFIX)


def pause(sandboxes: Sandboxes, sandbox_id: str, body: dict[str, Any]) -> None:
    """``POST /sandboxes/{id}/pause``; 409 when it is paused already (the SDK's False)."""
    sandbox = sandboxes.get(sandbox_id)
    if body.get("memory") is False:
        raise Refused(
            400,
            "pause mode 'filesystem': a pause here keeps the processes (the engine's "
            "freezer); pause without a mode, or snapshot (Sandbox.create_snapshot)",
        )
    try:
        sandbox.session.pause(reason="e2b pause")
    except SessionPaused:
        raise Refused(409, f"sandbox {sandbox_id!r} is paused already") from None
    except OrchestratorError as exc:
        raise Refused(500, f"pause: {one_line(exc)}") from None


def connect(sandboxes: Sandboxes, sandbox_id: str, body: dict[str, Any]) -> tuple[Sandbox, bool]:
    """``POST /sandboxes/{id}/connect``: the sandbox, resumed if it was paused (True)."""
    sandbox = sandboxes.get(sandbox_id)
    given = body.get("timeout")
    if not sandbox.session.paused:
        if given is not None:
            sandboxes.set_timeout(sandbox.id, given)
        return sandbox, False
    if body.get("memory") is False:
        raise Refused(
            400,
            "on_resume='reboot': a paused sandbox goes on with its processes here; "
            "connect without on_resume",
        )
    seconds = timeout_of(given, DEFAULT_TIMEOUT)
    try:
        sandbox.session.resume()
    except SessionPaused:
        pass  # another connect resumed it meanwhile
    except OrchestratorError as exc:
        raise Refused(500, f"resume: {one_line(exc)}") from None
    sandboxes.set_timeout(sandbox.id, seconds)
    return sandbox, True


def snapshot(sandboxes: Sandboxes, sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /sandboxes/{id}/snapshots``: E2B's ``SnapshotInfo`` of a new snapshot."""
    if body.get("name"):
        raise Refused(
            400,
            "name: a snapshot here is named by its id (give no name; "
            "`orchestrator snapshot list` shows them)",
        )
    sandbox = sandboxes.get(sandbox_id)
    _running(sandbox)
    try:
        snap = sandbox.session.snapshot()
    except OrchestratorError as exc:
        raise Refused(400, f"snapshot: {one_line(exc)}") from None
    return {"snapshotID": snap.id, "names": [snap.id]}


def list_snapshots(sandboxes: Sandboxes, query: dict[str, str]) -> list[dict[str, Any]]:
    """``GET /snapshots``: the project's snapshots (by source sandbox, by id), one page."""
    limit = query.get("limit")
    try:
        most = int(limit) if limit else None
    except ValueError:
        raise Refused(400, f"limit: {limit!r} is not a number") from None
    snaps = orchestrator_for(sandboxes.project_dir).snapshots()
    source, name = query.get("sandboxID"), query.get("name")
    out = [
        {"snapshotID": s.id, "names": [s.id]}
        for s in reversed(snaps)  # the newest first, as E2B lists them
        if (not source or s.session == source) and (not name or s.id == name.split(":")[0])
    ]
    return out[:most] if most is not None and most > 0 else out


def delete_snapshot(sandboxes: Sandboxes, snapshot_id: str) -> None:
    """``DELETE /templates/{snapshot id}``: the snapshot's image and folder removed."""
    orch = orchestrator_for(sandboxes.project_dir)
    try:
        orch.snapshot(snapshot_id)
    except OrchestratorError:
        raise Refused(404, f"snapshot {snapshot_id!r} not found") from None
    try:
        orch.remove_snapshot(snapshot_id)
    except OrchestratorError as exc:
        raise Refused(500, f"removing snapshot {snapshot_id!r}: {one_line(exc)}") from None


def create_from_snapshot(sandboxes: Sandboxes, body: dict[str, Any]) -> Sandbox:
    """``Sandbox.create(snapshot_id)``: one fork of the project's snapshot."""
    snapshot_id = str(body.get("templateID"))
    timeout = timeout_of(body.get("timeout"), DEFAULT_TIMEOUT)
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise Refused(400, "metadata: give an object of strings")
    if body.get("envVars"):
        raise Refused(
            400,
            f"envs: a sandbox from snapshot {snapshot_id!r} gets its worker's environment "
            "(a snapshot keeps no values); set them in its commands",
        )
    refuse_unsupported(body)
    if body.get("network") or body.get("allow_internet_access"):
        raise Refused(
            400,
            f"network: a sandbox from snapshot {snapshot_id!r} gets the snapshot's network "
            "exactly (a fork's grant is its snapshot's)",
        )
    orch = orchestrator_for(sandboxes.project_dir)
    try:
        snap = orch.snapshot(snapshot_id)
        network = str(snap.network.get("mode", ""))
        if body.get("allow_internet_access") is False and network != "none":
            raise Refused(
                400,
                f"allow_internet_access=False: snapshot {snapshot_id!r}'s worker has "
                f"network {network!r}",
            )
        [session] = orch.fork(snap, 1, idle_timeout=float(MAX_TIMEOUT), max_lifetime=MAX_TIMEOUT)
    except OrchestratorError as exc:
        raise Refused(400, f"template {snapshot_id!r}: {one_line(exc)}") from None
    return sandboxes.add(session, snapshot_id, metadata, timeout)


def fork(sandboxes: Sandboxes, sandbox_id: str, body: dict[str, Any]) -> list[Sandbox]:
    """``POST /sandboxes/{id}/fork``: ``count`` new sandboxes from a snapshot of this one
    (all or none: the project's forks), each with the source's template and metadata."""
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
        raise Refused(400, f"count: {count!r}: give 1 to {MAX_FORKS} forks")
    timeout = timeout_of(body.get("timeout"), DEFAULT_TIMEOUT)
    sandbox = sandboxes.get(sandbox_id)
    _running(sandbox)
    orch = orchestrator_for(sandboxes.project_dir)
    try:
        snap = sandbox.session.snapshot()
    except OrchestratorError as exc:
        raise Refused(400, f"fork of {sandbox_id!r}: {one_line(exc)}") from None
    try:
        forks = orch.fork(snap.id, count, idle_timeout=float(MAX_TIMEOUT), max_lifetime=MAX_TIMEOUT)
    except OrchestratorError as exc:
        with contextlib.suppress(OrchestratorError):  # all or none: the snapshot too
            orch.remove_snapshot(snap.id)
        raise Refused(400, f"fork of {sandbox_id!r}: {one_line(exc)}") from None
    return [sandboxes.add(s, sandbox.template, sandbox.metadata, timeout) for s in forks]


def _running(sandbox: Sandbox) -> None:
    if sandbox.session.paused:
        raise Refused(
            409,
            f"sandbox {sandbox.id!r} is paused: resume it first (Sandbox.connect)",
        )
