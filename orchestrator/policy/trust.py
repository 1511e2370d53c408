"""Trust levels: presets over the standard zones, and the cap they put on project zones.

=========== ======== ========= ==================== ======== ======== ==============
level       /session /workspace /staged              /repo    /workers project zones
=========== ======== ========= ==================== ======== ======== ==============
untrusted   rw       -          outbox               -        ro       ro, or rw where
                                                                       the zone is an
                                                                       untrusted output
session     rw       rw         outbox               -        ro       as declared
workspace   rw       rw         outbox               ro       ro       as declared
full        rw       rw         outbox               rw       ro       as declared
=========== ======== ========= ==================== ======== ======== ==============

The outbox ``/staged`` is, at every level, a fresh tmpfs of its own with a hard size cap: a
worker can add files, never see what earlier runs staged; what it leaves there becomes a
pending change set on the host. ``/repo/.git`` stays read-only at every level, and the
sandbox root (other sessions, change sets, the audit log) is never visible through ``/repo``.
The policy files (the project file, the workers folder, credential files, ``trust_ca``
files) are read-only in every container, wherever a writable zone holds them (see
``grant._policy_guards``).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.models import TRUST_ORDER, Trust
from orchestrator.errors import PolicyError

#: Mode of a standard zone. ``/staged`` is always a fresh, size-capped outbox per run.
StandardMode = str


@dataclass(frozen=True)
class Profile:
    standard: dict[str, StandardMode]
    project_zones_rw: bool


PROFILES: dict[Trust, Profile] = {
    "untrusted": Profile({"session": "rw", "workers": "ro", "staged": "rw"}, False),
    "session": Profile({"session": "rw", "workspace": "rw", "workers": "ro", "staged": "rw"}, True),
    "workspace": Profile(
        {"session": "rw", "workspace": "rw", "workers": "ro", "staged": "rw", "repo": "ro"}, True
    ),
    "full": Profile(
        {"session": "rw", "workspace": "rw", "workers": "ro", "staged": "rw", "repo": "rw"}, True
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
