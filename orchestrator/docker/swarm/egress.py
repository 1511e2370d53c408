"""Allowlisted egress on a swarm: the same squid proxy image, as a service of the run.

A run with ``network: {allow: [...]}`` gets, besides its internal overlay network (the
worker task's only network), an outside overlay network of its own (not internal: its
way out is the node's ``docker_gwbridge``) and one proxy service (``images/proxy``, one
replica) on both, with the alias ``proxy`` on the internal one, and on the project's
local service networks (``network.services``, which must be swarm-scoped overlays). The
proxy is the one :mod:`orchestrator.egress` describes, configured exactly as under Docker
(:func:`~orchestrator.egress.proxy_environment`), is as hardened as a service can be,
and its health check gates the task's ``running`` state, so the worker starts only once
squid answers. Its decision lines are read back from its log after the run
(:func:`~orchestrator.egress.parse_decisions`). Everything is the run's own (owner
labels) and is removed with it, or by ``orchestrator gc``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator import labels
from orchestrator.config.allowlist import validate_allowlist
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
    proxy_environment,
)

__all__ = ["proxy_task_template"]

_SECOND = 1_000_000_000

#: The health check gates the task's ``running`` state, so check soon after start and
#: give squid longer to come up than a shared Docker proxy gets.
SWARM_HEALTH = replace(PROXY_HEALTH, interval=1.0, start_period=30.0)


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
            "Labels": labels.explicit({}),  # every label gc reads: never the image's
            "Env": [
                f"{name}={value}"
                for name, value in proxy_environment(validate_allowlist(egress), private).items()
            ],
            "ReadOnly": True,
            "CapabilityDrop": ["ALL"],
            "Init": True,
            "Mounts": [
                {
                    "Type": "tmpfs",
                    "Target": PROXY_TMP,
                    "TmpfsOptions": {"SizeBytes": PROXY_TMP_SIZE, "Mode": 0o1777},
                }
            ],
            "Ulimits": [
                {"Name": "nofile", "Soft": PROXY_NOFILE, "Hard": PROXY_NOFILE},
                {"Name": "core", "Soft": 0, "Hard": 0},
            ],
            "Healthcheck": {
                "Test": list(SWARM_HEALTH.test),
                "Interval": int(SWARM_HEALTH.interval * _SECOND),
                "Timeout": int(SWARM_HEALTH.timeout * _SECOND),
                "Retries": SWARM_HEALTH.retries,
                "StartPeriod": int(SWARM_HEALTH.start_period * _SECOND),
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
        "LogDriver": {"Name": "json-file", "Options": dict(PROXY_LOG_OPTIONS)},
    }
