"""Removing shared egress objects: proxies and networks no run uses any more.

Shared objects outlive the run that created them and carry no owner labels, so the
owner-based garbage collection leaves them alone; :func:`remove_idle_egress` is their pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from docker import errors as docker_errors

from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.docker.egress import (
    EGRESS_KEY,
    EGRESS_ROLE,
    KEY_PATTERN,
    OUTSIDE_NETWORK,
    SHARED,
    network_users,
    networks_named,
    now,
    parse_docker_time,
    remove_container,
    remove_network,
    shared_labels,
)
from orchestrator.docker.netnames import is_run_network
from orchestrator.egress import parse_decisions
from orchestrator.errors import EngineError

__all__ = ["egress_keys", "is_idle", "remove_egress", "remove_idle_egress"]


def _labels_of(engine: DockerClient, target: Mapping[str, str] | str) -> dict[str, str]:
    """The labels of a shared egress object given its labels, key, id or name."""
    if not isinstance(target, str):
        return dict(target)
    if KEY_PATTERN.match(target):
        return shared_labels("internal", target)
    with engine_errors(f"looking up {target}"):
        try:
            info = engine.api.inspect_container(target)
            return dict((info.get("Config") or {}).get("Labels") or {})
        except docker_errors.NotFound:
            pass
        try:
            return dict(engine.api.inspect_network(target).get("Labels") or {})
        except docker_errors.NotFound:
            return {}


def _run_networks(proxy: Mapping[str, Any]) -> list[str]:
    """The run networks a proxy (a container list entry) is attached to: its runs."""
    attached = ((proxy.get("NetworkSettings") or {}).get("Networks")) or {}
    return sorted(name for name in attached if is_run_network(name))


def _by_key(engine: DockerClient, key: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The proxy containers and (older versions') internal networks carrying ``key``."""
    label = {"label": [f"{SHARED}=true", f"{EGRESS_KEY}={key}"]}
    with engine_errors(f"listing egress objects of {key}"):
        containers = retrying(lambda: engine.api.containers(all=True, filters=label))
        networks = retrying(lambda: engine.api.networks(filters=label))
    return list(containers or []), list(networks or [])


def is_idle(engine: DockerClient, target: Mapping[str, str] | str, idle_seconds: float) -> bool:
    """Whether a shared egress object is unused and may be removed.

    ``target`` is an object's labels (e.g. a ``ManagedObject.labels``), an egress key, or a
    container or network id or name. A proxy is idle when it is attached to no run's
    network (each run's own network is removed when the run ends, or by ``gc`` once its
    owner is gone), it started more than ``idle_seconds`` ago, and it logged no decision
    in the last ``idle_seconds``. The
    outside network is idle when no container references it. Objects that are not shared
    egress objects are never idle here.
    """
    found = _labels_of(engine, target)
    if found.get(SHARED) != "true":
        return False
    if found.get(EGRESS_ROLE) == "outside":
        return not network_users(engine, OUTSIDE_NETWORK, "")
    key = found.get(EGRESS_KEY, "")
    if not key:
        return False
    containers, networks = _by_key(engine, key)
    if any(_run_networks(proxy) for proxy in containers):
        return False
    proxies = {c["Id"] for c in containers}
    for network in networks:
        for user in network_users(engine, network["Name"], network["Id"]):
            if user["Id"] not in proxies:
                return False
    horizon = now() - timedelta(seconds=idle_seconds)
    for network in networks:
        created = parse_docker_time(str(network.get("Created", "")))
        if created is None or created > horizon:
            return False  # just made: its proxy and first worker may be on their way
    for proxy in containers:
        if float(proxy.get("Created") or 0) > horizon.timestamp():
            return False
        if proxy.get("State") != "running":
            continue
        with engine_errors("reading the egress proxy's log"):
            try:
                raw = engine.api.logs(
                    proxy["Id"], stdout=True, stderr=False, since=max(horizon.timestamp(), 1.0)
                )
            except docker_errors.NotFound:
                continue
        if any(d.time >= horizon for d in parse_decisions(raw.decode(errors="replace"))):
            return False
    return True


def egress_keys(engine: DockerClient) -> set[str]:
    """The keys of every shared proxy and internal network on the engine."""
    label = {"label": [f"{SHARED}=true", EGRESS_KEY]}
    with engine_errors("listing egress objects"):
        containers = retrying(lambda: engine.api.containers(all=True, filters=label)) or []
        networks = retrying(lambda: engine.api.networks(filters=label)) or []
    return {
        str((obj.get("Labels") or {}).get(EGRESS_KEY))
        for obj in [*containers, *networks]
        if (obj.get("Labels") or {}).get(EGRESS_KEY)
    }


def remove_egress(engine: DockerClient, key: str) -> list[str]:
    """Remove the proxy of ``key``, and the outside network when no container uses it any
    more; return the names removed. Local service networks the proxy joined are the
    user's: they are left alone.

    Raises EngineError, removing nothing, while the proxy serves a run's network: check
    :func:`is_idle` first.
    """
    containers, networks = _by_key(engine, key)
    for proxy in containers:
        if _run_networks(proxy):
            raise EngineError(
                f"egress proxy {key} is still used by {', '.join(_run_networks(proxy))}; "
                "let those runs end (or run gc) first"
            )
    proxies = {c["Id"] for c in containers}
    for network in networks:
        users = [
            str((u.get("Names") or ["?"])[0]).lstrip("/")
            for u in network_users(engine, network["Name"], network["Id"])
            if u["Id"] not in proxies
        ]
        if users:
            raise EngineError(
                f"egress network {network['Name']} is still used by {', '.join(users)}; "
                "remove those containers first"
            )
    removed: list[str] = []
    for container in containers:
        remove_container(engine, container["Id"])
        removed.append(str((container.get("Names") or [container["Id"]])[0]).lstrip("/"))
    for network in networks:
        if remove_network(engine, network["Id"]):
            removed.append(str(network["Name"]))
        else:
            raise EngineError(f"egress network {network['Name']} could not be removed")
    removed.extend(_remove_outside_if_unused(engine))
    return removed


def _remove_outside_if_unused(engine: DockerClient) -> list[str]:
    removed: list[str] = []
    for network in networks_named(engine, OUTSIDE_NETWORK):
        if (network.get("Labels") or {}).get(SHARED) != "true":
            continue
        if network_users(engine, OUTSIDE_NETWORK, network["Id"]):
            continue
        if remove_network(engine, network["Id"]):  # False: a proxy just joined it
            removed.append(OUTSIDE_NETWORK)
    return removed


def remove_idle_egress(engine: DockerClient, idle_seconds: float) -> list[str]:
    """Remove every shared proxy and network that :func:`is_idle`; return the names.

    This is the garbage collector's pass over shared egress objects, which the owner
    labels cannot cover. A proxy that becomes busy between the check and the removal
    makes :func:`remove_egress` refuse, and is kept.
    """
    removed: list[str] = []
    for key in sorted(egress_keys(engine)):
        if not is_idle(engine, key, idle_seconds):
            continue
        try:
            removed.extend(remove_egress(engine, key))
        except EngineError:
            continue
    if not removed:
        removed.extend(_remove_outside_if_unused(engine))
    return removed
