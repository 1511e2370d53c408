"""Restriction: a child's grant, with its parent's grant as the ceiling.

``restrict(parent, child)`` either returns a grant no wider than the parent's in any respect
(zones and their subtrees, modes, network, trust, resources, children; its isolation runtime
at least as strong) or refuses, naming the problem: "child 'formatter' asks rw on 'data' but
parent 'main' has ro". What a child *declares* beyond its parent is an error; what it would
get implicitly (its trust profile's standard zones, default limits, the project's default
network, its level's isolation) is capped silently.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.config import Project, Worker
from orchestrator.config.models import ISOLATION_ORDER, Isolation, human_size
from orchestrator.errors import PolicyError
from orchestrator.policy.grant import Grant, Limits, RunPaths, ZoneGrant, assess_grant
from orchestrator.policy.network import NetworkGrant, describe, narrower_or_equal
from orchestrator.policy.trust import rank
from orchestrator.vocabulary import PRE_APPROVED

#: How freely a zone may be changed: a child never gets a freer approval than its parent.
APPROVAL_ORDER = {"blocked": 0, "ask": 1, PRE_APPROVED: 2}


def covers(outer: ZoneGrant, inner: ZoneGrant) -> bool:
    """Whether ``outer`` exposes everything ``inner`` would, at least as widely.

    For writable zones the approval counts too: a parent that changes a zone only through
    review (``write: ask``) or may not delete in it cannot pass direct writes or deletes on.
    """
    same_tree = inner.target == outer.target or inner.target.startswith(outer.target + "/")
    if not same_tree or (outer.mode == "ro" and inner.mode == "rw"):
        return False
    if inner.mode == "ro":
        return True
    reviewed = outer.ask_base is None or inner.ask_base is not None
    return reviewed and APPROVAL_ORDER[inner.delete] <= APPROVAL_ORDER[outer.delete]


def restrict(
    parent: Grant, parent_name: str, project: Project, child: Worker, paths: RunPaths
) -> Grant:
    """The grant ``child`` gets when ``parent_name`` (holding ``parent``) calls it."""
    name = child.name
    if name not in parent.children:
        allowed = ", ".join(parent.children) or "none"
        raise PolicyError(
            [
                f"parent '{parent_name}' may not call '{name}' (its children: {allowed}); "
                f"add '{name}' to children: in {parent_name}.worker"
            ]
        )
    declared_trust = child.config.trust
    problems: list[str] = []
    if rank(declared_trust) > rank(parent.trust):
        problems.append(
            f"child '{name}' declares trust '{declared_trust}' but parent "
            f"'{parent_name}' runs at '{parent.trust}'; a child's trust can only be lower"
        )
    own, refused = assess_grant(project, child, paths, trust=declared_trust)
    problems += refused  # reported together with the ceiling's problems below
    zones: list[ZoneGrant] = []
    for zone in own.zones:
        ceiling = [p for p in parent.zones if p.name == zone.name and p.standard == zone.standard]
        if any(covers(p, zone) for p in ceiling):
            zones.append(zone)
        elif zone.standard:
            read_only = replace(zone, mode="ro")
            if any(covers(p, read_only) for p in ceiling):
                zones.append(read_only)  # an implicit preset: capped to what the parent has
        elif any(
            p.mode == "rw" and covers(replace(p, mode="ro"), replace(zone, mode="ro"))
            for p in ceiling
        ):
            problems.append(
                f"child '{name}' asks to change '{zone.name}' more freely than parent "
                f"'{parent_name}' may (approval write/delete); declare the same approval"
            )
        elif any(covers(p, replace(zone, mode="ro")) for p in ceiling):
            problems.append(
                f"child '{name}' asks rw on '{zone.name}' but parent '{parent_name}' has ro"
            )
        elif ceiling:
            seen = ", ".join(p.target for p in ceiling)
            problems.append(
                f"child '{name}' asks for {zone.target} but parent '{parent_name}' only "
                f"sees {seen}; restrict the child to a subtree the parent has"
            )
        else:
            problems.append(
                f"child '{name}' asks for zone '{zone.name}' but parent '{parent_name}' "
                "has no access to it"
            )
    network = _network(own.network, parent.network, child, parent_name, problems)
    limits = _limits(own.limits, parent.limits, child, parent_name, problems)
    isolation = _isolation(own.isolation, parent.isolation, child, parent_name, problems)
    problems += [
        f"child '{name}' asks secret '{secret}' but parent '{parent_name}' does not hold it"
        for secret in own.secrets
        if secret not in parent.secrets
    ]
    problems += [
        f"child '{name}' asks egress credential '{secret}' but parent '{parent_name}' does "
        "not hold it"
        for secret in own.egress
        if secret not in parent.egress
    ]
    if problems:
        raise PolicyError(problems)
    masks = tuple(dict.fromkeys((*own.masks, *parent.masks)))
    return replace(
        own, zones=tuple(zones), network=network, limits=limits, masks=masks, isolation=isolation
    )


def _network(
    wanted: NetworkGrant,
    ceiling: NetworkGrant,
    child: Worker,
    parent_name: str,
    problems: list[str],
) -> NetworkGrant:
    if narrower_or_equal(wanted, ceiling):
        return wanted
    if child.config.network is not None:
        problems.append(
            f"child '{child.name}' asks network '{describe(wanted)}' but parent "
            f"'{parent_name}' has '{describe(ceiling)}'; a child's network can only be narrower"
        )
    return ceiling  # an undeclared (project default) network is capped to the parent's


def _isolation(
    wanted: Isolation, floor: Isolation, child: Worker, parent_name: str, problems: list[str]
) -> Isolation:
    """A child of a gVisor parent runs under gVisor too: asking runc is refused, an
    implicit runc (its trust level's) is raised to the parent's."""
    if ISOLATION_ORDER.index(wanted) >= ISOLATION_ORDER.index(floor):
        return wanted
    if child.config.isolation is not None:
        problems.append(
            f"child '{child.name}' asks isolation '{wanted}' but parent '{parent_name}' runs "
            f"under '{floor}'; a child's isolation can only be as strong or stronger"
        )
    return floor


def _limits(
    wanted: Limits, ceiling: Limits, child: Worker, parent_name: str, problems: list[str]
) -> Limits:
    declared = child.config.resources
    values: dict[str, float] = {}
    for field in Limits.FIELDS:
        mine, theirs = getattr(wanted, field), getattr(ceiling, field)
        if mine > theirs and getattr(declared, field) is not None:
            problems.append(
                f"child '{child.name}' asks {field} {_amount(field, mine)} but parent "
                f"'{parent_name}' has {_amount(field, theirs)}; a child's resources can only "
                "be smaller"
            )
        values[field] = min(mine, theirs)
    return Limits.of(values)


def _amount(field: str, value: float) -> str:
    if field in ("memory", "tmp"):
        return human_size(value)
    return f"{value:g} s" if field == "timeout" else f"{value:g}"
