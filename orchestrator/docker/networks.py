"""What a plan's network needs from the engine, made ready before the worker is created.

``none`` needs nothing. An allowlist needs its egress proxy and internal network
(:mod:`orchestrator.docker.egress`). ``full`` needs the project's own bridge network with
outbound access (never Docker's default bridge, which every container shares). All of
these are shared between runs, so they carry no owner labels; :func:`collect_shared`
removes the ones no container uses any more.
"""

from __future__ import annotations

from datetime import datetime

from docker import errors as docker_errors

from orchestrator.config.allowlist import validate_allowlist
from orchestrator.docker.client import DockerClient, engine_errors
from orchestrator.docker.egress import (
    EGRESS_ROLE,
    SHARED,
    decisions,
    ensure_egress,
    ensure_network,
    network_users,
    shared_labels,
)
from orchestrator.docker.egress_gc import remove_idle_egress
from orchestrator.errors import EngineError
from orchestrator.plan import ContainerSpec
from orchestrator.policy.network import FULL_PREFIX
from orchestrator.runtime.engine import EgressDecision


def prepare_network(engine: DockerClient, spec: ContainerSpec) -> None:
    """Create or reuse what ``spec.network_mode`` names."""
    if spec.egress is not None:
        egress = ensure_egress(engine, validate_allowlist(spec.egress))
        if egress.network != spec.network_mode:
            raise EngineError(
                f"the egress network is '{egress.network}' but the plan names "
                f"'{spec.network_mode}'; rebuild the plan"
            )
    elif spec.network_mode.startswith(FULL_PREFIX):
        bridge = "ofl-" + spec.network_mode.removeprefix(FULL_PREFIX)[:11]
        ensure_network(
            engine,
            spec.network_mode,
            internal=False,
            bridge=bridge,
            labels_=shared_labels("full"),
        )


def network_decisions(
    engine: DockerClient, spec: ContainerSpec, since: datetime
) -> list[EgressDecision]:
    """The egress proxy's allow/deny decisions for requests made since ``since``."""
    if spec.egress is None:
        return []
    egress = ensure_egress(engine, validate_allowlist(spec.egress))
    return [
        EgressDecision(host=d.host, port=d.port, allowed=d.allowed, method=d.method)
        for d in decisions(engine, egress, since)
    ]


def collect_shared(engine: DockerClient, idle_seconds: float) -> list[str]:
    """Remove idle egress proxies and networks, and project networks no container uses."""
    removed = remove_idle_egress(engine, idle_seconds)
    with engine_errors("listing shared networks"):
        networks = engine.api.networks(filters={"label": f"{EGRESS_ROLE}=full"})
    for network in networks:
        if (network.get("Labels") or {}).get(SHARED) != "true":
            continue
        if network_users(engine, network["Name"], network["Id"]):
            continue
        with engine_errors(f"removing network {network['Name']}"):
            try:
                engine.api.remove_network(network["Id"])
            except docker_errors.NotFound:
                continue
            except docker_errors.APIError as exc:
                if exc.status_code in (403, 409):  # a run attached meanwhile
                    continue
                raise
        removed.append(network["Name"])
    return removed
