"""The plan: a declaration and its grant compiled into an engine-neutral container spec.

Pure data built without touching any engine. A :class:`ContainerSpec` states intent: what
runs (image, command, user), what it sees (mounts, tmpfs folders), what it may use
(limits as plain numbers, a network mode, an isolation), and how it is hardened (intent
fields, not engine options). Each engine adapter renders it in its own terms: the Docker
adapter (:mod:`orchestrator.docker.hostconfig`) as a HostConfig with its network names and
option strings, :mod:`orchestrator.render.k8s` as Kubernetes objects.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from orchestrator import labels
from orchestrator.config import Project, Worker
from orchestrator.config.models import ENV_NAME, Isolation
from orchestrator.credproxy import (
    CA_VARIABLES,
    WORKER_BUNDLE,
    Binding,
    make_placeholder,
    worker_env,
)
from orchestrator.egress import PROXY_VARIABLES, network_env
from orchestrator.errors import ConfigError
from orchestrator.policy import Grant

INSTRUCTIONS_ENV = "ORCHESTRATOR_INSTRUCTIONS"
BROKER_DIR = "/run/orchestrator"
BROKER_SOCKET = f"{BROKER_DIR}/broker.sock"
SECRETS_DIR = "/run/secrets"
#: Where a run's inputs (``run --input``) are, read-only: ``/inputs/<name>``.
INPUTS_DIR = "/inputs"
#: The size of a mask (an empty, read-only tmpfs that hides a path), in bytes.
MASK_SIZE = 4096
MAX_INSTRUCTIONS = 64 << 10
#: The seccomp profile every container gets, by name; the engine adapter supplies its text
#: (upstream's current default, with io_uring blocked: see docs/security.md).
SECCOMP_PROFILE = "orchestrator-default"
#: The same for a run as the image's user (``image_user``): no set-id bit can be set on a
#: file (its writes reach zones on the host, where root's setuid file would be honoured).
IMAGE_USER_SECCOMP = "orchestrator-image-user"
#: The capabilities a run as the image's user keeps (``image_user``, only under gVisor):
#: Docker's defaults less NET_RAW (raw sockets), MKNOD (device files in a zone), FSETID
#: and SETFCAP (set-id bits and file capabilities kept on files it changes), KILL (the
#: keep-alive process of another uid stays out of its reach), SETPCAP and AUDIT_WRITE.
IMAGE_USER_CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
)
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

#: ``none``: loopback only; ``allowlist``: no route out but the egress proxy, which lets
#: through requests to ``Network.allow``; ``full``: outbound access.
NetworkMode = Literal["none", "allowlist", "full"]


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host folder."""

    source: str
    target: str
    read_only: bool


@dataclass(frozen=True)
class Tmpfs:
    """A memory-backed folder of the container's own, size-capped; never setuid or devices
    (nosuid, nodev). Its pages count against the memory limit."""

    target: str
    size: int
    """Its cap, in bytes."""
    mode: int = 0o1777
    """The permissions of its root folder."""
    uid: int | None = None
    """The owner of its root folder (None: root)."""
    gid: int | None = None
    noexec: bool = False
    """Nothing in it can be executed."""
    mask: bool = False
    """An empty, read-only folder that hides what is at ``target`` (e.g. the sandbox root
    under /repo); see :meth:`masking`."""

    @classmethod
    def masking(cls, target: str) -> Tmpfs:
        """An empty, read-only, noexec folder of :data:`MASK_SIZE` at ``target``."""
        return cls(target, size=MASK_SIZE, mode=0o555, noexec=True, mask=True)


@dataclass(frozen=True)
class Limits:
    """What the container may use, as plain numbers."""

    memory: int
    """Bytes of memory; never swap beyond it."""
    cpus: float
    """CPUs (1.5: one and a half cores' time)."""
    pids: int
    """Processes and threads at once."""
    timeout_s: float
    """Seconds the worker may run before it is killed."""


@dataclass(frozen=True)
class Network:
    """The network a run gets, as intent; engines name and build it their own way."""

    mode: NetworkMode = "none"
    allow: list[str] = field(default_factory=list)
    """With ``allowlist``: its normalised entries, which the egress proxy lets through
    (empty: nothing)."""
    services: list[str] = field(default_factory=list)
    """With ``allowlist``: the project's local service networks the proxy also joins."""
    project: str = ""
    """With ``full``: the project's key (see :func:`project_key`); runs of one project
    share one ``full`` network, never another project's or the engine's default."""
    credentials: list[Binding] = field(default_factory=list)
    """With ``allowlist``: egress credentials, written into requests by the run's
    credential proxy (the worker holds only each one's placeholder)."""
    trust_ca: list[str] = field(default_factory=list)
    """With credentials: host files of extra CAs the credential proxy trusts upstream."""


@dataclass(frozen=True)
class Ulimit:
    """A resource limit (``setrlimit``) for every process in the container."""

    name: str
    soft: int
    hard: int


#: No core dumps (they could hold secrets, and fill a zone); a cap on open files (CIS 5.19).
WORKER_ULIMITS = (Ulimit("core", 0, 0), Ulimit("nofile", 1024, 4096))


@dataclass(frozen=True)
class ContainerSpec:
    """Everything an engine needs to create one hardened, disposable container: intent,
    in no engine's terms. The defaults are the hardened ones."""

    image: str
    command: list[str] | None
    """The worker's command; None: the image's own."""
    uid: int
    gid: int
    limits: Limits
    workdir: str = "/tmp"
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    tmpfs: list[Tmpfs] = field(default_factory=list)
    network: Network = field(default_factory=Network)
    labels: dict[str, str] = field(default_factory=dict)
    read_only_rootfs: bool = True
    no_new_privileges: bool = True
    """No process can gain privileges (setuid, file capabilities) by executing a file."""
    seccomp: str | None = SECCOMP_PROFILE
    """The system call filter, by profile name (None: the engine's own default)."""
    capabilities: list[str] = field(default_factory=list)
    """The Linux capabilities the container keeps; every other one is dropped."""
    init: bool = True
    """An init process as PID 1 reaps the worker's orphans and forwards signals."""
    ulimits: list[Ulimit] = field(default_factory=list)
    isolation: Isolation = "runc"
    """The runtime: ``runc`` or ``gvisor`` (gVisor's runsc: the worker's system calls are
    served by a kernel in user space, not the host's). The engine adapter maps it to its
    own runtime names."""
    run_id: str = ""
    worker: str = ""
    trust: str = "untrusted"
    session_id: str = ""
    outbox: str | None = None
    """Container path of the run's outbox (a size-capped tmpfs), collected after the run."""
    supervisor_user: str | None = None
    """With an outbox, the container's own process runs as this user (``uid:gid``), only
    keeping the mounts alive; the worker runs by exec as ``user``, so that its outbox can
    be read after all of its processes are gone."""
    args: list[str] = field(default_factory=list)
    """Arguments given for this run, appended to the command (the image's own when the
    worker declares none); such a run runs its worker by exec, see ``supervisor_user``."""
    inputs: str | None = None
    """Container path of the run's inputs folder (read-only), or None: no inputs."""
    image_user: bool = False
    """The worker runs as the image's own user (``run_as``) on a writable root, with
    :data:`IMAGE_USER_CAPABILITIES`; ``uid``/``gid`` still own its tmpfs folders and
    whatever it leaves in a writable zone (only under gVisor)."""
    run_as: str = ""
    """With ``image_user``: the image's user as the engine reports it (filled in when the
    run opens; empty: not known yet, the image's own)."""
    root_capture: bool = False
    """A session opened for snapshots (:mod:`orchestrator.runtime.snapshots`): under gVisor
    the root filesystem's writes go to the container's layer (runsc ``--overlay2=none``)
    instead of the sandbox's memory, so a commit sees them."""

    @property
    def calls_children(self) -> bool:
        """Whether the worker gets a broker socket (``orchestrator-call``)."""
        return any(mount.target == BROKER_DIR for mount in self.mounts)

    @property
    def user(self) -> str:
        """The user commands are exec'd as: the worker's ``uid:gid``, or with
        ``image_user`` the image's user (``run_as``)."""
        if self.image_user:
            return self.run_as
        return f"{self.uid}:{self.gid}"

    def tmpfs_at(self, target: str) -> Tmpfs | None:
        """The tmpfs mounted at ``target``, if any."""
        return next((t for t in self.tmpfs if t.target == target), None)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON-ready data (the ``plan --json`` output)."""
        return asdict(self)


def project_key(root: Path) -> str:
    """A short, stable key naming the project at ``root`` (for its ``full`` network)."""
    return hashlib.sha256(str(root).encode()).hexdigest()[:12]


def compile_plan(
    project: Project,
    worker: Worker,
    grant: Grant,
    *,
    run_id: str,
    session_id: str,
    uid: int,
    gid: int,
    inputs: bool = False,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> ContainerSpec:
    """Compile one worker run into a container spec.

    ``inputs``: mount the run's inputs folder at :data:`INPUTS_DIR`; ``env``: values for
    this run over the worker file's; ``args``: appended to its command.
    """
    if uid == 0:
        raise ValueError("a worker never runs as uid 0")
    config = worker.config
    if config.image_user and grant.isolation != "gvisor":
        raise ConfigError(
            [
                f"{worker.where('image_user')}: a run as the image's user (root, writable root "
                f"filesystem) needs gVisor, and this run's isolation is {grant.isolation}: set "
                "'isolation: gvisor' in the worker file or remove image_user"
            ]
        )
    env = _environment(worker, run_id, env or {})
    if config.image_user:  # the image's user has a home of its own
        del env["HOME"]
    if isinstance(grant.network, tuple):
        env.update(network_env())
    bindings = _bindings(project, worker, grant)
    env.update(worker_env(bindings) if bindings else {})
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
    if bindings and grant.paths is not None:  # the image's CAs and the run's, read-only
        mounts.append(Mount(str(ca_bundle_path(grant.paths.run_dir)), WORKER_BUNDLE, True))
    inputs = inputs or worker.config.inputs is not None
    if inputs and grant.paths is not None:
        mounts.append(Mount(str(grant.paths.inputs_dir), INPUTS_DIR, read_only=True))
    limits = grant.limits
    tmpfs = [Tmpfs("/tmp", size=limits.tmp)]
    tmpfs += [Tmpfs.masking(mask) for mask in grant.masks]
    if outbox is not None:
        # Its pages count against the memory limit: it can never hold more than that.
        size = min(project.config.sandbox.outbox.size, limits.memory)
        tmpfs.append(Tmpfs(outbox.target, size=size, mode=0o700, uid=uid, gid=gid, noexec=True))
    return ContainerSpec(
        image=config.image or project.config.defaults.image,
        command=list(config.command) if config.command else None,
        uid=uid,
        gid=gid,
        workdir=config.workdir or "/tmp",
        env=env,
        mounts=mounts,
        tmpfs=tmpfs,
        network=_network(project, grant, bindings),
        limits=Limits(
            memory=limits.memory, cpus=limits.cpus, pids=limits.pids, timeout_s=limits.timeout
        ),
        ulimits=list(WORKER_ULIMITS),
        labels={
            labels.RUN_ID: run_id,
            labels.WORKER: config.name,
            labels.TRUST: grant.trust,
            labels.SESSION: session_id,
        },
        run_id=run_id,
        worker=config.name,
        trust=grant.trust,
        session_id=session_id,
        outbox=outbox.target if outbox else None,
        # With arguments too: the image's own command is only known to the engine, so the
        # worker runs by exec (argv: the image's command, then the arguments).
        supervisor_user=(
            supervisor_for(uid, image_user=config.image_user) if outbox or args else None
        ),
        args=list(args),
        inputs=INPUTS_DIR if inputs and grant.paths is not None else None,
        isolation=grant.isolation,
        image_user=config.image_user,
        read_only_rootfs=not config.image_user,
        capabilities=list(IMAGE_USER_CAPABILITIES) if config.image_user else [],
        seccomp=IMAGE_USER_SECCOMP if config.image_user else SECCOMP_PROFILE,
    )


def ca_bundle_path(run_dir: Path) -> Path:
    """The host file a worker with egress credentials gets as its system CA bundle."""
    return run_dir / "credproxy-ca.pem"


def _bindings(project: Project, worker: Worker, grant: Grant) -> list[Binding]:
    """The run's egress credentials, each with a fresh placeholder."""
    found = []
    for name in grant.egress:
        config = project.config.credentials[name]
        binding = config.egress
        assert binding is not None  # granted as egress
        found.append(
            Binding(
                name=name,
                hosts=list(binding.hosts),
                header=binding.header,
                format=binding.format,
                placeholder_env=config.placeholder_env,
                placeholder=make_placeholder(name),
            )
        )
    taken = [key for key in worker.config.env if key in CA_VARIABLES]
    if found and taken:
        raise ConfigError(
            [
                f"{worker.where('env', key)}: set by the orchestrator for egress credentials "
                "(the run's CA bundle); remove it"
                for key in taken
            ]
        )
    return found


def _network(project: Project, grant: Grant, bindings: list[Binding]) -> Network:
    if isinstance(grant.network, tuple):
        services = sorted({service.network for service in project.config.network.services})
        trust = [
            str(Path(os.path.normpath(project.root / Path(path).expanduser())))
            for path in project.config.network.trust_ca
        ]
        return Network(
            "allowlist",
            allow=[str(e) for e in grant.network],
            services=services,
            credentials=bindings,
            trust_ca=trust if bindings else [],
        )
    if grant.network == "full":
        return Network("full", project=project_key(project.root))
    return Network("none")


def supervisor_for(uid: int, *, image_user: bool = False) -> str:
    """A uid for the keep-alive process: unprivileged and never the worker's own, so that
    killing all of the worker's processes (``kill -9 -1`` as the worker) spares it. With
    ``image_user``, root: an exec gets only the capabilities of the container's own user
    (see :data:`~orchestrator.runtime.supervised.KILL_ALL_BUT_KEEPALIVE`)."""
    if image_user:
        return "0:0"
    other = 65533 if uid != 65533 else 65532
    return f"{other}:{other}"


def _environment(worker: Worker, run_id: str, extra: Mapping[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    problems = []
    for key, value in worker.config.env.items():
        if key in RESERVED_ENV:
            problems.append(
                f"{worker.file}: env.{key}: set by the orchestrator itself; use another name"
            )
        env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    for key, text in extra.items():
        if not ENV_NAME.match(key):
            problems.append(f"--env {key}: not a valid environment variable name")
        elif key in RESERVED_ENV:
            problems.append(f"--env {key}: set by the orchestrator itself; use another name")
        elif "\0" in text:
            problems.append(f"--env {key}: a NUL character cannot be in a value")
        env[key] = text
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
