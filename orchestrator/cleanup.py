"""``orchestrator gc`` as a library call: remove what dead orchestrators left.

:func:`collect_all` asks every backend to remove the objects of dead owners (the swarm's
services first: their networks are then free), then the Docker engine's shared egress
proxies and networks no run has used for ``idle`` seconds, the secret folders and pinned
mount sources of dead runs, and, in a project: the access dead runs gave their workers
(as root), their run folders, the empty session folders of the runs just removed and,
when asked, session folders unused for longer than ``sessions_age``. It returns a
:class:`GcSummary`; :meth:`orchestrator.Orchestrator.gc` is the same for its project.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import load_project
from orchestrator.config.loader import PROJECT_FILE
from orchestrator.runtime.engine import ManagedObject
from orchestrator.runtime.host_folders import open_audit
from orchestrator.runtime.run_folders import FolderSweep
from orchestrator.runtime.session_folders import SessionPrune

if TYPE_CHECKING:
    from orchestrator.runtime.backend import Named
    from orchestrator.runtime.engine import Engine

__all__ = ["GC_ORDER", "GcSummary", "collect_all"]

#: The order the backends are asked in: a swarm's services go before the networks the
#: Docker engine lists (some of them overlay networks those services use).
GC_ORDER = ("swarm", "docker")


@dataclass
class GcSummary:
    """What :func:`collect_all` removed, kept and could not remove."""

    removed: list[Named] = field(default_factory=list)
    kept: list[Named] = field(default_factory=list)
    failed: list[tuple[Named, str]] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)
    secret_folders: list[str] = field(default_factory=list)
    pins: list[str] = field(default_factory=list)
    access: list[str] = field(default_factory=list)
    folders: FolderSweep = field(default_factory=FolderSweep)
    emptied: list[str] = field(default_factory=list)
    sessions: SessionPrune = field(default_factory=SessionPrune)
    snapshot_leftovers: list[str] = field(default_factory=list)
    """What half-made snapshots left (a dead maker's temporary folder, an image of no
    snapshot); a snapshot itself is never removed by gc."""

    @property
    def ok(self) -> bool:
        """Whether everything that should have gone went."""
        return not self.failed and not self.sessions.failed

    def to_dict(self) -> dict[str, Any]:
        """``orchestrator gc --json``'s answer."""
        return {
            "removed": [{"kind": o.kind, "name": o.name} for o in self.removed],
            "shared_removed": self.shared,
            "secret_folders_removed": self.secret_folders,
            "mount_pins_removed": self.pins,
            "access_restored": self.access,
            "run_folders_removed": self.folders.removed,
            "run_folders_left": [{"name": n, "reason": r} for n, r in self.folders.left],
            "sessions_removed": [s.session_id for s in self.sessions.removed],
            "empty_sessions_removed": self.emptied,
            "sessions_in_use": self.sessions.in_use,
            "snapshot_leftovers_removed": self.snapshot_leftovers,
            "kept": len(self.kept),
            "failed": [{"kind": o.kind, "name": o.name, "error": e} for o, e in self.failed]
            + [{"kind": "session", "name": n, "error": e} for n, e in self.sessions.failed],
        }


def collect_all(
    project_dir: Path | None = None,
    *,
    everything: bool = False,
    idle: float = 600,
    sessions_age: float | None = None,
    engine: Engine | None = None,
) -> GcSummary:
    """See the module docstring. ``project_dir`` without a project file (or None): only
    what is not a project's. ``engine``: the Docker-shaped engine (default: Docker's)."""
    from orchestrator.backends import make_backend
    from orchestrator.docker import DockerEngine
    from orchestrator.runtime.mount_sources import sweep_pins
    from orchestrator.runtime.secrets import sweep_orphaned

    docker = engine or DockerEngine()
    summary = GcSummary()
    for name in GC_ORDER:
        collected = make_backend(name, engine=docker).collect_garbage(everything=everything)
        summary.removed += collected.removed
        summary.kept += collected.kept
        summary.failed += collected.failed
    summary.shared = docker.collect_shared(idle)
    summary.secret_folders = sweep_orphaned()
    summary.pins = sweep_pins()  # once their containers are gone
    if project_dir is None:
        return summary
    if not (project_dir / PROJECT_FILE).is_file() and sessions_age is None:
        return summary  # nothing of a project's to do (sessions need one: refused below)
    project = load_project(project_dir)
    sandbox = project.sandbox_root
    audit = open_audit(project)
    if os.geteuid() == 0:  # what runs of dead orchestrators opened up for their workers
        from orchestrator.runtime.access import sweep as sweep_access

        summary.access = sweep_access(project, everything=everything, audit=audit)
    if (sandbox / "runs").is_dir():  # after access: it frees some
        from orchestrator.runtime.run_folders import sweep as sweep_folders

        summary.folders = sweep_folders(sandbox, everything=everything, audit=audit)
    containers = [o for o in summary.removed if isinstance(o, ManagedObject)]
    if containers:
        from orchestrator.runtime.session_folders import remove_empty_sessions

        summary.emptied = remove_empty_sessions(docker, sandbox, containers)
    if (sandbox / "snapshots").is_dir():
        from orchestrator.runtime.snapshots import SnapshotEngine, collect_snapshot_garbage

        images = docker if isinstance(docker, SnapshotEngine) else None
        summary.snapshot_leftovers = collect_snapshot_garbage(project, images)
        for name in summary.snapshot_leftovers:
            audit.record("gc.snapshot_leftover", metadata={"name": name})
    if sessions_age is not None:
        from orchestrator.runtime.session_folders import prune_old_sessions

        summary.sessions = prune_old_sessions(docker, sandbox, sessions_age, audit)
    return summary
