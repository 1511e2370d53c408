"""Policy: grants, limits and identities computed from declarations. Pure: no docker, no git."""

from orchestrator.policy.grant import BUILTIN_LIMITS, Grant, Limits, ZoneGrant, grant_for
from orchestrator.policy.identity import worker_identity

__all__ = ["BUILTIN_LIMITS", "Grant", "Limits", "ZoneGrant", "grant_for", "worker_identity"]
