"""A plan rendered for Docker: the container options and HostConfig of a ContainerSpec.

The plan states intent (limits as numbers, tmpfs folders as values, hardening as flags, a
network mode); Docker's API wants its own shapes: ``nano_cpus``, ``memswap_limit`` equal
to the memory limit (no swap), tmpfs option strings, ``security_opt`` strings with the
seccomp profile's JSON text, network names (:mod:`.netnames`) and runtime names
(:mod:`.runtimes`). Pure: :class:`~orchestrator.docker.engine.DockerEngine` passes the
result to the SDK, after Podman's adjustments (:mod:`.podman`) where the engine is Podman.
"""

from __future__ import annotations

from typing import Any

from docker.types import Mount, Ulimit

from orchestrator.docker import runtimes, seccomp
from orchestrator.docker.netnames import network_name
from orchestrator.plan import ContainerSpec, Tmpfs

NO_NEW_PRIVILEGES = "no-new-privileges:true"
#: The resolver of a worker that has no way out but loopback or its proxy (``none``, an
#: allowlist): "this host" inside its own network namespace, where nothing answers. On a
#: run's internal network, the engine's embedded DNS (127.0.0.11) still answers the names
#: of the network's containers (``proxy``), and forwards every other name here, so no
#: query leaves the worker's namespace: without it, Engine 20.10 forwards them to the
#: host's resolvers out through the bridge, and from the host's own namespace when those
#: are loopback addresses (CVE-2024-29018). Not a loopback address, which the engine
#: would dial from the host's namespace. See docs/network.md.
NO_RESOLVER = ["0.0.0.0"]  # noqa: S104 (an address to query, not one to listen on)


def tmpfs_options(tmpfs: Tmpfs) -> str:
    """Docker's option string for one tmpfs folder (``rw,nosuid,nodev,exec,size=..,mode=..``)."""
    parts = ["ro" if tmpfs.mask else "rw", "nosuid", "nodev"]
    # Docker (and Podman) mount a tmpfs noexec unless told "exec": say which, always.
    parts.append("noexec" if tmpfs.noexec or tmpfs.mask else "exec")
    parts += [f"size={tmpfs.size}", f"mode={tmpfs.mode:04o}"]
    if tmpfs.uid is not None:
        parts.append(f"uid={tmpfs.uid}")
    if tmpfs.gid is not None:
        parts.append(f"gid={tmpfs.gid}")
    return ",".join(parts)


def tmpfs_mounts(spec: ContainerSpec) -> dict[str, str]:
    """The plan's tmpfs folders as Docker's ``tmpfs`` (target -> options)."""
    return {t.target: tmpfs_options(t) for t in spec.tmpfs}


def security_options(spec: ContainerSpec) -> list[str]:
    """The plan's hardening flags as ``security_opt``, the profile still by name."""
    options = [NO_NEW_PRIVILEGES] if spec.no_new_privileges else []
    if spec.seccomp is not None:
        options.append(f"seccomp={spec.seccomp}")
    return options


def container_config(spec: ContainerSpec) -> dict[str, Any]:
    """``create_container``'s keywords for ``spec`` (without name, labels and HostConfig).

    With a supervisor (an outbox, or arguments given for the run), the container's own
    process only keeps its mounts alive as a user of its own, and the worker runs by exec
    (see :mod:`orchestrator.runtime.supervised`)."""
    supervised = spec.supervisor_user is not None
    return {
        "image": spec.image,
        "entrypoint": ["sleep"] if supervised else None,
        "command": ["infinity"] if supervised else spec.command,
        "user": spec.supervisor_user or spec.user,
        "environment": spec.env,
        "working_dir": spec.workdir,
        "network_disabled": spec.network.mode == "none",
    }


def host_config(spec: ContainerSpec, runtime: str) -> dict[str, Any]:
    """``create_host_config``'s keywords for ``spec`` on the engine runtime ``runtime``.

    The seccomp profile is its JSON text (under gVisor, its variant for runsc, and the
    worker's process limit also kept inside the sandbox as ``nproc``: see :mod:`.runtimes`).
    """
    gvisor = runtimes.is_gvisor(runtime)
    limits = spec.limits
    ulimits = [Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in spec.ulimits]
    if gvisor:
        ulimits.append(Ulimit(name="nproc", soft=limits.pids, hard=limits.pids))
    return {
        # A list, not binds keyed by source: one folder may appear at two places (the
        # workers folder at /workers and, read-only, inside a writable /repo).
        "mounts": [
            Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in spec.mounts
        ],
        "network_mode": network_name(spec),
        "dns": NO_RESOLVER if spec.network.mode in ("none", "allowlist") else None,
        "read_only": spec.read_only_rootfs,
        "cap_drop": ["ALL"],
        "cap_add": list(spec.capabilities) or None,
        "security_opt": seccomp.security_opt(security_options(spec), gvisor=gvisor),
        "ulimits": ulimits,
        "pids_limit": runtimes.host_pids_limit(runtime, limits.pids),
        "mem_limit": limits.memory,
        "memswap_limit": limits.memory,  # the same: no swap beyond the memory limit
        "nano_cpus": round(limits.cpus * 1e9),
        "tmpfs": tmpfs_mounts(spec),
        "init": spec.init,
        "privileged": False,
        "ipc_mode": "private",
        "runtime": runtime,
    }
