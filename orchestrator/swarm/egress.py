"""Allowlisted egress on a swarm: the same squid proxy image, as a service of the run.

A run with ``network: {allow: [...]}`` gets, besides its internal overlay network (the
worker task's only network), an outside overlay network of its own (not internal: its
way out is the node's ``docker_gwbridge``) and one proxy service (``images/proxy``, one
replica) on both, with the alias ``proxy`` on the internal one, and on the project's
local service networks (``network.services``, which must be swarm-scoped overlays). The
proxy is configured exactly as under Docker (``EGRESS_ALLOW``, ``EGRESS_EXCLUDE``,
``EGRESS_REACH``), is as hardened as a service can be, and its health check gates the
task's ``running`` state, so the worker starts only once squid answers. Its decision
lines are read back from its log after the run. Everything is the run's own (owner
labels) and is removed with it, or by ``orchestrator gc``.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config.allowlist import allow_text, validate_allowlist
from orchestrator.docker.egress import (
    PROXY_HEALTH_RETRIES,
    PROXY_HEALTH_TEST,
    PROXY_HEALTH_TIMEOUT,
    PROXY_IMAGE,
    PROXY_MEMORY,
    PROXY_NANO_CPUS,
    PROXY_NOFILE,
    PROXY_PIDS,
)
from orchestrator.policy.network import PROXY_ALIAS, PROXY_PORT

__all__ = ["proxy_task_template"]

_SECOND = 1_000_000_000

#: The proxy's /tmp, as under Docker (``docker.egress.PROXY_TMPFS``: 16 MiB, noexec).
PROXY_TMP_SIZE = 16 << 20


def proxy_task_template(
    egress: list[str],
    *,
    internal: str,
    outside: str,
    services: list[str],
    private: list[str],
) -> dict[str, Any]:
    """The proxy's task: ``egress`` the plan's normalised entries, ``internal`` the run's
    network id, ``outside`` its way out, ``services`` local service networks, ``private``
    the subnets of outside and services (never clients; the only private destinations)."""
    return {
        "ContainerSpec": {
            "Image": PROXY_IMAGE,
            "Env": [
                f"EGRESS_ALLOW={allow_text(validate_allowlist(egress))}",
                f"EGRESS_PORT={PROXY_PORT}",
                f"EGRESS_EXCLUDE={' '.join(private)}",
                f"EGRESS_REACH={' '.join(private)}",
            ],
            "ReadOnly": True,
            "CapabilityDrop": ["ALL"],
            "Init": True,
            "Mounts": [
                {
                    "Type": "tmpfs",
                    "Target": "/tmp",
                    "TmpfsOptions": {"SizeBytes": PROXY_TMP_SIZE, "Mode": 0o1777},
                }
            ],
            "Ulimits": [
                {"Name": "nofile", "Soft": PROXY_NOFILE, "Hard": PROXY_NOFILE},
                {"Name": "core", "Soft": 0, "Hard": 0},
            ],
            "Healthcheck": {
                "Test": list(PROXY_HEALTH_TEST),
                "Interval": int(1 * _SECOND),  # gates `running`: check soon after start
                "Timeout": int(PROXY_HEALTH_TIMEOUT * _SECOND),
                "Retries": PROXY_HEALTH_RETRIES,
                "StartPeriod": int(30 * _SECOND),
            },
            "StopGracePeriod": 0,
        },
        "Resources": {
            "Limits": {"NanoCPUs": PROXY_NANO_CPUS, "MemoryBytes": PROXY_MEMORY, "Pids": PROXY_PIDS}
        },
        "RestartPolicy": {"Condition": "none", "MaxAttempts": 0},
        "Networks": [
            {"Target": internal, "Aliases": [PROXY_ALIAS]},
            {"Target": outside},
            *({"Target": name} for name in services),
        ],
        "LogDriver": {"Name": "json-file", "Options": {"max-size": "10m", "max-file": "3"}},
    }
