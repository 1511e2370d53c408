"""What a plan's network needs from the engine, made ready before the worker is created.

``none`` needs nothing. An allowlist needs the run's own internal network (owner-labelled
like the run's container, removed with the run, or by ``gc`` after a crash) and its
egress proxy (:mod:`orchestrator.docker.egress`) attached to it as ``proxy``. ``full``
needs the project's own bridge network with outbound access and inter-container traffic
turned off (never Docker's default bridge, which every container shares), so no run on it
reaches another. Proxies and project networks are shared between runs, so they carry no
owner labels; :func:`collect_shared` removes the ones no container uses any more.
"""

from __future__ import annotations

import hashlib
import ipaddress
from datetime import UTC, datetime, timedelta

from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.config.allowlist import validate_allowlist
from orchestrator.docker import podman
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.docker.credproxy_spares import remove_spares
from orchestrator.docker.egress import (
    BRIDGE_PREFIX,
    EGRESS_ROLE,
    PROXY_PREFIX,
    SHARED,
    attach,
    ensure_egress,
    ensure_network,
    network_users,
    remove_network,
    shared_labels,
)
from orchestrator.docker.egress_gc import remove_idle_egress
from orchestrator.docker.egress_log import DecisionLog
from orchestrator.docker.netnames import network_name
from orchestrator.errors import EngineError
from orchestrator.plan import ContainerSpec
from orchestrator.policy.network import egress_key
from orchestrator.runtime.engine import EgressLog, ManagedObject

#: Containers on the project's ``full`` network must not reach each other.
NO_ICC = {"com.docker.network.bridge.enable_icc": "false"}

#: The subnets of the run networks this process set up, by name: a run's decisions are
#: told apart by them even when its network is already gone when they are read.
_RUN_SUBNETS: dict[str, list[ipaddress.IPv4Network]] = {}
#: The decision logs this process follows, by run network (:mod:`.egress_log`).
_FOLLOWED: dict[str, DecisionLog] = {}


def set_up_network(engine: DockerClient, spec: ContainerSpec) -> ManagedObject | None:
    """Create or reuse what ``spec``'s network mode needs; return the run's own network
    (an allowlist's), which the run removes at its end."""
    if spec.network.mode == "allowlist":
        return _open_run_network(engine, spec)
    if spec.network.mode == "full":
        if not spec.network.project:
            raise EngineError(
                f"the plan of '{spec.worker}' has network full but no project key; rebuild the plan"
            )
        bridge = "ofl-" + spec.network.project[:11]
        ensure_network(
            engine,
            network_name(spec),
            internal=False,
            bridge=bridge,
            labels_=shared_labels("full"),
            options=NO_ICC,
        )
    return None


def _open_run_network(engine: DockerClient, spec: ContainerSpec) -> ManagedObject:
    """The run's own internal network, with the allowlist's proxy attached as ``proxy``."""
    if not spec.run_id:
        raise EngineError(
            f"the plan of '{spec.worker}' has an allowlist but no run id to name its own "
            "network after; rebuild the plan"
        )
    name = network_name(spec)
    allow = validate_allowlist(spec.network.allow)
    run_labels = {labels.RUN_ID: spec.run_id, labels.WORKER: spec.worker, EGRESS_ROLE: "run"}
    bridge = BRIDGE_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:11]
    with engine_errors(f"creating the run's network {name}"):
        try:
            podman.create_run_network(
                engine, name, labels=engine.labels_for(run_labels), bridge=bridge
            )
        except docker_errors.APIError as exc:
            if exc.status_code != 409:  # 409: made by an earlier attempt of this run
                raise
    try:
        _RUN_SUBNETS[name] = _run_subnets(engine, name)
        retried = False
        while True:
            egress = ensure_egress(engine, allow, services=spec.network.services)
            try:
                attach(engine, egress, name)
                _follow(engine, spec, name)
                return ManagedObject("network", name, name, run_labels)
            except docker_errors.NotFound:
                if retried:  # the proxy was removed as idle just now: set it up again once
                    raise EngineError(f"the egress proxy for {name} vanished twice") from None
                retried = True
    except BaseException:
        release_network(engine, name)
        raise


def run_hosts(engine: DockerClient, spec: ContainerSpec) -> dict[str, str] | None:
    """An allowlisted run's /etc/hosts entry: ``proxy`` -> the egress proxy's address on
    the run's network (None for other runs).

    The worker finds its proxy without asking a DNS server: Podman's run networks have
    none (see :func:`orchestrator.docker.podman.create_run_network`), and Docker's
    embedded one fails to answer in time on a loaded machine (the worker's requests then
    fail with "Temporary failure in name resolution"), as builds found first.
    """
    if spec.network.mode != "allowlist":
        return None
    return podman.proxy_hosts(engine, network_name(spec))


def release_network(engine: DockerClient, network: str) -> bool:
    """Remove an owned network, first disconnecting what is left on it (the shared proxy
    of a finished run); True when it is gone."""
    _RUN_SUBNETS.pop(network, None)
    followed = _FOLLOWED.pop(network, None)
    if followed is not None:
        followed.stop()
    with engine_errors(f"removing network {network}"):
        try:
            info = retrying(lambda: engine.api.inspect_network(network))
        except docker_errors.NotFound:
            return True
        for container in info.get("Containers") or {}:
            try:
                engine.api.disconnect_container_from_network(container, network, force=True)
            except docker_errors.NotFound:
                continue
            except docker_errors.APIError as exc:
                if exc.status_code not in (403, 409):  # 403/409: already leaving
                    raise
    return remove_network(engine, str(info["Id"]))


def _proxy_of(engine: DockerClient, spec: ContainerSpec) -> str | None:
    """The id of the proxy serving ``spec``'s allowlist now (None: there is none)."""
    allow = validate_allowlist(spec.network.allow)
    name = PROXY_PREFIX + egress_key(allow, tuple(sorted(set(spec.network.services))))
    with engine_errors(f"looking up the egress proxy {name}"):
        try:
            return str(engine.api.inspect_container(name)["Id"])
        except docker_errors.NotFound:
            return None


def _follow(
    engine: DockerClient, spec: ContainerSpec, network: str, since: datetime | None = None
) -> None:
    """Start following the proxy's decisions on the run's network (:mod:`.egress_log`)."""
    if network in _FOLLOWED:
        return
    _FOLLOWED[network] = DecisionLog(
        engine,
        lambda: _proxy_of(engine, spec),
        _RUN_SUBNETS.get(network, []),
        since or datetime.now(UTC) - timedelta(seconds=1),
    )


def follow_decisions(engine: DockerClient, spec: ContainerSpec, since: datetime) -> None:
    """Follow the decisions on ``spec``'s network again from ``since``, after
    :func:`network_decisions` took those before (a build reads its decisions step by
    step on one network); the follower stops when the network is released."""
    if spec.network.mode == "allowlist" and network_name(spec) in _RUN_SUBNETS:
        _follow(engine, spec, network_name(spec), since)


def network_decisions(engine: DockerClient, spec: ContainerSpec, since: datetime) -> EgressLog:
    """The egress proxy's allow/deny decisions for this run's requests since ``since``.

    Requests are told apart by the client's address, which lies in the run's own network.
    The decisions were followed since the network was attached (:func:`_follow`); this
    reads the rest. Without a follower (another process set the run up) the proxy's log is
    read once, from the run's subnet (read before that network is removed at the end of
    the run, or remembered from when it was set up); when that is unknown there are none:
    the proxy's other decisions are other runs'.
    """
    if spec.network.mode != "allowlist":
        return EgressLog()
    name = network_name(spec)
    followed = _FOLLOWED.pop(name, None)
    if followed is None:
        subnets = _run_subnets(engine, name) or _RUN_SUBNETS.get(name, [])
        if not subnets:
            return EgressLog()
        followed = DecisionLog(
            engine, lambda: _proxy_of(engine, spec), subnets, since, follow=False
        )
    return followed.close()


def _run_subnets(engine: DockerClient, network: str) -> list[ipaddress.IPv4Network]:
    with engine_errors(f"inspecting network {network}"):
        try:
            info = engine.api.inspect_network(network)
        except docker_errors.NotFound:
            return []
    configs = (info.get("IPAM") or {}).get("Config") or []
    return [
        ipaddress.IPv4Network(c["Subnet"])
        for c in configs
        if c.get("Subnet") and ":" not in c["Subnet"]
    ]


def _in_any(address: str, subnets: list[ipaddress.IPv4Network]) -> bool:
    try:
        parsed = ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return any(parsed in subnet for subnet in subnets)


def collect_shared(engine: DockerClient, idle_seconds: float) -> list[str]:
    """Remove idle egress proxies and networks, project networks no container uses, and
    spare credential proxies that exited or waited ``idle_seconds``."""
    removed = remove_spares(engine, idle_seconds)
    removed += remove_idle_egress(engine, idle_seconds)
    with engine_errors("listing shared networks"):
        networks = engine.api.networks(filters={"label": f"{EGRESS_ROLE}=full"})
    for network in networks:
        if (network.get("Labels") or {}).get(SHARED) != "true":
            continue
        if network_users(engine, network["Name"], network["Id"]):
            continue
        with engine_errors(f"removing network {network['Name']}"):
            try:
                podman.remove_network(engine, network["Id"])
            except docker_errors.NotFound:
                continue
            except docker_errors.APIError as exc:
                if exc.status_code in (403, 409):  # a run attached meanwhile
                    continue
                raise
        removed.append(network["Name"])
    return removed
