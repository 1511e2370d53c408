"""A plan as a Docker Swarm service: a :class:`ContainerSpec` rendered for Engine API 1.41.

:func:`service_spec` turns a plan into the task template of a ``replicated-job`` service
(one replica, never restarted) for the Engine API 1.41 (Docker 20.10), as plain data: no
request is made here. :func:`not_enforced` lists what the plan asks for that a service on
that API cannot carry, and :func:`refusal` says why a plan cannot run there at all.

What changes on the way, and why:

* the outbox (a size-capped tmpfs read by exec under Docker) becomes a bind mount of the
  run's results folder on the host (a task cannot be exec'd into from the orchestrator on
  another node; the folder is read after the task is gone);
* the secrets folder (``/run/secrets``, a bind mount of an in-memory host folder) becomes
  one swarm secret per name, mounted read-only at ``/run/secrets/NAME``;
* the network is the run's own network (an internal overlay the task alone joins) instead
  of the Docker network the plan would get.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator import labels
from orchestrator.plan import SECRETS_DIR, ContainerSpec

__all__ = [
    "NOT_ENFORCED",
    "SecretRef",
    "ServiceSpec",
    "not_enforced",
    "refusal",
    "service_spec",
]

#: What a service spec on Engine API 1.41 has no field for, although the plan asks for it.
NOT_ENFORCED = {
    "no-new-privileges": "no-new-privileges: service specs on Engine API 1.41 have no field "
    "for it (Privileges holds only CredentialSpec and SELinuxContext), so a setuid or setgid "
    "program the task can reach would run with its owner's rights; instead, a run whose "
    "zones or inputs hold a setuid or setgid file is refused before anything exists, and "
    "the set-id bits a task leaves in writable zones are stripped after it (audited as "
    "zone.setid_stripped)",
    "nosuid": "nosuid,nodev on zone, input and results binds: a swarm bind mount takes no "
    "mount options (Docker runs as root mount pinned nosuid,nodev folders); the refusal "
    "and the after-run strip above replace it",
    "seccomp": "the project's seccomp profile (io_uring blocked): not settable per service on "
    "1.41; the engine's default profile applies (on 20.10 it still allows io_uring_setup)",
    "swap": "memory+swap cap: a service sets only the memory limit; the engine lets the task "
    "swap as much again (run nodes without swap)",
    "tmp-exec": "/tmp is mounted noexec (swarm tmpfs mounts always are): stricter than under "
    "Docker, where /tmp allows executing files",
    "outbox-cap": "outbox size cap: the outbox is a host folder, not a tmpfs; what exceeds the "
    "caps is refused when collected, but the worker can fill the node's disk meanwhile",
}


@dataclass(frozen=True)
class SecretRef:
    """A swarm secret made for this run, and the file name it has under /run/secrets."""

    secret_id: str
    secret_name: str
    file_name: str


@dataclass(frozen=True)
class ServiceSpec:
    """What the adapter sends: the task template and the service's plan labels."""

    task_template: dict[str, Any]
    labels: dict[str, str]
    name: str
    timeout_s: float
    not_enforced: list[str] = field(default_factory=list)


def service_name(spec: ContainerSpec) -> str:
    return f"orchestrator-{spec.run_id}"


def refusal(spec: ContainerSpec) -> str | None:
    """One line saying why this plan cannot run as a swarm service, or None."""
    if spec.isolation == "gvisor":
        return (
            f"worker '{spec.worker}' (trust {spec.trust}) runs under gVisor, and a swarm "
            "service on Engine API 1.41 cannot choose its runtime: run it with --engine "
            f"docker, or accept runc for trust {spec.trust} with `isolation: "
            f"{{{spec.trust}: runc}}` in the project file (docs/scale-out.md)"
        )
    if spec.network.mode == "full":
        return (
            f"worker '{spec.worker}' declares network: full, which --engine swarm does not "
            "offer (its runs could reach each other on a shared overlay): run it with "
            "--engine docker, or declare network: none or an allowlist (docs/scale-out.md)"
        )
    if spec.network.credentials:
        names = ", ".join(binding.name for binding in spec.network.credentials)
        return (
            f"worker '{spec.worker}' holds egress credentials ({names}), whose per-run "
            "credential proxy --engine swarm does not run: run it with --engine docker "
            "(docs/secrets.md)"
        )
    return None


def not_enforced(spec: ContainerSpec) -> list[str]:
    """What this plan asks for that its swarm service does not enforce, one line each."""
    found = []
    if spec.no_new_privileges:
        found.append(NOT_ENFORCED["no-new-privileges"])
    if spec.mounts or spec.outbox is not None:
        found.append(NOT_ENFORCED["nosuid"])
    if spec.seccomp is not None:
        found.append(NOT_ENFORCED["seccomp"])
    found.append(NOT_ENFORCED["swap"])  # the plan never allows swap beyond its memory
    tmp = spec.tmpfs_at("/tmp")
    if tmp is not None and not tmp.noexec:
        found.append(NOT_ENFORCED["tmp-exec"])
    if spec.outbox is not None:
        found.append(NOT_ENFORCED["outbox-cap"])
    return found


def service_spec(
    spec: ContainerSpec,
    *,
    argv: list[str] | None,
    network: str,
    results: str | None = None,
    secrets: list[SecretRef] | None = None,
) -> ServiceSpec:
    """The service for ``spec``: ``argv`` the whole command (None: the image's own),
    ``network`` the run's network, ``results`` the host folder mounted at the outbox's
    place, ``secrets`` the swarm secrets made for the run."""
    mounts: list[dict[str, Any]] = [
        {"Type": "bind", "Source": m.source, "Target": m.target, "ReadOnly": m.read_only}
        for m in spec.mounts
        if m.target != SECRETS_DIR
    ]
    for tmpfs in spec.tmpfs:
        if tmpfs.target == spec.outbox:
            continue
        options = {"SizeBytes": tmpfs.size, "Mode": tmpfs.mode}
        mounts.append(
            {
                "Type": "tmpfs",
                "Target": tmpfs.target,
                "ReadOnly": tmpfs.mask,
                "TmpfsOptions": options,
            }
        )
    if spec.outbox is not None and results is not None:
        mounts.append({"Type": "bind", "Source": results, "Target": spec.outbox})
    container: dict[str, Any] = {
        "Image": spec.image,
        "User": spec.user,
        "Dir": spec.workdir,
        "Env": [f"{key}={value}" for key, value in spec.env.items()],
        # Every label gc reads, explicitly: never the image's (managed=false: the service
        # is what the orchestrator owns and removes).
        "Labels": labels.explicit(dict(spec.labels)),
        "ReadOnly": spec.read_only_rootfs,
        "Mounts": mounts,
        "CapabilityDrop": ["ALL"],
        "Init": spec.init,
        "Ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in spec.ulimits],
        "StopGracePeriod": 0,
    }
    if spec.capabilities:
        container["CapabilityAdd"] = list(spec.capabilities)
    if argv is not None:  # the whole argv: it replaces the image's entrypoint and command
        container["Command"] = list(argv)
    if secrets:
        container["Secrets"] = [
            {
                "SecretID": ref.secret_id,
                "SecretName": ref.secret_name,
                "File": {
                    "Name": ref.file_name,
                    "UID": str(spec.uid),
                    "GID": str(spec.gid),
                    "Mode": 0o400,
                },
            }
            for ref in secrets
        ]
    template = {
        "ContainerSpec": container,
        "Resources": {
            "Limits": {
                "NanoCPUs": int(spec.limits.cpus * 1e9),
                "MemoryBytes": spec.limits.memory,
                "Pids": spec.limits.pids,
            }
        },
        "RestartPolicy": {"Condition": "none", "MaxAttempts": 0},
        "Networks": [{"Target": network}],
    }
    return ServiceSpec(
        task_template=template,
        labels=dict(spec.labels),
        name=service_name(spec),
        timeout_s=spec.limits.timeout_s,
        not_enforced=not_enforced(spec),
    )
