"""The Docker adapter's names for the networks a plan's network mode needs.

The plan says ``none``, ``allowlist`` or ``full``; Docker needs network names. An
allowlisted run gets an internal network of its own, named after the run; ``full`` runs of
one project share the project's network, named after the project's key. ``none`` is
Docker's own network mode of that name (loopback only).
"""

from __future__ import annotations

from orchestrator.plan import ContainerSpec

#: Internal (no route out) networks, one per run, are named after the run.
RUN_PREFIX = "orchestrator-run-"
#: One network with outbound access per project (``network: full``).
FULL_PREFIX = "orchestrator-full-"


def run_network(run_id: str) -> str:
    """The name of the internal network of one allowlisted run (its own, not shared)."""
    return RUN_PREFIX + run_id


def is_run_network(name: str) -> bool:
    """Whether ``name`` is a per-run network, created for one run and removed after it."""
    return name.startswith(RUN_PREFIX)


def full_network(project: str) -> str:
    """The network with outbound access of the project whose key is ``project``."""
    return FULL_PREFIX + project


def network_name(spec: ContainerSpec) -> str:
    """The Docker network ``spec``'s container joins (its ``network_mode``)."""
    mode = spec.network.mode
    if mode == "allowlist":
        return run_network(spec.run_id)
    if mode == "full":
        return full_network(spec.network.project)
    return "none"
