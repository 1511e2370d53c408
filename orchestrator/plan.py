"""The plan: a declaration and its grant compiled into an exact, printable container spec.

Pure data built without touching Docker. The engine adapter turns a :class:`ContainerSpec`
into an engine request field by field and adds nothing but the owner labels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator import labels
from orchestrator.config import Project, Worker
from orchestrator.errors import ConfigError
from orchestrator.policy import Grant
from orchestrator.policy.network import (
    PROXY_VARIABLES,
    full_network,
    internal_network,
    network_env,
)

INSTRUCTIONS_ENV = "ORCHESTRATOR_INSTRUCTIONS"
BROKER_DIR = "/run/orchestrator"
BROKER_SOCKET = f"{BROKER_DIR}/broker.sock"
SECRETS_DIR = "/run/secrets"
#: An empty, read-only tmpfs hides a path (e.g. the sandbox root under /repo).
MASK_OPTIONS = "ro,nosuid,nodev,noexec,size=4k,mode=0555"
MAX_INSTRUCTIONS = 64 << 10
#: Environment names a worker file may not set: the orchestrator owns them.
RESERVED_ENV = frozenset(
    {
        INSTRUCTIONS_ENV,
        "HOME",
        "ORCHESTRATOR_RUN_ID",
        "ORCHESTRATOR_WORKER",
        "ORCHESTRATOR_TRUST",
        "ORCHESTRATOR_SESSION",
        "ORCHESTRATOR_BROKER",
        "ORCHESTRATOR_PARENT_RUN",
        "ORCHESTRATOR_ATTACHMENTS",
        *PROXY_VARIABLES,
    }
)


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host folder."""

    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class ContainerSpec:
    """Everything the engine needs to create one hardened, disposable container."""

    image: str
    command: list[str] | None
    user: str
    working_dir: str
    env: dict[str, str]
    mounts: list[Mount]
    network_mode: str
    read_only_rootfs: bool
    cap_drop: list[str]
    cap_add: list[str]
    security_opt: list[str]
    pids_limit: int
    mem_limit: int
    memswap_limit: int
    nano_cpus: int
    tmpfs: dict[str, str]
    labels: dict[str, str]
    init: bool = True
    privileged: bool = False
    timeout_s: float = 600.0
    run_id: str = ""
    worker: str = ""
    trust: str = "untrusted"
    session_id: str = ""
    egress: list[str] | None = None
    """With an allowlist: its normalised entries; ``network_mode`` is then the internal
    network the egress proxy serves."""
    outbox: str | None = None
    """Container path of the run's outbox (a size-capped tmpfs), collected after the run."""
    supervisor_user: str | None = None
    """With an outbox, the container's own process runs as this user, only keeping the
    mounts alive; the worker runs by exec as ``user``, so that its outbox can be read after
    all of its processes are gone."""
    devices: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON-ready data (the ``plan --json`` output)."""
        return asdict(self)


def compile_plan(
    project: Project,
    worker: Worker,
    grant: Grant,
    *,
    run_id: str,
    session_id: str,
    uid: int,
    gid: int,
) -> ContainerSpec:
    """Compile one worker run into a container spec."""
    if uid == 0:
        raise ValueError("a worker never runs as uid 0")
    config = worker.config
    env = _environment(worker, run_id)
    if isinstance(grant.network, tuple):
        env.update(network_env())
    env["ORCHESTRATOR_TRUST"] = grant.trust
    env["ORCHESTRATOR_SESSION"] = session_id
    outbox = next((zone for zone in grant.zones if zone.outbox), None)
    mounts = [
        Mount(source=str(zone.host_path), target=zone.target, read_only=zone.read_only)
        for zone in grant.zones
        if not zone.outbox
    ]
    if grant.secrets and grant.paths is not None:
        secrets = str(grant.paths.secrets_dir)
        mounts.append(Mount(source=secrets, target=SECRETS_DIR, read_only=True))
    if grant.children and grant.paths is not None:
        mounts.append(Mount(source=str(grant.paths.broker_dir), target=BROKER_DIR, read_only=True))
        env["ORCHESTRATOR_BROKER"] = BROKER_SOCKET
    limits = grant.limits
    tmpfs = {"/tmp": f"rw,nosuid,nodev,size={limits.tmp},mode=1777"}
    tmpfs.update((mask, MASK_OPTIONS) for mask in grant.masks)
    if outbox is not None:
        size = project.config.sandbox.outbox.size
        tmpfs[outbox.target] = f"rw,nosuid,nodev,noexec,size={size},mode=0700,uid={uid},gid={gid}"
    return ContainerSpec(
        image=config.image or project.config.defaults.image,
        command=list(config.command) if config.command else None,
        user=f"{uid}:{gid}",
        working_dir=config.workdir or "/tmp",
        env=env,
        mounts=mounts,
        network_mode=_network_mode(project, grant),
        read_only_rootfs=True,
        cap_drop=["ALL"],
        cap_add=[],
        security_opt=["no-new-privileges:true"],
        pids_limit=limits.pids,
        mem_limit=limits.memory,
        memswap_limit=limits.memory,
        nano_cpus=int(limits.cpus * 1e9),
        tmpfs=tmpfs,
        labels={labels.RUN_ID: run_id, labels.WORKER: config.name, labels.TRUST: grant.trust},
        timeout_s=limits.timeout,
        run_id=run_id,
        worker=config.name,
        trust=grant.trust,
        session_id=session_id,
        egress=[str(e) for e in grant.network] if isinstance(grant.network, tuple) else None,
        outbox=outbox.target if outbox else None,
        supervisor_user=_supervisor(uid) if outbox else None,
    )


def _network_mode(project: Project, grant: Grant) -> str:
    if isinstance(grant.network, tuple):
        return internal_network(grant.network)
    if grant.network == "full":
        return full_network(project.root)
    return "none"


def _supervisor(uid: int) -> str:
    """A uid for the keep-alive process: unprivileged and never the worker's own, so that
    killing all of the worker's processes (``kill -9 -1`` as the worker) spares it."""
    other = 65533 if uid != 65533 else 65532
    return f"{other}:{other}"


def _environment(worker: Worker, run_id: str) -> dict[str, str]:
    env: dict[str, str] = {}
    problems = []
    for key, value in worker.config.env.items():
        if key in RESERVED_ENV:
            problems.append(
                f"{worker.file}: env.{key}: set by the orchestrator itself; use another name"
            )
        env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if len(worker.instructions.encode()) > MAX_INSTRUCTIONS:
        problems.append(
            f"{worker.file}: instructions exceed 64 KiB; move long material into a zone"
        )
    if problems:
        raise ConfigError(problems)
    env["HOME"] = "/tmp"
    env["ORCHESTRATOR_RUN_ID"] = run_id
    env["ORCHESTRATOR_WORKER"] = worker.config.name
    if worker.instructions:
        env[INSTRUCTIONS_ENV] = worker.instructions
    return env
