"""Network grants: ``none`` < an allowlist < ``full``, and what a plan shows for them. Pure.

An allowlisted worker sits on an internal network (no route out) of its own, with the
egress proxy of its allowlist as its only other member and only way out; ``full`` uses a
per-project network with outbound access and inter-container traffic off, never the
engine's default one. No run shares a network segment with another run. The plan states
the mode; each engine adapter names and builds the networks (the Docker adapter's names
are in :mod:`orchestrator.docker.netnames`); the proxy itself is described in
:mod:`orchestrator.egress`. See docs/network.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from orchestrator.config.allowlist import AllowEntry, allowlist_key, validate_allowlist
from orchestrator.config.models import Allowlist

#: A network grant: "none", "full", or a normalised allowlist.
NetworkGrant = str | tuple[AllowEntry, ...]


def egress_key(allow: Iterable[AllowEntry], services: Iterable[str] = ()) -> str:
    """The key naming the shared proxy for an allowlist and the local service networks it
    is connected to (the allowlist's own key when there are none)."""
    entries = tuple(allow)
    joined = ",".join(sorted(set(services)))
    if not joined:
        return allowlist_key(entries)
    text = allowlist_key(entries) + "|" + joined
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def narrower_or_equal(child: NetworkGrant, parent: NetworkGrant) -> bool:
    """none < allowlist ⊆ parent's allowlist < full."""
    if parent == "full" or child == "none":
        return True
    if child == "full" or parent == "none":
        return False
    return isinstance(child, tuple) and isinstance(parent, tuple) and set(child) <= set(parent)


def describe(network: NetworkGrant) -> str:
    if isinstance(network, str):
        return network
    return "allow " + ", ".join(str(entry) for entry in network)


def network_grant(declared: str | Allowlist) -> NetworkGrant:
    """A declaration's network as a grant: "none", "full", or the normalised allowlist."""
    if isinstance(declared, str):
        return declared
    return validate_allowlist(declared.allow)


def rank(network: NetworkGrant) -> int:
    """0 none, 1 allowlist, 2 full."""
    return {"none": 0, "full": 2}.get(network, 1) if isinstance(network, str) else 1
