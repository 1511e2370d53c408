"""Policy: trust levels, grants, restriction and path checks. Pure: no docker, no git."""

from orchestrator.policy.grant import (
    BUILTIN_LIMITS,
    Grant,
    Limits,
    RunPaths,
    ZoneGrant,
    grant_for,
)
from orchestrator.policy.identity import worker_identity
from orchestrator.policy.paths import ZoneView
from orchestrator.policy.restrict import covers, restrict
from orchestrator.policy.trust import PROFILES, effective_trust

__all__ = [
    "BUILTIN_LIMITS",
    "PROFILES",
    "Grant",
    "Limits",
    "RunPaths",
    "ZoneGrant",
    "ZoneView",
    "covers",
    "effective_trust",
    "grant_for",
    "restrict",
    "worker_identity",
]
