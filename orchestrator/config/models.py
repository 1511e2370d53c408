"""Strict declaration models: the project file and the worker file.

Every model forbids unknown keys, so a typo in YAML is an error rather than a silently
ignored setting. Values are normalised here (``512m`` becomes bytes) so that the policy and
plan layers only ever see checked, typed data.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from orchestrator.config.allowlist import bound_host, validate_allowlist
from orchestrator.timeouts import MAX_SESSION_S, MAX_TIMEOUT_S

# Trust levels and approvals are spelled in a leaf module (the CLI's --help reads them
# without pydantic); they are re-exported here, where the models use them.
from orchestrator.vocabulary import PRE_APPROVED
from orchestrator.vocabulary import TRUST_ORDER as TRUST_ORDER
from orchestrator.vocabulary import Approval as Approval
from orchestrator.vocabulary import Trust as Trust

ZONE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
WORKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

#: Zone names the orchestrator keeps for its standard zones.
STANDARD_ZONES = frozenset({"session", "workspace", "repo", "staged", "workers"})
#: Where a run's own inputs (``run --input``) are mounted (``/inputs``): no zone may be.
INPUTS_ZONE = "inputs"
#: Top-level container paths a zone mounted at ``/<name>`` must never shadow.
SYSTEM_DIRS = frozenset(
    {
        "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media",
        "mnt", "opt", "proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var",
    }
)  # fmt: skip

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: object) -> int:
    """Turn ``512m``, ``1g``, ``1.5GiB`` or a plain byte count into bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512m or 2g")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"'{value}' is not a size; write it like 512m or 2g")
        size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError("a size must be positive")
    return size


def human_size(size: float) -> str:
    """``2 GiB``, ``1.5 MiB``, ``512 bytes``: a byte count the way people write sizes."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.4g} {unit}"
    return f"{size:g} bytes"


#: The engine refuses a smaller memory limit (Docker: "Minimum memory limit allowed is 6MB").
MIN_MEMORY = 6 << 20
#: The engine refuses a smaller CPU share (Docker: "Range of CPUs is from 0.01 to N").
MIN_CPUS = 0.01


def _memory(value: int) -> int:
    if value < MIN_MEMORY:
        raise ValueError(
            f"{human_size(value)} is below the engine's minimum memory limit of "
            f"{human_size(MIN_MEMORY)}; write at least 6m"
        )
    return value


def _cpus(value: float) -> float:
    if value < MIN_CPUS:
        raise ValueError(f"{value:g} is below the engine's minimum of {MIN_CPUS} CPUs")
    return value


def _path_pattern(value: str) -> str:
    """A relative glob pattern: names, ``*``, ``?``, ``**``; no empty, ``.`` or ``..`` part."""
    if not value or value.startswith("/") or "\\" in value or not value.isprintable():
        raise ValueError(f"{value!r} is not a relative path pattern (e.g. 'conftest.py', 'ci/**')")
    if any(part in ("", ".", "..") for part in value.split("/")):
        raise ValueError(f"{value!r} has an empty, '.' or '..' part; write e.g. 'tools/*.sh'")
    return value


Size = Annotated[int, BeforeValidator(parse_size)]
MemorySize = Annotated[int, BeforeValidator(parse_size), AfterValidator(_memory)]
Mode = Literal["ro", "rw"]


class Strict(BaseModel):
    """Base for every declaration model: unknown keys are errors, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(Strict):
    """Limits for one container. Unset fields fall back to the project's defaults."""

    memory: MemorySize | None = None
    """Memory limit, e.g. ``512m`` (at least 6m); swap is held equal to it (no swap)."""
    cpus: Annotated[float, AfterValidator(_cpus)] | None = Field(default=None, le=256)
    """CPU share in cores, e.g. ``0.5`` or ``2``."""
    pids: int | None = Field(default=None, ge=8, le=65536)
    """Maximum number of processes and threads inside the container."""
    timeout: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    """Wall-clock seconds before the container is killed (exit 124)."""
    tmp: Size | None = None
    """Size of the writable ``/tmp`` tmpfs; at most the memory limit (its pages count there)."""


class ZoneConfig(Strict):
    """A host folder the project offers to workers, with the widest mode it allows."""

    path: str
    """Host folder, relative to the project folder (or absolute)."""
    mode: Mode = "ro"
    """The widest mode any worker may get: ``ro`` or ``rw``."""
    description: str = ""
    untrusted_output: bool = False
    """Let ``untrusted`` workers write here (otherwise they get this zone read-only at most)."""
    suffixes: list[str] | None = None
    """Host-side file API: only names ending in one of these (e.g. ``.md``) may be written."""
    max_file_size: Size | None = None
    """Host-side file API: the largest file that may be written here."""

    @field_validator("suffixes")
    @classmethod
    def _dotted(cls, suffixes: list[str] | None) -> list[str] | None:
        for suffix in suffixes or []:
            if not suffix.startswith(".") or "/" in suffix:
                raise ValueError(f"suffix '{suffix}' must look like '.md'")
        return suffixes


class Allowlist(Strict):
    """``network: {allow: [...]}``: only these destinations, through the egress proxy."""

    allow: list[str]
    """``DOMAIN`` (ports 80 and 443), ``DOMAIN:PORT``, ``*.DOMAIN[:PORT]`` or an IPv4 address."""

    @field_validator("allow")
    @classmethod
    def _valid(cls, allow: list[str]) -> list[str]:
        validate_allowlist(allow)  # raises ValueError naming each bad entry and the fix
        return allow


def _network(value: object) -> object:
    """One clear message for a wrong network, instead of one per union member."""
    if isinstance(value, str) and value not in ("none", "full"):
        raise ValueError(f"'{value}' must be none, full, or {{allow: [DOMAIN, ...]}}")
    if isinstance(value, dict):
        return Allowlist.model_validate(value)
    return value


Network = Annotated[Literal["none", "full"] | Allowlist, BeforeValidator(_network)]
#: The runtime a container runs under: ``runc`` (shared kernel) or ``gvisor`` (runsc: the
#: worker's system calls are served by gVisor's own kernel in user space).
Isolation = Literal["runc", "gvisor"]
#: Isolation from weakest to strongest.
ISOLATION_ORDER: tuple[Isolation, ...] = ("runc", "gvisor")
ZoneName = Annotated[str, AfterValidator(lambda name: check_zone_name(name))]


class Defaults(Strict):
    """Project-wide defaults that a worker file may override."""

    image: str = "orchestrator/worker:latest"
    resources: Resources = Resources()
    network: Network = "none"


#: Docker's own network names, which a local service declaration may not name.
_ENGINE_NETWORKS = frozenset({"bridge", "host", "none"})
_SERVICE_NETWORK = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")


class LocalService(Strict):
    """A local service the egress proxy may reach: a user-defined Docker network."""

    network: str
    """The network's name. The proxy joins it, so an allowlist entry
    ``CONTAINER.NETWORK[:PORT]`` (a container's name or alias on it) reaches that service."""

    @field_validator("network")
    @classmethod
    def _user_network(cls, name: str) -> str:
        if not _SERVICE_NETWORK.match(name):
            raise ValueError(f"'{name}' is not a Docker network name")
        if name in _ENGINE_NETWORKS or name.startswith("orchestrator-"):
            raise ValueError(
                f"'{name}' is not a user-defined network; name a network you created "
                "(`docker network create NAME`)"
            )
        return name


class ProjectNetwork(Strict):
    """``network:`` in the project file: what the egress proxy may reach besides the
    internet."""

    services: list[LocalService] = []
    """Local services behind the allowlist: networks the egress proxy joins."""
    trust_ca: list[str] = []
    """PEM files of extra CAs the credential proxy trusts upstream (a local service with
    its own CA), relative to the project folder."""


class OutboxLimits(Strict):
    """Caps on what one run may bring out through ``/staged``."""

    size: Size = 256 << 20
    """Hard cap of the outbox (a tmpfs): the worker gets 'no space left' beyond it."""
    max_files: int = Field(default=10_000, ge=1, le=1_000_000)
    max_file_size: Size = 64 << 20


class SandboxSettings(Strict):
    """Where the orchestrator keeps its run state."""

    root: str = ".sandbox"
    outbox: OutboxLimits = OutboxLimits()


#: Headers a credential may never be written into: the proxy and HTTP framing own them.
_FRAMING_HEADERS = frozenset(
    {
        "host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
        "trailer", "keep-alive", "expect", "content-encoding", "content-type",
    }
)  # fmt: skip
_HEADER_NAME = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]{1,64}$")
#: Where a value could go other than a header: refused with a reason, not just "unknown".
_INJECTION_KEYS = frozenset({"query", "body", "param", "params", "in", "location", "cookie"})


class EgressBinding(Strict):
    """``egress:`` under a credential: never given to the worker, which gets a random
    placeholder instead; the run's credential proxy writes the real value into one header
    of HTTPS requests to the bound hosts only (see docs/secrets.md)."""

    hosts: list[str] = Field(min_length=1)
    """Exact host names, HTTPS (port 443 unless ``host:port``); no wildcards, no IP
    literals. Each must be on the worker's allowlist."""
    header: str = "authorization"
    """The one header the value may be written into."""
    format: str | None = None
    """The header's whole form, e.g. ``Bearer {value}``; unset: the placeholder is
    replaced wherever it stands in that header."""
    placeholder_env: str | None = None
    """The worker's environment variable holding the placeholder (default: the
    credential's ``env`` for ``source: env``)."""

    @model_validator(mode="before")
    @classmethod
    def _header_only(cls, data: object) -> object:
        if isinstance(data, dict):
            for key in data:
                if str(key).lower() in _INJECTION_KEYS:
                    raise ValueError(
                        f"'{key}': a credential is only ever written into one request header; "
                        "body, query and cookie injection are refused (remove it, see "
                        "docs/secrets.md)"
                    )
        return data

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        problems = []
        for index, host in enumerate(hosts):
            try:
                bound_host(host)
            except ValueError as exc:
                problems.append(f"hosts[{index}] {exc}")
        if problems:
            raise ValueError("; ".join(problems))
        return [str(bound_host(host)) for host in hosts]

    @field_validator("header")
    @classmethod
    def _header(cls, header: str) -> str:
        name = header.strip().lower()
        if not _HEADER_NAME.match(name):
            raise ValueError(f"'{header}' is not an HTTP header name; write e.g. authorization")
        if name in _FRAMING_HEADERS or name.startswith("proxy-") or name.startswith(":"):
            raise ValueError(
                f"'{header}' frames the request or belongs to the proxy; name the header the "
                "API reads its key from (e.g. authorization, x-api-key)"
            )
        return name

    @field_validator("format")
    @classmethod
    def _format(cls, form: str | None) -> str | None:
        if form is None:
            return None
        rest = form.replace("{value}", "", 1)
        if "{value}" not in form or "{" in rest or "}" in rest:
            raise ValueError(
                f"'{form}' must hold '{{value}}' exactly once and no other braces, "
                "e.g. 'Bearer {value}'"
            )
        if not form.isascii() or not form.isprintable():
            raise ValueError("must be printable ASCII on one line")
        return form

    @field_validator("placeholder_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not ENV_NAME.match(name):
            raise ValueError(f"'{name}' is not a valid environment variable name")
        return name


class CredentialConfig(Strict):
    """Where a credential comes from and how a push may use it. Values never live here."""

    source: Literal["env", "file", "command"]
    env: str | None = None
    """For ``source: env``: the variable holding the value."""
    path: str | None = None
    """For ``source: file``: the file holding the value (first line)."""
    command: list[str] | None = None
    """For ``source: command``: a program that prints the value (e.g. a CLI's token command)."""
    mode: Literal["inherit", "explicit"] = "explicit"
    """``inherit``: git uses the host's agents and helpers; ``explicit``: only this value."""
    username: str = "x-access-token"
    """User name sent with the token over HTTP."""
    egress: EgressBinding | None = None
    """Written into requests by the run's credential proxy instead of being given to the
    worker: the worker sees only a placeholder (see docs/secrets.md)."""

    @model_validator(mode="after")
    def _source_field(self) -> CredentialConfig:
        needed = {"env": self.env, "file": self.path, "command": self.command}[self.source]
        if self.mode == "explicit" and not needed:
            field = {"env": "env", "file": "path", "command": "command"}[self.source]
            raise ValueError(f"source '{self.source}' needs '{field}'")
        if self.egress is not None:
            if self.mode == "inherit":
                raise ValueError(
                    "an egress credential needs a value: use mode explicit (the default)"
                )
            if self.egress.placeholder_env is None and self.source != "env":
                raise ValueError(
                    "egress.placeholder_env: required unless source is env; name the "
                    "variable the worker's client reads its key from"
                )
        return self

    @property
    def placeholder_env(self) -> str:
        """The worker's variable holding an egress credential's placeholder."""
        binding = self.egress
        if binding is None:
            raise ValueError("not an egress credential")
        return binding.placeholder_env or self.env or ""


class ClearanceSettings(Strict):
    """Where cleared change sets go."""

    remote: str = "origin"
    branch: str | None = None
    """Branch to commit on (default: the repo's current branch)."""
    credential: str | None = None
    """Name of the credential a push uses (see ``credentials``)."""
    sensitive_paths: list[Annotated[str, AfterValidator(_path_pattern)]] = []
    """More files that run code by themselves (glob patterns), on top of the built-in list:
    a change set touching one is cleared only with ``--ack-sensitive PATH`` for each."""


class IsolationSettings(Strict):
    """``isolation:`` in the project file: the runtime each trust level runs under at
    least. A worker file may ask for ``gvisor`` at any level, never for less than this."""

    untrusted: Isolation = "gvisor"
    """``runc`` here is an explicit opt-out: untrusted workers then share the host's
    kernel (see docs/security.md for the trade-off)."""
    session: Isolation = "runc"
    workspace: Isolation = "runc"
    full: Isolation = "runc"


def _image_pattern(pattern: str) -> str:
    """A ``build.images`` entry: a name or a pattern of ``*`` and ``?``."""
    if not pattern or any(c.isspace() for c in pattern):
        raise ValueError(f"'{pattern}': an image name or pattern has no spaces")
    if any(c in pattern for c in "[]!\\"):
        raise ValueError(f"'{pattern}': only '*' and '?' are wildcards in an image pattern")
    return pattern


class BuildSettings(Strict):
    """``build:``: what ``orchestrator build`` gives a Dockerfile's steps (docs/build.md)."""

    allow: list[str] = []
    """Destinations a ``RUN`` step may reach through the egress proxy (as a worker's
    ``network: {allow: [...]}``); empty: no network at all."""
    resources: Resources = Resources()
    """Per step (memory, cpus, pids) and the whole build (timeout); unset: the defaults'."""
    disk: Size | None = None
    """Bytes a step may add to its layer, all its files, folders and links together
    (default 4 GiB)."""
    disk_total: Size | None = None
    """Bytes all the steps of one build may add together (default 16 GiB)."""
    secrets: list[str] = []
    """Names from the project's ``credentials`` a Dockerfile's ``RUN
    --mount=type=secret,id=NAME`` may mount (a file of mode 0400, for that one step, never
    in a layer); any other secret mount is refused."""
    images: list[Annotated[str, AfterValidator(_image_pattern)]] = []
    """Local images a Dockerfile may name in ``FROM`` and ``COPY --from``, on top of the
    images the orchestrator ships (``orchestrator/base``, ``worker``, ``agent``): names or
    patterns (``debian:bookworm``, ``debian:*``, ``my-org/*``; a name without a tag
    matches every tag). Any other image is refused; the egress and credential proxies'
    images always are."""
    ca: Literal["host"] | list[str] = []
    """CA certificates a ``RUN`` step with network trusts besides its image's own (a
    mirror or a proxy that re-signs TLS): ``host`` (the CAs this machine trusts) or PEM
    files relative to the project folder. The step's bundle (the image's and these) is
    mounted read-only over the image's for that step only, never committed."""

    @field_validator("allow")
    @classmethod
    def _valid(cls, allow: list[str]) -> list[str]:
        validate_allowlist(allow)
        return allow


class ProjectConfig(Strict):
    """``orchestrator.yaml``: what exists and the widest access it may be given."""

    zones: dict[ZoneName, ZoneConfig] = {}
    defaults: Defaults = Defaults()
    sandbox: SandboxSettings = SandboxSettings()
    workers: str = "workers"
    """Folder holding ``NAME.worker`` files, relative to the project folder."""
    repo: str = "."
    """The project's git working tree, mounted at ``/repo`` for trusted enough workers."""
    credentials: dict[str, CredentialConfig] = {}
    clearance: ClearanceSettings = ClearanceSettings()
    untrusted_network: Literal["none", "allow", "full"] = "allow"
    """The widest network an ``untrusted`` worker may get: nothing, an allowlist, or full."""
    network: ProjectNetwork = ProjectNetwork()
    """Local services an allowlisted worker may reach through the egress proxy."""
    isolation: IsolationSettings = IsolationSettings()
    """The runtime per trust level: gVisor for ``untrusted``, runc for the others."""
    build: BuildSettings = BuildSettings()
    """``orchestrator build``: the steps' network allowlist, limits, disk limit and the
    secrets a step may mount."""


def check_zone_name(name: str) -> str:
    """Refuse names that cannot be mounted at ``/<name>`` safely."""
    if not ZONE_NAME.match(name):
        raise ValueError(
            f"zone name '{name}' is invalid; use lower-case letters, digits, '-' or '_' "
            "(starting with a letter, at most 32 characters)"
        )
    if name in STANDARD_ZONES:
        raise ValueError(f"zone name '{name}' is reserved for a standard zone; pick another")
    if name in SYSTEM_DIRS:
        raise ValueError(f"zone name '{name}' would hide the container's /{name}; pick another")
    if name == INPUTS_ZONE:
        raise ValueError(f"zone name '{name}' would hide the run's inputs at /{name}; pick another")
    return name


class ZoneApproval(Strict):
    """How writes and deletes in a zone are approved."""

    write: Approval = PRE_APPROVED
    """``preApproved``: direct rw; ``blocked``: mounted ro; ``ask``: reviewed change sets."""
    delete: Approval = PRE_APPROVED


class ZoneRequest(Strict):
    """One zone a worker asks for, and the mode it needs."""

    name: str
    mode: Mode = "ro"
    restrict: str | None = None
    """Only this subtree of the zone (relative path); the worker sees it at the same path."""
    approval: ZoneApproval = ZoneApproval()

    @field_validator("restrict")
    @classmethod
    def _relative(cls, restrict: str | None) -> str | None:
        if restrict is None:
            return None
        parts = [p for p in restrict.split("/") if p not in ("", ".")]
        if restrict.startswith("/") or ".." in parts or not parts:
            raise ValueError(
                f"restrict '{restrict}' must be a relative path inside the zone, without '..'"
            )
        return "/".join(parts)


class SandboxRequest(Strict):
    """The file access a worker asks for. No ``sandbox`` section means no mounts at all."""

    zones: list[ZoneRequest] = []
    readonly: bool = False
    """Downgrade every zone (standard ones included) to read-only."""

    @field_validator("zones")
    @classmethod
    def _unique(cls, zones: list[ZoneRequest]) -> list[ZoneRequest]:
        seen: set[str] = set()
        for zone in zones:
            if zone.name in seen:
                raise ValueError(f"zone '{zone.name}' is listed twice; keep one entry")
            seen.add(zone.name)
        return zones


class InputsConfig(Strict):
    """``inputs:`` in a worker file: what per-run inputs (``run --input``) it accepts.

    Without this section a worker takes any inputs; with it, its runs also always get an
    (empty when none were given) ``/inputs`` folder."""

    suffixes: list[str] | None = None
    """Only files whose names end in one of these (e.g. ``.pdf``; case ignored), inside
    given folders too."""
    max_count: int | None = Field(default=None, ge=0)
    """At most this many inputs per run (0: none)."""
    max_size: Size | None = None
    """The largest one input may be (a folder: the sum of its files)."""

    @field_validator("suffixes")
    @classmethod
    def _dotted(cls, suffixes: list[str] | None) -> list[str] | None:
        for suffix in suffixes or []:
            if not suffix.startswith(".") or "/" in suffix:
                raise ValueError(f"suffix '{suffix}' must look like '.pdf'")
        return suffixes


def _env_value(value: object) -> object:
    """One clear message for a list or mapping, instead of one per union member."""
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list):
        kind = "a list"
    elif isinstance(value, dict):
        kind = "a mapping"
    else:
        kind = "empty" if value is None else type(value).__name__
    raise ValueError(f"must be a string, number or boolean, not {kind}; quote it")


EnvValue = Annotated[str | int | float | bool, BeforeValidator(_env_value)]


class WorkerConfig(Strict):
    """The front matter of a ``NAME.worker`` file."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    image: str | None = None
    """Image to run; the project's default image when unset."""
    command: list[str] | None = Field(default=None, min_length=1)
    """Argument vector; the image's own command when unset."""
    workdir: str | None = None
    """Working directory inside the container (absolute); ``/tmp`` when unset."""
    env: dict[str, EnvValue] = {}
    """Plain environment values. Secrets never go here."""
    resources: Resources = Resources()
    sandbox: SandboxRequest | None = None
    network: Network | None = None
    trust: Trust = "untrusted"
    """Preset over the standard zones; see docs/security.md."""
    isolation: Isolation | None = None
    """``gvisor`` to run under gVisor even where the project's level says runc; ``runc``
    only where the project allows it for the run's trust level."""
    children: list[str] = []
    """Workers this one may call through the broker (``orchestrator-call NAME``)."""
    secrets: list[str] = []
    """Names from the project's ``credentials`` delivered as files under /run/secrets."""
    inputs: InputsConfig | None = None
    """What per-run inputs it accepts (any, when unset); see docs/configuration.md."""
    image_user: bool = False
    """Run as the image's own user (often root) with a writable root filesystem (a layer
    of the run, discarded with it): for task images that expect to be changed in place.
    Only under gVisor; see docs/configuration.md."""
    checkpoints: bool = False
    """Its live sessions may snapshot themselves with the ``checkpoint`` tool and start
    forks of their own checkpoints with the ``branch`` tool (MCP, ``session call``);
    without it both are refused. See docs/sessions.md."""
    idle: Literal["stop", "pause"] = "stop"
    """What a live session of this worker does when its idle timeout passes: ``stop``
    (closed) or ``pause`` (frozen; after ``stop_paused_after`` saved as a snapshot, then
    closed). See docs/sessions.md."""
    stop_paused_after: float = Field(default=3600.0, gt=0, le=MAX_SESSION_S)
    """With ``idle: pause``: seconds a session paused when idle waits before it is saved as
    a snapshot and closed."""

    @field_validator("children")
    @classmethod
    def _child_names(cls, children: list[str]) -> list[str]:
        for child in children:
            if not WORKER_NAME.match(child):
                raise ValueError(f"child '{child}' must be a worker name, not a path")
        return children

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, workdir: str | None) -> str | None:
        if workdir is not None and not workdir.startswith("/"):
            raise ValueError(f"workdir '{workdir}' must be an absolute path such as /output")
        return workdir

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, EnvValue]) -> dict[str, EnvValue]:
        for key in env:
            if not ENV_NAME.match(key):
                raise ValueError(f"'{key}' is not a valid environment variable name")
        return env
