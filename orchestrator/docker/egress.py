"""Allowlisted egress under Docker: the proxy of :mod:`orchestrator.egress` as a shared container.

A worker with ``network: {allow: [...]}`` is attached to an *internal* Docker network (no
route out) of its own (:mod:`.networks` creates and removes it with the run). The only
other member of that network is a squid proxy (``images/proxy``), which sits on one shared
outside bridge (``orchestrator-egress``) and joins each run's network with the alias
``proxy`` (:func:`attach`). The proxy admits plain HTTP and HTTPS ``CONNECT`` to the listed
hosts and ports only, and logs every decision (with the client's address) on its stdout,
within a budget per client; each run follows its own decisions there while it runs
(:mod:`.egress_log`), and :func:`decisions` reads them back at once.

One proxy exists per distinct allowlist (and set of local service networks it joins),
named after a hash of both (the *key*), and is shared by every run with that allowlist:
:func:`ensure_egress` creates it or reuses what is already up and healthy, and is safe to
call from several processes at once. Shared objects outlive the run that created them, so
they do not carry the per-process owner labels; :mod:`.egress_gc` removes them once no run
uses them. What the proxy is given and answers (its image, environment, limits, health
check and decision log) is the engine-neutral contract in :mod:`orchestrator.egress`;
this module only renders it for Docker. See docs/network.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import docker.types
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.config.allowlist import AllowEntry, allowlist_key, validate_allowlist
from orchestrator.docker import podman
from orchestrator.docker.client import DockerClient, engine_errors, is_transient, retrying
from orchestrator.docker.images import build_image
from orchestrator.docker.netnames import is_run_network
from orchestrator.docker.podman import security_opt_for, tmpfs_for, ulimits_for
from orchestrator.docker.seccomp import default_security_opt
from orchestrator.egress import (
    PROXY_ALIAS,
    PROXY_HEALTH,
    PROXY_IMAGE,
    PROXY_LOG_OPTIONS,
    PROXY_MEMORY,
    PROXY_NANO_CPUS,
    PROXY_NOFILE,
    PROXY_PIDS,
    PROXY_TMP,
    PROXY_TMP_SIZE,
    PROXY_URL,
    PROXY_VERSION,
    Decision,
    allow_text,
    network_env,
    parse_decisions,
    proxy_environment,
)
from orchestrator.errors import EngineError, ImageMissing
from orchestrator.policy.network import egress_key

__all__ = [
    "OUTSIDE_NETWORK",
    "AllowEntry",
    "Egress",
    "allowlist_key",
    "attach",
    "build_proxy_image",
    "decisions",
    "ensure_egress",
    "ensure_outside_network",
    "proxy_env",
    "validate_allowlist",
]

T = TypeVar("T")
Progress = Callable[[str], None]
Role = Literal["proxy", "internal", "outside", "full", "run"]

#: The bridge every proxy shares to reach the outside.
OUTSIDE_NETWORK = "orchestrator-egress"
PROXY_PREFIX = "orchestrator-egress-proxy-"
#: Host interface names of the bridges (at most 15 characters): ``oeg-outside`` and
#: ``oeg-<key prefix>``. Fixed names make the host firewall rule in docs/network.md
#: simple, and the kernel's uniqueness of interface names makes a racing second creation
#: of the same network fail instead of leaving two networks with one name.
BRIDGE_PREFIX = "oeg-"
OUTSIDE_BRIDGE = "oeg-outside"

SHARED = labels.SHARED
EGRESS_KEY = f"{labels.PREFIX}.egress-key"
EGRESS_ROLE = f"{labels.PREFIX}.egress-role"
EGRESS_ALLOW = f"{labels.PREFIX}.egress-allow"
#: The proxy's configuration version (:data:`orchestrator.egress.PROXY_VERSION`).
EGRESS_VERSION = f"{labels.PREFIX}.egress-version"

#: The proxy's /tmp (:data:`orchestrator.egress.PROXY_TMP_SIZE`), never executable.
PROXY_TMPFS = {PROXY_TMP: f"rw,nosuid,nodev,noexec,size={PROXY_TMP_SIZE >> 20}m,mode=1777"}

#: A proxy started longer ago than this is taken to be ready without asking it.
_READY_GRACE = timedelta(seconds=60)
#: A proxy container still in state ``created`` after this long was abandoned by its
#: creator (a killed process) and is replaced.
_STALE_CREATED = timedelta(seconds=20)
KEY_PATTERN = re.compile(r"^[0-9a-f]{16}$")
_DOCKER_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


# -- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Egress:
    """A ready proxy: :func:`attach` it to a run's internal network, put the worker on that
    network and give it :func:`proxy_env`.

    ``proxy_container`` is the proxy container's id; ``services`` are the local service
    networks it has joined.
    """

    proxy_url: str
    proxy_container: str
    key: str
    allow: tuple[AllowEntry, ...] = field(default=())
    services: tuple[str, ...] = field(default=())


def proxy_env(egress: Egress) -> dict[str, str]:
    """The environment that sends a worker's HTTP(S) clients through the proxy."""
    return network_env(egress.proxy_url)


# -- engine plumbing --------------------------------------------------------------------


def _explanation(exc: docker_errors.APIError) -> str:
    detail = exc.explanation or str(exc)
    if isinstance(detail, bytes):
        detail = detail.decode(errors="replace")
    return str(detail)


def shared_labels(role: Role, key: str = "", allow: str = "") -> dict[str, str]:
    """Labels of a shared egress object: managed and shared, but no owner process."""
    found = {labels.MANAGED: "true", SHARED: "true", EGRESS_ROLE: role}
    if key:
        found[EGRESS_KEY] = key
    if allow:
        found[EGRESS_ALLOW] = allow
    return found


def parse_docker_time(text: str) -> datetime | None:
    """Docker's RFC 3339 times (nanoseconds) as aware datetimes; None for the zero time."""
    match = _DOCKER_TIME.match(text or "")
    if not match or text.startswith("0001-"):
        return None
    whole, fraction, zone = match.groups()
    micro = (fraction or "0")[:6].ljust(6, "0")
    zone = "+00:00" if zone == "Z" else zone
    return datetime.fromisoformat(f"{whole}.{micro}{zone}").astimezone(UTC)


def _as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive datetime is taken to be UTC already (as in the audit)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def now() -> datetime:
    return datetime.now(UTC)


def _inspect_container(engine: DockerClient, name: str) -> dict[str, Any] | None:
    with engine_errors(f"looking up the egress proxy {name}"):
        try:
            info: dict[str, Any] = retrying(lambda: engine.api.inspect_container(name))
        except docker_errors.NotFound:
            return None
    return info


def networks_named(engine: DockerClient, name: str) -> list[dict[str, Any]]:
    """Networks whose name is exactly ``name`` (the engine's name filter matches parts)."""
    with engine_errors(f"listing networks named {name}"):
        found = retrying(lambda: engine.api.networks(names=[name])) or []
    return [n for n in found if n.get("Name") == name]


def network_users(engine: DockerClient, network: str, network_id: str) -> list[dict[str, Any]]:
    """Containers in any state that reference a network (by name or id)."""
    wanted = [v for v in (network, network_id) if v]
    with engine_errors(f"listing the containers on network {network}"):
        found = retrying(lambda: engine.api.containers(all=True, filters={"network": wanted}))
    return list(found or [])


def remove_container(engine: DockerClient, container: str) -> None:
    with engine_errors(f"removing the egress proxy {container}"):
        try:
            retrying(lambda: engine.api.remove_container(container, force=True, v=True))
        except docker_errors.NotFound:
            pass
        except docker_errors.APIError as exc:
            if exc.status_code != 409:  # removal already in progress elsewhere
                raise


def remove_network(engine: DockerClient, network: str) -> bool:
    """Remove a network; True when it is gone, False when it is still in use."""
    with engine_errors(f"removing network {network}"):
        try:
            retrying(lambda: podman.remove_network(engine, network))
        except docker_errors.NotFound:
            return True
        except docker_errors.APIError as exc:
            if exc.status_code in (403, 409) or "active endpoints" in _explanation(exc):
                return False
            raise
    return True


def ensure_network(
    engine: DockerClient,
    name: str,
    *,
    internal: bool,
    bridge: str,
    labels_: dict[str, str],
    options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Find or create a labelled bridge network called ``name``; return its summary.

    Two processes may try at once. The fixed bridge interface name makes the engine refuse
    the second creation (403 "same bridge name") or the name check refuses it (409); the
    loser then finds the winner's network on the next look. An existing network lacking
    one of ``options`` (e.g. made by an older version) is replaced while no container uses
    it, and refused, naming the fix, while one does.
    """
    role = labels_.get(EGRESS_ROLE, "")
    wanted = dict(options or {})
    for _attempt in range(5):
        found = networks_named(engine, name)
        if found:
            network = min(found, key=lambda n: (str(n.get("Created", "")), n["Id"]))
            got = network.get("Labels") or {}
            if got.get(SHARED) != "true" or got.get(EGRESS_ROLE) != role:
                raise EngineError(
                    f"a network named '{name}' exists that the orchestrator did not create "
                    f"as egress {role} network; remove it (`docker network rm {name}`)"
                )
            if bool(network.get("Internal")) != internal:
                raise EngineError(
                    f"network '{name}' has the wrong 'internal' setting; remove it "
                    f"(`docker network rm {name}`) and try again"
                )
            if wanted and not _has_options(engine, network, wanted):
                _replace_outdated(engine, network, wanted)
                continue
            return network
        with engine_errors(f"creating the egress network {name}"):
            try:
                engine.api.create_network(
                    name,
                    driver="bridge",
                    internal=internal,
                    labels=labels_,
                    check_duplicate=True,
                    options={"com.docker.network.bridge.name": bridge, **wanted},
                )
            except docker_errors.APIError as exc:
                text = _explanation(exc)
                racing = exc.status_code == 409 or "same bridge name" in text
                if not racing and not is_transient(exc):
                    raise
                time.sleep(0.05)
    raise EngineError(f"could not create or find the egress network '{name}'")


def _has_options(engine: DockerClient, network: dict[str, Any], wanted: Mapping[str, str]) -> bool:
    got = network.get("Options")
    if got is None:  # the list answer lacked them: ask the network itself
        with engine_errors(f"inspecting network {network['Name']}"):
            got = engine.api.inspect_network(network["Id"]).get("Options")
    got = got or {}
    return all(got.get(key) == value for key, value in wanted.items())


def _replace_outdated(
    engine: DockerClient, network: dict[str, Any], wanted: Mapping[str, str]
) -> None:
    """Remove a network made without ``wanted`` options, unless a container uses it."""
    name = str(network["Name"])
    users = [
        str((u.get("Names") or ["?"])[0]).lstrip("/")
        for u in network_users(engine, name, str(network["Id"]))
    ]
    settings = ", ".join(f"{key}={value}" for key, value in wanted.items())
    if users or not remove_network(engine, str(network["Id"])):
        raise EngineError(
            f"network '{name}' was created without {settings} and is used by "
            f"{', '.join(users) or 'a container'}; stop those runs, remove it "
            f"(`docker network rm {name}`) and try again"
        )


def ensure_outside_network(engine: DockerClient) -> str:
    """Create (or find) the shared outside bridge all proxies use; return its id."""
    network = ensure_network(
        engine,
        OUTSIDE_NETWORK,
        internal=False,
        bridge=podman.outside_bridge(engine, OUTSIDE_BRIDGE),
        labels_=shared_labels("outside"),
    )
    return str(network["Id"])


# -- building and starting the proxy ----------------------------------------------------


def build_proxy_image(engine: DockerClient, base: str, progress: Progress = lambda _: None) -> None:
    """Build ``orchestrator/proxy:latest`` from ``images/proxy`` on ``base``."""
    build_image(engine, "proxy", PROXY_IMAGE, base, progress)


def ensure_egress(
    engine: DockerClient,
    allow: Sequence[AllowEntry],
    *,
    services: Sequence[str] = (),
    timeout: float = 30.0,
) -> Egress:
    """Return a ready proxy for ``allow``, creating it when needed.

    ``services`` names local service networks (the project's ``network.services``) the
    proxy joins, so that allowlist entries naming containers on them work. Reusing a
    running, healthy proxy costs one engine request. A proxy another process is creating
    at the same moment is waited for; one made by another version (its
    ``egress-version`` label), left behind half-created, stopped, or reported
    ``unhealthy`` by its health check is replaced, and the replacement joins the run
    networks the old one served. Returns only once squid accepts connections; raises
    EngineError after ``timeout`` seconds, or at once when the proxy cannot start (with the
    end of its log).
    """
    entries = tuple(sorted(set(allow)))
    if not entries:
        raise ValueError("the allowlist is empty: it would allow nothing")
    for entry in entries:
        if not isinstance(entry, AllowEntry):
            raise TypeError("ensure_egress takes entries from validate_allowlist()")
    wanted = tuple(sorted(set(services)))
    key = egress_key(entries, wanted)
    name = PROXY_PREFIX + key
    deadline = time.monotonic() + timeout
    carried: list[str] = []  # run networks a replaced proxy served
    while time.monotonic() <= deadline:
        info = _inspect_container(engine, name)
        if info is not None:
            egress = _reuse(engine, info, entries, wanted, key, deadline, carried)
        else:
            egress = _create(engine, entries, wanted, key, deadline, carried)
        if egress is not None:
            return egress
        # A stale proxy was removed, another process won the race for the name, or a
        # network vanished under a concurrent removal: look again.
    raise EngineError(f"timed out setting up the egress proxy {name}")


def attach(engine: DockerClient, egress: Egress, network: str) -> None:
    """Connect the proxy to a run's internal network as ``proxy``; a no-op when it already is.

    Raises docker's NotFound when the proxy or the network is gone (a concurrent clean-up).
    """
    try:
        engine.api.connect_container_to_network(
            egress.proxy_container, network, aliases=[PROXY_ALIAS]
        )
    except docker_errors.APIError as exc:
        if isinstance(exc, docker_errors.NotFound):
            raise
        if "already exists" in _explanation(exc):  # already attached
            return
        raise EngineError(
            f"connecting the egress proxy to network {network}: {_explanation(exc)}"
        ) from None


def _check_ours(info: dict[str, Any], key: str) -> None:
    got = (info.get("Config") or {}).get("Labels") or {}
    if got.get(SHARED) != "true" or got.get(EGRESS_KEY) != key:
        name = str(info.get("Name", "")).lstrip("/")
        raise EngineError(
            f"a container named '{name}' exists that the orchestrator did not create; "
            f"remove it (`docker rm -f {name}`)"
        )


def _attached(info: Mapping[str, Any]) -> dict[str, Any]:
    return dict(((info.get("NetworkSettings") or {}).get("Networks")) or {})


def _egress_from(
    info: dict[str, Any], entries: tuple[AllowEntry, ...], services: tuple[str, ...], key: str
) -> Egress | None:
    """The Egress a proxy container serves; None when it lost its outside network or one
    of its service networks (it cannot serve as declared any more)."""
    attached = _attached(info)
    if any(network not in attached for network in (OUTSIDE_NETWORK, *services)):
        return None
    return Egress(
        proxy_url=PROXY_URL,
        proxy_container=str(info["Id"]),
        key=key,
        allow=entries,
        services=services,
    )


def _reuse(
    engine: DockerClient,
    info: dict[str, Any],
    entries: tuple[AllowEntry, ...],
    services: tuple[str, ...],
    key: str,
    deadline: float,
    carried: list[str],
) -> Egress | None:
    """Use an existing proxy container, waiting for it if it is being set up.

    Returns None after removing a container that cannot serve (made by another version,
    stopped, unhealthy, abandoned while being created, or detached from its networks), so
    the caller creates a new one; the run networks it served are added to ``carried``.
    """
    _check_ours(info, key)
    if ((info.get("Config") or {}).get("Labels") or {}).get(EGRESS_VERSION) != PROXY_VERSION:
        _remove_outdated(engine, info, key, carried)
        return None
    container = str(info["Id"])
    while True:
        state = info.get("State") or {}
        status = state.get("Status", "")
        if status == "running":
            egress = _egress_from(info, entries, services, key)
            if egress is None or (state.get("Health") or {}).get("Status") == "unhealthy":
                break
            started = parse_docker_time(str(state.get("StartedAt", "")))
            if started is None or now() - started < _READY_GRACE:
                try:
                    _wait_ready(engine, container, deadline)
                except _Vanished:
                    return None  # its creator gave up on it: start over
            return egress
        created = parse_docker_time(str(info.get("Created", "")))
        young = created is not None and now() - created < _STALE_CREATED
        if status not in ("created", "restarting") or not young:
            break
        if time.monotonic() > deadline:
            raise EngineError(f"timed out waiting for the egress proxy {container[:12]}")
        time.sleep(0.05)  # another process is between create and start
        refreshed = _inspect_container(engine, container)
        if refreshed is None:
            return None
        info = refreshed
    carried.extend(n for n in _attached(info) if is_run_network(n) and n not in carried)
    remove_container(engine, container)
    return None


def _remove_outdated(
    engine: DockerClient, info: dict[str, Any], key: str, carried: list[str]
) -> None:
    """Remove a proxy made by another version (its rules no longer fit what runs expect),
    and the internal network older versions gave it; refuse, naming the fix, while a
    container of an older version's run still uses that network."""
    name = str(info.get("Name", "")).lstrip("/")
    container = str(info["Id"])
    label = {"label": [f"{SHARED}=true", f"{EGRESS_KEY}={key}"]}
    with engine_errors(f"listing the networks of the egress proxy {name}"):
        old_networks = retrying(lambda: engine.api.networks(filters=label)) or []
    users = [
        str((user.get("Names") or ["?"])[0]).lstrip("/")
        for network in old_networks
        for user in network_users(engine, str(network["Name"]), str(network["Id"]))
        if user["Id"] != container
    ]
    if users:
        raise EngineError(
            f"the egress proxy {name} was made by an older version and is used by "
            f"{', '.join(sorted(set(users)))}; let those runs end, then remove it "
            f"(`docker rm -f {name}`) and try again"
        )
    carried.extend(n for n in _attached(info) if is_run_network(n) and n not in carried)
    remove_container(engine, container)
    for network in old_networks:
        remove_network(engine, str(network["Id"]))  # False: a run joined it meanwhile


def _service_subnets(engine: DockerClient, services: tuple[str, ...]) -> list[str]:
    """The subnets of the declared local service networks, which must exist."""
    found: list[str] = []
    for name in services:
        networks = networks_named(engine, name)
        if not networks:
            raise EngineError(
                f"orchestrator.yaml: network.services: network '{name}' does not exist; "
                f"create it (`docker network create {name}`) or remove it from the list"
            )
        with engine_errors(f"inspecting network {name}"):
            found.extend(_subnets(engine.api.inspect_network(networks[0]["Id"])))
    return found


def _create(
    engine: DockerClient,
    entries: tuple[AllowEntry, ...],
    services: tuple[str, ...],
    key: str,
    deadline: float,
    carried: list[str],
) -> Egress | None:
    """Create and start the proxy; None when another process won the race for the name."""
    allowed = allow_text(entries)
    ensure_outside_network(engine)
    with engine_errors(f"inspecting the egress network {OUTSIDE_NETWORK}"):
        excluded = _subnets(engine.api.inspect_network(OUTSIDE_NETWORK))
    if not excluded:
        raise EngineError(f"egress network {OUTSIDE_NETWORK} has no IPv4 subnet")
    excluded += _service_subnets(engine, services)
    host_config = engine.api.create_host_config(
        network_mode=OUTSIDE_NETWORK,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=security_opt_for(engine, default_security_opt()),
        tmpfs=tmpfs_for(engine, dict(PROXY_TMPFS), read_only=True),
        mem_limit=PROXY_MEMORY,
        memswap_limit=PROXY_MEMORY,
        pids_limit=PROXY_PIDS,
        nano_cpus=PROXY_NANO_CPUS,
        init=True,
        ipc_mode="private",
        ulimits=ulimits_for(
            engine,
            [
                docker.types.Ulimit(name="nofile", soft=PROXY_NOFILE, hard=PROXY_NOFILE),
                docker.types.Ulimit(name="core", soft=0, hard=0),
            ],
        ),
        log_config=docker.types.LogConfig(type="json-file", config=dict(PROXY_LOG_OPTIONS)),
    )
    name = PROXY_PREFIX + key
    with engine_errors(f"creating the egress proxy {name}"):
        try:
            created = engine.api.create_container(
                image=PROXY_IMAGE,
                name=name,
                environment=proxy_environment(entries, excluded),
                labels=labels.explicit(
                    {**shared_labels("proxy", key, allowed), EGRESS_VERSION: PROXY_VERSION}
                ),
                host_config=host_config,
                healthcheck=_healthcheck(),
                use_config_proxy=False,
            )
        except docker_errors.ImageNotFound:
            raise ImageMissing(PROXY_IMAGE) from None
        except docker_errors.APIError as exc:
            if exc.status_code == 409:
                return None  # another process created it first: reuse theirs
            if exc.status_code == 404 and "image" in _explanation(exc).lower():
                raise ImageMissing(PROXY_IMAGE) from None
            if exc.status_code == 404:
                return None  # a network vanished under us (a concurrent removal): retry
            raise
    container = str(created["Id"])
    try:
        with engine_errors(f"starting the egress proxy {name}"):
            for service in services:
                engine.api.connect_container_to_network(container, service)
            retrying(lambda: engine.api.start(container))
        _wait_ready(engine, container, deadline)
        egress = Egress(PROXY_URL, container, key, entries, services)
        for network in carried:  # the runs a replaced proxy served keep their way out
            try:
                attach(engine, egress, network)
            except docker_errors.NotFound:
                continue
        info = _inspect_container(engine, container)
    except _Vanished:
        return None  # removed under us (a concurrent clean-up): start over
    except docker_errors.NotFound:
        remove_container(engine, container)
        return None  # a network was removed by a concurrent clean-up: start over
    except BaseException:
        remove_container(engine, container)
        raise
    if info is None or _egress_from(info, entries, services, key) is None:
        raise EngineError(f"the egress proxy {name} vanished while starting")
    return egress


def _healthcheck() -> dict[str, Any]:
    second = 1_000_000_000
    return {
        "test": list(PROXY_HEALTH.test),
        "interval": int(PROXY_HEALTH.interval * second),
        "timeout": int(PROXY_HEALTH.timeout * second),
        "retries": PROXY_HEALTH.retries,
        "start_period": int(PROXY_HEALTH.start_period * second),
    }


def _subnets(network: Mapping[str, Any]) -> list[str]:
    """A network's IPv4 subnets."""
    configs = (network.get("IPAM") or {}).get("Config") or []
    return [str(c["Subnet"]) for c in configs if c.get("Subnet") and ":" not in c["Subnet"]]


#: Proxy containers this process has seen answer: reusing one costs one engine request.
_ANSWERED: set[str] = set()


class _Vanished(Exception):
    """The proxy container was removed (by its failing creator) while being waited for."""


def _answers(engine: DockerClient, container: str) -> bool:
    """Whether squid answers a request on the proxy's loopback now: its own health check
    (``egress-proxy --health``, which connects and reads an answer), run in the container.
    Not a log line: the log may be rotated, and a line says nothing of now."""
    with engine_errors("checking that the egress proxy answers"):
        try:
            exec_id = engine.api.exec_create(
                container, list(PROXY_HEALTH.test[1:]), stdout=True, stderr=True
            )["Id"]
            engine.api.exec_start(exec_id)
        except docker_errors.NotFound:
            raise _Vanished(container) from None
        except docker_errors.APIError as exc:
            # Not running (yet, or any more): a 409, or, when it stops between the exec's
            # creation and its start, the start's own refusal: the caller looks at its state.
            if exc.status_code == 409 or "is not running" in str(exc.explanation or ""):
                return False
            raise
        for _ in range(50):  # the engine records the exit code shortly after the output
            code = engine.api.exec_inspect(exec_id).get("ExitCode")
            if code is not None:
                return bool(code == 0)
            time.sleep(0.02)
    return False


def _wait_ready(engine: DockerClient, container: str, deadline: float) -> None:
    """Wait until squid answers a request (:func:`_answers`); fail fast if it exits."""
    delay = 0.05
    while True:
        if container in _ANSWERED or _answers(engine, container):
            _ANSWERED.add(container)
            return
        with engine_errors("inspecting the egress proxy"):
            try:
                state = engine.api.inspect_container(container)["State"]
            except docker_errors.NotFound:
                raise _Vanished(container) from None
        if state.get("Status") in ("exited", "dead"):
            with engine_errors("reading the egress proxy's log"):
                text = engine.api.logs(container, stdout=False, stderr=True, tail=15)
            raise EngineError(
                f"the egress proxy {container[:12]} exited with code "
                f"{state.get('ExitCode')} before accepting connections:\n"
                + text.decode(errors="replace").rstrip()
            )
        if time.monotonic() > deadline:
            raise EngineError(
                f"the egress proxy {container[:12]} did not accept connections in time"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


# -- decisions --------------------------------------------------------------------------


def decisions(engine: DockerClient, egress: Egress, since: datetime) -> list[Decision]:
    """The proxy's decisions on requests received at or after ``since`` (naive = UTC).

    A run collects its own by passing its start time. HTTPS tunnels are logged when they
    close, so read after the run's containers have gone. Only the proxy's recent log is
    kept (3 files of 10 MB), which bounds how far back this can look.
    """
    start = _as_utc(since)
    with engine_errors("reading the egress proxy's decisions"):
        try:
            raw = engine.api.logs(
                egress.proxy_container,
                stdout=True,
                stderr=False,
                since=max(start.timestamp() - 1.0, 1.0),
            )
        except docker_errors.NotFound:
            return []
    return [d for d in parse_decisions(raw.decode(errors="replace")) if d.time >= start]
