"""Grants: what one run actually gets, computed from the project and a worker file.

A grant is checked before anything exists: a zone the project lacks, or a mode wider than
the zone allows, is refused with every problem listed at once. No ``sandbox`` section means
no zones at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import Project, Resources, Worker
from orchestrator.errors import PolicyError

#: Built-in limits, used where neither the worker nor the project sets one.
BUILTIN_LIMITS = Resources(memory=512 << 20, cpus=1.0, pids=256, timeout=600.0, tmp=64 << 20)


@dataclass(frozen=True)
class ZoneGrant:
    """One zone as a run gets it: the host folder, where it appears, and the mode."""

    name: str
    host_path: Path
    target: str
    mode: str

    @property
    def read_only(self) -> bool:
        return self.mode == "ro"


@dataclass(frozen=True)
class Limits:
    """Resolved resource limits for one container."""

    memory: int
    cpus: float
    pids: int
    timeout: float
    tmp: int


@dataclass(frozen=True)
class Grant:
    """Everything a run is allowed: zones, network and limits."""

    zones: tuple[ZoneGrant, ...]
    network: str
    limits: Limits

    def zone(self, name: str) -> ZoneGrant | None:
        return next((z for z in self.zones if z.name == name), None)


def resolve_limits(*layers: Resources) -> Limits:
    """Merge resource layers, most specific first, over the built-in limits."""
    merged: dict[str, float | int] = {}
    for field in Resources.model_fields:
        for layer in (*layers, BUILTIN_LIMITS):
            value = getattr(layer, field)
            if value is not None:
                merged[field] = value
                break
    return Limits(
        memory=int(merged["memory"]),
        cpus=float(merged["cpus"]),
        pids=int(merged["pids"]),
        timeout=float(merged["timeout"]),
        tmp=int(merged["tmp"]),
    )


def grant_for(project: Project, worker: Worker, *, timeout: float | None = None) -> Grant:
    """Check ``worker``'s requests against ``project`` and return its grant."""
    problems: list[str] = []
    zones: list[ZoneGrant] = []
    requests = worker.config.sandbox.zones if worker.config.sandbox else []
    offered = ", ".join(sorted(project.zones)) or "none"
    for index, request in enumerate(requests):
        where = f"{worker.file}: sandbox.zones[{index}]"
        zone = project.zones.get(request.name)
        if zone is None:
            problems.append(
                f"{where}: zone '{request.name}' is not declared in {project.file} "
                f"(zones: {offered}); add it there or remove it here"
            )
            continue
        if request.mode == "rw" and zone.mode != "rw":
            problems.append(
                f"{where}: asks rw on zone '{request.name}' but {project.file} allows "
                f"only {zone.mode}; ask for ro or raise the zone's mode"
            )
            continue
        zones.append(
            ZoneGrant(
                name=zone.name,
                host_path=zone.host_path,
                target=f"/{zone.name}",
                mode=request.mode,
            )
        )
    if problems:
        raise PolicyError(problems)
    limits = resolve_limits(
        Resources(timeout=timeout), worker.config.resources, project.config.defaults.resources
    )
    network = worker.config.network or project.config.defaults.network
    return Grant(zones=tuple(zones), network=network, limits=limits)
