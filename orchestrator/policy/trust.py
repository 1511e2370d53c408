"""Trust levels: presets over the standard zones, and the cap they put on project zones.

=========== ======== ========= ==================== ======== ======== ==============
level       /session /workspace /staged              /repo    /workers project zones
=========== ======== ========= ==================== ======== ======== ==============
untrusted   rw       -          write-only (fresh)   -        ro       ro, or rw where
                                                                       the zone is an
                                                                       untrusted output
session     rw       rw         rw (the session's)   -        ro       as declared
workspace   rw       rw         rw (the session's)   ro       ro       as declared
full        rw       rw         rw (the session's)   rw       rw       as declared
=========== ======== ========= ==================== ======== ======== ==============

``/repo/.git`` stays read-only at every level, and the sandbox root (other sessions, change
sets, the audit log) is never visible through ``/repo``.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.models import TRUST_ORDER, Trust
from orchestrator.errors import PolicyError

#: Mode of a standard zone: ``wo`` is a fresh, empty, writable folder per run.
StandardMode = str


@dataclass(frozen=True)
class Profile:
    standard: dict[str, StandardMode]
    project_zones_rw: bool


PROFILES: dict[Trust, Profile] = {
    "untrusted": Profile({"session": "rw", "workers": "ro", "staged": "wo"}, False),
    "session": Profile({"session": "rw", "workspace": "rw", "workers": "ro", "staged": "rw"}, True),
    "workspace": Profile(
        {"session": "rw", "workspace": "rw", "workers": "ro", "staged": "rw", "repo": "ro"}, True
    ),
    "full": Profile(
        {"session": "rw", "workspace": "rw", "workers": "rw", "staged": "rw", "repo": "rw"}, True
    ),
}


def rank(level: Trust) -> int:
    return TRUST_ORDER.index(level)


def effective_trust(declared: Trust, requested: Trust | None, *, promote: bool) -> Trust:
    """The level a run gets: ``--trust`` may lower the declared one; raising needs --promote."""
    if requested is None:
        return declared
    if rank(requested) > rank(declared) and not promote:
        raise PolicyError(
            [
                f"--trust {requested} is above the worker's declared trust '{declared}'; "
                "pass --promote as well to raise it deliberately"
            ]
        )
    return requested
