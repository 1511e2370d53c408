"""E2B's network options at create → the project's network modes and allowlist (pure).

A sandbox's network is its worker's declaration (docs/network.md), or narrower, never
wider: ``allow_internet_access=False`` is ``none``; ``network={"deny_out":
[ALL_TRAFFIC], "allow_out": [hosts]}`` is an allowlist of those hosts (ports 80 and 443
each, as a worker's entry without a port), each of which the worker's own network must
already admit. Everything else E2B's network options can say (a denylist, per-host
rules, DNS servers, another egress proxy) has no equivalent here and is refused in one
line. The narrowed worker is then prepared again, so the project's own rules judge it
as they judge any worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.config.allowlist import AllowEntry, validate_allowlist

__all__ = ["ALL_TRAFFIC", "NetworkRefused", "narrowed"]

#: E2B's "all traffic" selector (``ALL_TRAFFIC`` in its SDK).
ALL_TRAFFIC = "0.0.0.0/0"

#: The ``network`` fields with no equivalent here, and why.
_NO_EQUIVALENT = {
    "rules": "per-host request rules are not applied here (the proxy only admits or refuses)",
    "maskRequestHost": "hosts are not masked here",
    "httpsPorts": "ports are part of each allowlist entry here (the worker's declaration)",
    "dnsServers": "a sandbox resolves no names itself: its proxy does",
    "egressProxy": "a sandbox's only way out is the project's own egress proxy",
}


class NetworkRefused(ValueError):
    """A network option the sandbox's worker (or this server) does not allow."""


def narrowed(
    body: dict[str, Any], worker: str, mode: str, allow: Sequence[str]
) -> str | list[str] | None:
    """The network the sandbox gets instead of its worker's: ``"none"``, an allowlist's
    entries, or None (the worker's own, ``mode`` with ``allow``); :class:`NetworkRefused`
    when the create asks for what the worker does not declare or this server cannot say."""
    internet = body.get("allow_internet_access")
    raw = body.get("network")
    net: dict[str, Any] = {} if raw is None else raw
    if not isinstance(net, dict):
        raise NetworkRefused("network: give an object (allow_out, deny_out)")
    problems = [f"network.{k}: {why}" for k, why in _NO_EQUIVALENT.items() if net.get(k)]
    if net.get("allowPublicTraffic"):
        problems.append("network.allow_public_traffic: no sandbox port is served here")
    if problems:
        raise NetworkRefused("; ".join(problems))
    allow_out, deny_out = _hosts(net, "allowOut"), _hosts(net, "denyOut")
    if internet is False:
        if allow_out:
            raise NetworkRefused(
                "allow_internet_access=False with network.allow_out: give one of them"
            )
        return "none"
    if allow_out is None and deny_out is None:
        if internet is True and mode != "full":
            raise NetworkRefused(
                f"allow_internet_access=True: worker {worker!r} has network {mode!r}, not "
                "full; a sandbox never gets more than its worker declares (leave "
                "allow_internet_access out for the worker's own network)"
            )
        return None
    if deny_out is None or set(deny_out) != {ALL_TRAFFIC}:
        raise NetworkRefused(
            f"network.deny_out: only all traffic ({ALL_TRAFFIC!r}, the SDK's ALL_TRAFFIC) "
            "can be denied here, with what the sandbox may reach in allow_out: a sandbox's "
            "network is an allowlist, never a denylist"
        )
    if not allow_out:
        return "none"
    if mode == "none":
        raise NetworkRefused(
            f"network.allow_out: worker {worker!r} has network 'none'; a sandbox never gets "
            "more than its worker declares"
        )
    try:
        wanted = validate_allowlist(allow_out)
    except ValueError as exc:
        raise NetworkRefused(f"network.allow_out: {exc}") from None
    if mode == "allowlist":
        declared = validate_allowlist(allow)
        outside = [str(e) for e in wanted if not any(_covers(d, e) for d in declared)]
        if outside:
            raise NetworkRefused(
                f"network.allow_out: {', '.join(outside)} not on worker {worker!r}'s "
                f"allowlist ({', '.join(str(d) for d in declared)}); a sandbox never gets "
                "more than its worker declares"
            )
    elif mode != "full":
        raise NetworkRefused(f"network.allow_out: worker {worker!r} has network {mode!r}")
    return [str(e) for e in wanted]


def _hosts(net: dict[str, Any], name: str) -> list[str] | None:
    value = net.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NetworkRefused(f"network.{name}: give a list of hosts")
    return value


def _covers(declared: AllowEntry, wanted: AllowEntry) -> bool:
    """Whether ``declared`` admits every request ``wanted`` would."""
    if declared.port != wanted.port:
        return False
    if declared.host == wanted.host:
        return True
    return declared.wildcard and wanted.host.endswith(declared.host[1:])
