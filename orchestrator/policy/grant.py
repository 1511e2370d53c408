"""Grants: what one run actually gets, computed from the project, a worker file and its trust.

A grant is checked before anything exists: a zone the project lacks, a mode wider than the
zone or the trust level allows, or an approval that is not supported yet, is refused with
every problem listed at once. No ``sandbox`` section means no zones at all, standard zones
included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.config import Project, Resources, Worker
from orchestrator.config.loader import WORKER_SUFFIX
from orchestrator.config.models import ISOLATION_ORDER, Isolation, Trust, ZoneRequest, human_size
from orchestrator.errors import PolicyError
from orchestrator.labels import current_owner
from orchestrator.policy.network import NetworkGrant, describe, network_grant
from orchestrator.policy.network import rank as network_rank
from orchestrator.policy.trust import PROFILES
from orchestrator.vocabulary import PRE_APPROVED, did_you_mean

SECRETS_PREFIX = "orchestrator-secrets-"

#: Built-in limits, used where neither the worker nor the project sets one.
BUILTIN_LIMITS = Resources(memory=512 << 20, cpus=1.0, pids=256, timeout=600.0, tmp=64 << 20)


@dataclass(frozen=True)
class ZoneGrant:
    """One mount as a run gets it: the host folder, where it appears, and the mode.

    ``outbox`` marks ``/staged``: not a host folder but a fresh, size-capped tmpfs for this run
    only, collected into a change set after the worker's processes are gone.
    """

    name: str
    host_path: Path
    target: str
    mode: str
    standard: bool = False
    outbox: bool = False
    delete: str = PRE_APPROVED
    suffixes: tuple[str, ...] | None = None
    max_file_size: int | None = None
    ask_base: Path | None = None
    """``approval.write: ask``: the real zone folder. ``host_path`` is then the run's private
    copy of it; the difference becomes a change set applied only on approval."""
    guard: bool = False
    """A read-only bind of one of the project's policy files (or the repo's ``.git``) over
    its place inside a writable zone: a file or a folder."""

    @property
    def read_only(self) -> bool:
        return self.mode == "ro"


@dataclass(frozen=True)
class Limits:
    """Resolved resource limits for one container."""

    memory: int
    cpus: float
    pids: int
    timeout: float
    tmp: int

    FIELDS = ("memory", "cpus", "pids", "timeout", "tmp")

    @classmethod
    def of(cls, values: Mapping[str, float]) -> Limits:
        return cls(
            memory=int(values["memory"]),
            cpus=float(values["cpus"]),
            pids=int(values["pids"]),
            timeout=float(values["timeout"]),
            tmp=int(values["tmp"]),
        )


@dataclass(frozen=True)
class RunPaths:
    """Host folders of the standard zones for one run. Pure path arithmetic, no I/O."""

    session: Path
    workspace: Path
    repo: Path
    repo_git: Path | None
    workers: Path
    sandbox_root: Path
    run_dir: Path
    policy: tuple[Path, ...] = ()
    """What the orchestrator reads its policy from: the project file, the workers folder,
    credential files and ``network.trust_ca`` files. Read-only wherever a writable zone
    holds them."""

    @property
    def secrets_dir(self) -> Path:
        """In-memory folder (host /dev/shm) holding this run's secret files while it runs."""
        owner = current_owner()  # in the name, so gc can sweep what a killed run left
        name = f"{SECRETS_PREFIX}{owner.pid}-{owner.start}-{self.run_dir.name}"
        return Path("/dev/shm") / name

    @property
    def broker_dir(self) -> Path:
        """Holds the run's broker socket; mounted read-only at /run/orchestrator."""
        return self.run_dir / "broker"

    @property
    def inputs_dir(self) -> Path:
        """Holds the run's inputs (filled when it opens); mounted read-only at /inputs."""
        return self.run_dir / "inputs"

    @classmethod
    def of(cls, project: Project, *, session_id: str, workspace: str, run_id: str) -> RunPaths:
        root = project.sandbox_root
        return cls(
            session=root / "sessions" / session_id,
            workspace=root / "workspaces" / workspace,
            repo=project.repo,
            repo_git=git if (git := project.repo / ".git").exists() else None,
            workers=project.workers_dir,
            sandbox_root=root,
            run_dir=root / "runs" / run_id,
            policy=policy_paths(project),
        )


def policy_paths(project: Project) -> tuple[Path, ...]:
    """The files and folders a later run's policy comes from (the last link not followed)."""
    paths = [project.file, project.workers_dir]
    # Worker files linked into the workers folder live elsewhere: guard where they really are.
    if project.workers_dir.is_dir():
        for entry in sorted(project.workers_dir.glob(f"*{WORKER_SUFFIX}")):
            real = Path(os.path.realpath(entry))
            if entry.is_symlink() and not real.is_relative_to(project.workers_dir):
                paths.append(real)
    for credential in project.config.credentials.values():
        if credential.source == "file" and credential.path:
            # read without following links (credentials.resolve): the path as written
            paths.append(Path(os.path.normpath(project.root / Path(credential.path).expanduser())))
    # The CAs the credential proxy trusts upstream: a worker that rewrote one could have the
    # proxy hand a later run's key to a host of its choosing (read without following links).
    for name in project.config.network.trust_ca:
        paths.append(Path(os.path.normpath(project.root / Path(name).expanduser())))
    # The CAs build steps trust (``build.ca``): the same, for what a build fetches.
    if isinstance(project.config.build.ca, list):
        for name in project.config.build.ca:
            paths.append(Path(os.path.normpath(project.root / Path(name).expanduser())))
    return tuple(dict.fromkeys(paths))


@dataclass(frozen=True)
class Grant:
    """Everything a run is allowed: trust, mounts, masked paths, network, limits, children."""

    trust: Trust
    zones: tuple[ZoneGrant, ...]
    network: NetworkGrant
    limits: Limits
    masks: tuple[str, ...] = ()
    """Container paths covered by an empty read-only tmpfs (e.g. the sandbox under /repo)."""
    children: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    """Credential names delivered as files under /run/secrets (never for untrusted)."""
    egress: tuple[str, ...] = ()
    """Egress credentials: names whose value only the run's credential proxy holds (the
    worker gets a placeholder); at every trust level, behind an allowlist only."""
    paths: RunPaths | None = field(default=None, compare=False)
    isolation: Isolation = "runc"
    """The runtime the container runs under: ``gvisor`` (runsc) or ``runc``."""

    def zone(self, name: str) -> ZoneGrant | None:
        return next((z for z in self.zones if z.name == name and not z.standard), None)

    def mount_at(self, target: str) -> ZoneGrant | None:
        return next((z for z in self.zones if z.target == target), None)


def resolve_limits(*layers: Resources) -> Limits:
    """Merge resource layers, most specific first, over the built-in limits."""
    merged: dict[str, float | int] = {}
    for name in Resources.model_fields:
        for layer in (*layers, BUILTIN_LIMITS):
            value = getattr(layer, name)
            if value is not None:
                merged[name] = value
                break
    return Limits.of(merged)


def standard_zones(trust: Trust, paths: RunPaths) -> tuple[list[ZoneGrant], list[str]]:
    """The standard zones (and masks) a trust level gets."""
    host = {
        "session": paths.session,
        "workspace": paths.workspace,
        "workers": paths.workers,
        "repo": paths.repo,
    }
    zones: list[ZoneGrant] = []
    masks: list[str] = []
    for name, mode in PROFILES[trust].standard.items():
        if name == "staged":
            outbox = paths.run_dir / "outbox"  # nominal: the outbox lives in the container
            zones.append(ZoneGrant("staged", outbox, "/staged", "rw", standard=True, outbox=True))
            continue
        if name == "workers" and not os.path.lexists(paths.workers):
            # A project whose workers are given inline (harness adapters, a worker file
            # named by path) may have no workers folder: an empty read-only one instead.
            masks.append("/workers")
            continue
        zones.append(ZoneGrant(name, host[name], f"/{name}", mode, standard=True))
        if name == "workers" and paths.sandbox_root.is_relative_to(paths.workers):
            masks.append(f"/workers/{paths.sandbox_root.relative_to(paths.workers).as_posix()}")
        if name == "repo":
            # .git stays read-only even at 'full': writable hooks or config would run code on
            # the host at the user's next git command. Without a .git, none may be created.
            if paths.repo_git is not None:
                zones.append(ZoneGrant("repo", paths.repo_git, "/repo/.git", "ro", standard=True))
            elif mode == "rw":
                raise PolicyError(
                    [
                        f"{paths.repo} has no .git: at trust '{trust}' a worker could create "
                        "one (with hooks that run on your next git command); run `git init` "
                        "there first, or use a lower trust level"
                    ]
                )
            if paths.sandbox_root.is_relative_to(paths.repo):
                masks.append(f"/repo/{paths.sandbox_root.relative_to(paths.repo).as_posix()}")
    return zones, masks


def grant_for(
    project: Project,
    worker: Worker,
    paths: RunPaths,
    *,
    trust: Trust | None = None,
    timeout: float | None = None,
) -> Grant:
    """Check ``worker``'s requests against ``project`` and its trust level; return its grant."""
    grant, problems = assess_grant(project, worker, paths, trust=trust, timeout=timeout)
    if problems:
        raise PolicyError(problems)
    return grant


def assess_grant(
    project: Project,
    worker: Worker,
    paths: RunPaths,
    *,
    trust: Trust | None = None,
    timeout: float | None = None,
) -> tuple[Grant, list[str]]:
    """The grant ``worker`` would get, and every problem found on the way (empty: granted).

    With problems, the grant leaves out what was refused; callers that check more (a
    child's restriction) use it to report their own problems in the same breath.
    """
    level = trust or worker.config.trust
    sandbox = worker.config.sandbox
    problems: list[str] = []
    zones: list[ZoneGrant] = []
    masks: list[str] = []
    if sandbox is not None:
        try:
            zones, masks = standard_zones(level, paths)
        except PolicyError as exc:
            problems += exc.problems
        for index, request in enumerate(sandbox.zones):
            where = worker.where("sandbox", "zones", index)
            granted = _project_zone(project, request, level, where, problems, paths)
            if granted is not None:
                zones.append(granted)
        if sandbox.readonly:  # read-only everything: no outbox to write into either
            zones = [_readonly(z) for z in zones if not z.outbox]
        # The worker's own file too, wherever it lives (it may be run by its path).
        own = Path(os.path.realpath(worker.file))
        extra = () if own.is_relative_to(paths.workers) or own in paths.policy else (own,)
        zones += _policy_guards(zones, replace(paths, policy=(*paths.policy, *extra)), problems)
    isolation = resolve_isolation(project, worker, level, problems)
    network = network_grant(worker.config.network or project.config.defaults.network)
    _check_secrets(project, worker, level, network, problems)
    cap = project.config.untrusted_network
    if level == "untrusted" and network_rank(network) > {"none": 0, "allow": 1, "full": 2}[cap]:
        problems.append(
            f"{worker.where('network')}: '{describe(network)}' is more than {project.file} allows "
            f"untrusted workers (untrusted_network: {cap}); narrow it or raise the trust"
        )
    limits = resolve_limits(
        Resources(timeout=timeout), worker.config.resources, project.config.defaults.resources
    )
    problems += _tmpfs_problems(project, worker, limits)
    grant = Grant(
        trust=level,
        zones=tuple(zones),
        network=network,
        limits=limits,
        masks=tuple(masks),
        children=tuple(worker.config.children),
        secrets=tuple(n for n in worker.config.secrets if n not in egress_names(project)),
        egress=tuple(n for n in worker.config.secrets if n in egress_names(project)),
        paths=paths,
        isolation=isolation,
    )
    return grant, problems


def resolve_isolation(
    project: Project, worker: Worker, level: Trust, problems: list[str]
) -> Isolation:
    """The project's isolation for ``level``, or the worker's own when that is stronger.

    A worker asking for less than its level gets (``runc`` where the project says
    ``gvisor``) is refused, not quietly upgraded: it may depend on what gVisor lacks, and
    only the project file may trade isolation away.
    """
    floor: Isolation = getattr(project.config.isolation, level)
    asked = worker.config.isolation
    if asked is None:
        return floor
    if ISOLATION_ORDER.index(asked) < ISOLATION_ORDER.index(floor):
        problems.append(
            f"{worker.where('isolation')}: '{asked}' is weaker than {project.file} gives trust "
            f"'{level}' (isolation.{level}: {floor}); remove it, or set isolation.{level}: "
            f"{asked} in {project.file} (see docs/security.md)"
        )
        return floor
    return asked


def _tmpfs_problems(project: Project, worker: Worker, limits: Limits) -> list[str]:
    """A tmpfs's pages count against the container's memory: /tmp may not outgrow the limit.

    (The outbox, sized project-wide, is capped per run by the plan instead.)
    """
    if limits.tmp <= limits.memory:
        return []
    if worker.config.resources.tmp is not None:
        where = worker.where("resources", "tmp")
    else:
        where = f"{project.file}: defaults.resources.tmp"
    if worker.config.resources.memory is not None:
        fix = f"raise resources.memory in {worker.file}"
    else:
        fix = "raise the memory limit (resources.memory)"
    return [
        f"{where}: a {human_size(limits.tmp)} /tmp is more than the run's memory limit "
        f"({human_size(limits.memory)}), which its pages count against; lower tmp or {fix}"
    ]


def egress_names(project: Project) -> frozenset[str]:
    """The project's credentials bound to egress hosts (never given to a worker)."""
    return frozenset(n for n, c in project.config.credentials.items() if c.egress is not None)


def _check_secrets(
    project: Project, worker: Worker, level: Trust, network: NetworkGrant, problems: list[str]
) -> None:
    secrets = worker.config.secrets
    known = project.config.credentials
    bound = egress_names(project)
    plain = [name for name in secrets if name in known and name not in bound]
    if plain and level == "untrusted":
        egress_hint = (
            " or give the credential an egress binding in "
            f"{project.file} (the worker then gets a placeholder, docs/secrets.md)"
        )
        problems.append(
            f"{worker.where('secrets')}: {', '.join(plain)}: refused at trust 'untrusted' "
            "(credentials never reach an untrusted worker); remove them, raise the worker's "
            f"trust{egress_hint}"
        )
    for name in secrets:
        if name not in known:
            offered = ", ".join(sorted(known)) or "none"
            hint = did_you_mean(name, known)
            problems.append(
                f"{worker.where('secrets')}: '{name}' is not in {project.file} credentials "
                f"(known: {offered}); {hint + ' ' if hint else ''}add it there"
            )
    _check_egress(project, worker, [n for n in secrets if n in bound], network, problems)


def _check_egress(
    project: Project, worker: Worker, names: list[str], network: NetworkGrant, problems: list[str]
) -> None:
    """Egress credentials: behind an allowlist covering every bound host, one placeholder
    variable and one (host, header) each."""
    if not names:
        return
    credentials = project.config.credentials
    where = worker.where("secrets")
    if not isinstance(network, tuple):
        problems.append(
            f"{where}: egress credential(s) {', '.join(names)} need network: {{allow: [...]}} "
            f"listing their hosts, not '{network}'; declare an allowlist"
        )
        return
    seen_env: dict[str, str] = {}
    seen_slot: dict[tuple[str, str], str] = {}
    for name in names:
        config = credentials[name]
        binding = config.egress
        assert binding is not None  # egress_names
        for host in binding.hosts:
            name_part, _, port = host.rpartition(":")
            if not any(entry.matches(name_part, int(port)) for entry in network):
                problems.append(
                    f"{worker.where('network')}: credential '{name}' is bound to {host}, which "
                    f"the allowlist does not admit; add '{host}' to network.allow"
                )
            slot = (host, binding.header)
            if slot in seen_slot:
                problems.append(
                    f"{where}: credentials '{seen_slot[slot]}' and '{name}' both go into "
                    f"header {binding.header} of {host}; keep one"
                )
            seen_slot[slot] = name
        variable = config.placeholder_env
        if variable in seen_env:
            problems.append(
                f"{where}: credentials '{seen_env[variable]}' and '{name}' both use "
                f"placeholder_env {variable}; give each its own"
            )
        seen_env[variable] = name
        if variable in worker.config.env:
            problems.append(
                f"{worker.where('env', variable)}: {variable} holds the placeholder of "
                f"credential '{name}'; remove it from env"
            )


def _policy_guards(zones: list[ZoneGrant], paths: RunPaths, problems: list[str]) -> list[ZoneGrant]:
    """Read-only binds over every policy file (and the repo's ``.git``) inside a writable
    zone: a worker must never widen what later runs get by rewriting their declarations."""
    guarded = [*paths.policy, *([paths.repo_git] if paths.repo_git else [])]
    targets = {zone.target for zone in zones}
    guards: list[ZoneGrant] = []
    for zone in zones:
        if zone.read_only or zone.outbox or zone.ask_base is not None:
            continue  # an ask zone's changes reach the host only on approval
        if zone.host_path.is_relative_to(paths.sandbox_root):
            continue  # run state (sessions, workspaces): never read as policy
        for policy in guarded:
            where = f"zone '{zone.name}' ({zone.target})"
            if zone.host_path.is_relative_to(policy):
                problems.append(
                    f"{where}: {zone.host_path} lies in {policy}, which the orchestrator reads "
                    "its policy from; a worker could widen later runs. Use mode ro, "
                    "approval.write ask, or another folder"
                )
            elif policy.is_relative_to(zone.host_path):
                # Its top folder in the zone, not just the file: a worker could otherwise
                # rename the folder holding a guarded file and put its own in its place.
                policy = zone.host_path / policy.relative_to(zone.host_path).parts[0]
                target = f"{zone.target}/{policy.relative_to(zone.host_path).as_posix()}"
                if target in targets:
                    continue  # already mounted there (the repo's .git)
                if not os.path.lexists(policy):
                    problems.append(
                        f"{where}: {policy} does not exist, and a worker could create it "
                        "there (the orchestrator reads its policy from it); create it, or "
                        "keep it outside writable zones"
                    )
                    continue
                targets.add(target)
                guards.append(
                    ZoneGrant(zone.name, policy, target, "ro", standard=zone.standard, guard=True)
                )
    return guards


def _readonly(zone: ZoneGrant) -> ZoneGrant:
    return zone if zone.read_only else replace(zone, mode="ro")


def _project_zone(
    project: Project,
    request: ZoneRequest,
    level: Trust,
    where: str,
    problems: list[str],
    paths: RunPaths,
) -> ZoneGrant | None:
    zone = project.zones.get(request.name)
    if zone is None:
        offered = ", ".join(sorted(project.zones)) or "none"
        hint = did_you_mean(request.name, project.zones)
        problems.append(
            f"{where}: zone '{request.name}' is not declared in {project.file} "
            f"(zones: {offered}); {hint + ' ' if hint else ''}add it there or remove it here"
        )
        return None
    mode = request.mode
    if mode == "rw" and zone.mode != "rw":
        problems.append(
            f"{where}: asks rw on zone '{request.name}' but {project.file} allows "
            f"only {zone.mode}; ask for ro or raise the zone's mode"
        )
        return None
    if mode == "rw" and not PROFILES[level].project_zones_rw and not zone.config.untrusted_output:
        problems.append(
            f"{where}: trust '{level}' gets project zones read-only, but it asks rw on "
            f"'{request.name}'; mark the zone `untrusted_output: true` in {project.file}, "
            "ask for ro, or raise the worker's trust"
        )
        return None
    approval = request.approval
    if approval.write == "blocked":
        mode = "ro"
    host, target = zone.host_path, f"/{zone.name}"
    if request.restrict:
        host, target = host / request.restrict, f"{target}/{request.restrict}"
    ask_base = None
    if mode == "rw" and approval.write == "ask":
        if request.restrict:
            problems.append(
                f"{where}: approval.write 'ask' with restrict is not supported yet; "
                "drop restrict or use preApproved"
            )
            return None
        ask_base, host = host, paths.run_dir / "ask" / zone.name
    elif mode == "rw" and approval.delete != PRE_APPROVED:
        problems.append(
            f"{where}: approval.delete '{approval.delete}' needs approval.write 'ask' (a direct "
            "rw mount cannot stop deletes); use write: ask, or mode ro"
        )
        return None
    config = zone.config
    return ZoneGrant(
        zone.name,
        host,
        target,
        mode,
        delete=approval.delete,
        suffixes=tuple(config.suffixes) if config.suffixes is not None else None,
        max_file_size=config.max_file_size,
        ask_base=ask_base,
    )
