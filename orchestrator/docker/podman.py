"""Podman behind the Docker-compatible API: telling it apart, and what it does differently.

``DOCKER_HOST=unix:///run/podman/podman.sock`` (or a rootless user's
``$XDG_RUNTIME_DIR/podman/podman.sock``) points the SDK at ``podman system service``, which
answers most of the Docker API. :func:`engine_kind` asks the engine once per process who it
is (``/version`` names a ``Podman Engine`` component; ``/info`` says whether it runs
rootless and on which cgroup version). The differences that matter here:

* ``security_opt: seccomp=...`` is a *file path* to Podman, not the profile's JSON text:
  :func:`security_opt` writes the profile to a content-addressed file the service can read.
* Rootless Podman on cgroup v1 cannot enforce memory, pids or CPU limits: it creates the
  container without them and only warns. A worker without its limits never runs:
  :func:`refusal` names the cause and the fix (cgroup v2 with delegated controllers).
* gVisor is registered with Docker only (``orchestrator engine setup --gvisor``).

Docker's path does not change: everything here applies only when :func:`engine_kind` says
``podman``. docs/engines.md has the table of what works where.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import requests
from docker import errors as docker_errors
from docker.types import Ulimit

from orchestrator.docker.client import DockerClient, api_version, engine_errors
from orchestrator.egress import PROXY_ALIAS
from orchestrator.errors import EngineError
from orchestrator.exits import Exit
from orchestrator.labels import PREFIX as LABEL_PREFIX
from orchestrator.plan import ContainerSpec
from orchestrator.runtime.engine import Stream

Flavour = Literal["docker", "podman"]

#: The egress proxy's role label (egress.EGRESS_ROLE; that module imports this one).
EGRESS_ROLE_LABEL = f"{LABEL_PREFIX}.egress-role"
#: Podman's own API (network removal that refuses while in use).
LIBPOD_API = "4.0.0"
#: Podman's outside bridge for the egress proxies (``oeg-outside`` is Docker's); still
#: ``oeg-*``, so the host rule of docs/network.md covers it.
PODMAN_OUTSIDE_BRIDGE = "oeg-podman"
#: Podman's words in a 500 answer where Docker answers 409.
_CONFLICT_MARKS = (
    "is already in use",
    "already exists",
    "container state improper",
    "network is being used",
)
#: The cgroup controllers a worker's limits need: memory (and swap), pids, cpu.
LIMIT_CONTROLLERS = frozenset({"memory", "pids", "cpu"})
#: Where the seccomp profiles handed to Podman are written (below the user's runtime or
#: cache folder), one file per profile text.
PROFILE_FOLDER = "orchestrator-seccomp"
PID_MAX = "/proc/sys/kernel/pid_max"
#: Podman's words for a command that could not be started (not found, not runnable).
_EXEC_FAILURE_MARKS = (b"exec failed", b"OCI runtime attempted to invoke", b"OCI permission denied")
VAR_TMP = "/var/tmp"
VAR_TMP_MASK = "ro,nosuid,nodev,noexec,size=4k,mode=1777"
#: catatonit's last words when it cannot execute the container's command.
#: Its prefix and message are two writes, which conmon may log as two lines, and the
#: engine's log tail may hold only the second.
_CATATONIT_FAILED = re.compile(rb"^(?:ERROR \(catatonit:\d+\): ?)?failed to exec pid1: (.*)$")
LOG_ATTEMPTS = 60
#: pid_max's own limit on 64-bit Linux, where the file cannot be read.
DEFAULT_NPROC = 4194304


@dataclass(frozen=True)
class EngineKind:
    """Who answers on the socket: Docker, or Podman (rootful or rootless)."""

    flavour: Flavour
    version: str
    rootless: bool = False
    cgroup_version: str = ""
    """``1`` or ``2`` (asked of Podman only)."""
    controllers: frozenset[str] = frozenset(LIMIT_CONTROLLERS)
    """The cgroup controllers the engine may use: all of them rootful, only the delegated
    ones rootless (none on cgroup v1)."""

    @property
    def podman(self) -> bool:
        return self.flavour == "podman"

    @property
    def label(self) -> str:
        """``Docker 20.10.24``, ``rootless Podman 4.3.1``: for messages."""
        if not self.podman:
            return f"Docker {self.version}"
        return f"{'rootless' if self.rootless else 'rootful'} Podman {self.version}"

    @property
    def missing_controllers(self) -> list[str]:
        """The limit controllers Podman lacks: it then runs containers without those limits
        and only warns (4.3 on cgroup v1 rootless: "Resource limits are not supported and
        ignored")."""
        if not self.podman:
            return []
        if self.rootless and self.cgroup_version == "1":
            return sorted(LIMIT_CONTROLLERS)
        return sorted(LIMIT_CONTROLLERS - self.controllers)


_KINDS: dict[str, EngineKind] = {}
_KINDS_LOCK = threading.Lock()


def engine_kind(engine: DockerClient) -> EngineKind:
    """The engine behind ``engine``'s socket, asked once per process and socket."""
    key = str(getattr(engine.api, "base_url", "")) + "|" + os.environ.get("DOCKER_HOST", "")
    with _KINDS_LOCK:
        found = _KINDS.get(key)
    if found is not None:
        if found.podman:
            _install_status_hook(engine.api)
        return found
    with engine_errors("asking the engine for its version"):
        version: dict[str, Any] = engine.api.version()
    kind = kind_from_version(version)
    if kind.podman:  # only Podman pays for the second request
        # Its Docker-style /info reports neither rootless nor the cgroup controllers it
        # may use (it claims every limit works); its own /libpod/info does.
        with engine_errors("reading Podman's configuration"):
            response = engine.api.get(f"{engine.api.base_url}/v{api_version()}/libpod/info")
            response.raise_for_status()
            info: dict[str, Any] = response.json()
        kind = kind_from_info(kind, info)
    with _KINDS_LOCK:
        _KINDS[key] = kind
    if kind.podman:
        _install_status_hook(engine.api)
    return kind


def _conflict_status(response: requests.Response, *_args: Any, **_kwargs: Any) -> None:
    """Podman answers 500 where Docker answers 409 Conflict (a name in use, a container not
    running, a network in use): the adapter's conflict handling keys on 409."""
    if response.status_code == 500 and any(m in response.text for m in _CONFLICT_MARKS):
        response.status_code = 409


def _install_status_hook(api: Any) -> None:
    hooks = api.hooks.setdefault("response", [])
    if _conflict_status not in hooks:
        hooks.append(_conflict_status)


def remove_network(engine: DockerClient, network: str) -> None:
    """Remove ``network`` unless a container uses it (Docker: 403/409).

    Podman's Docker-style DELETE removes a network even from under running containers, so
    on Podman its own endpoint is asked, which refuses (made a 409 here, like Docker's).
    """
    if not engine_kind(engine).podman:
        engine.api.remove_network(network)
        return
    url = f"{engine.api.base_url}/v{LIBPOD_API}/libpod/networks/{quote(network, safe='')}"
    response = engine.api.delete(url)
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as exc:
        docker_errors.create_api_error_from_http_exception(exc)


def create_run_network(
    engine: DockerClient, name: str, *, labels: dict[str, str], bridge: str
) -> None:
    """Create an allowlisted run's own internal network, bridge interface ``bridge``.

    On Podman without its DNS: aardvark-dns would answer the worker there and forward
    every name it does not know to the host's resolvers, a way out (names carry data)
    that Docker's internal networks do not give. Without it the network has no gateway
    either, so the host has no address there; the worker finds its proxy through
    /etc/hosts instead (:func:`orchestrator.docker.networks.run_hosts`).
    """
    if not engine_kind(engine).podman:
        engine.api.create_network(
            name,
            driver="bridge",
            internal=True,
            labels=labels,
            check_duplicate=True,
            options={"com.docker.network.bridge.name": bridge},
        )
        return
    body = {
        "name": name,
        "driver": "bridge",
        "network_interface": bridge,
        "internal": True,
        "dns_enabled": False,
        "labels": labels,
    }
    url = f"{engine.api.base_url}/v{LIBPOD_API}/libpod/networks/create"
    response = engine.api.post(url, json=body)
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as exc:
        docker_errors.create_api_error_from_http_exception(exc)


def proxy_hosts(engine: DockerClient, network: str) -> dict[str, str]:
    """``proxy`` -> the address of the egress proxy attached to ``network`` now."""
    with engine_errors(f"finding the egress proxy on {network}"):
        found = engine.api.containers(
            filters={"network": network, "label": f"{EGRESS_ROLE_LABEL}=proxy"}
        )
        for container in found:
            info = engine.api.inspect_container(container["Id"])
            address = ((info["NetworkSettings"]["Networks"] or {}).get(network) or {}).get(
                "IPAddress"
            )
            if address:
                return {PROXY_ALIAS: str(address)}
    raise EngineError(f"no egress proxy is attached to {network}; run again")


def outside_bridge(engine: DockerClient, name: str) -> str:
    """The host interface name of the proxies' outside bridge: Docker's and Podman's must
    differ (netavark would take over, and later delete, a bridge of Docker's name)."""
    return PODMAN_OUTSIDE_BRIDGE if engine_kind(engine).podman else name


def kind_from_version(version: dict[str, Any]) -> EngineKind:
    """Docker or Podman, from ``/version`` (Podman lists a ``Podman Engine`` component)."""
    names = [str(c.get("Name", "")) for c in version.get("Components") or []]
    text = " ".join([*names, str((version.get("Platform") or {}).get("Name", ""))]).lower()
    flavour: Flavour = "podman" if "podman" in text else "docker"
    return EngineKind(flavour=flavour, version=str(version.get("Version") or "?"))


def kind_from_info(kind: EngineKind, info: dict[str, Any]) -> EngineKind:
    """Rootless, the cgroup version and the usable controllers, from ``/libpod/info``."""
    host = info.get("host") or {}
    return EngineKind(
        flavour=kind.flavour,
        version=kind.version,
        rootless=bool((host.get("security") or {}).get("rootless")),
        cgroup_version=str(host.get("cgroupVersion") or "v2").removeprefix("v"),
        controllers=frozenset(str(c) for c in host.get("cgroupControllers") or []),
    )


# -- what Podman cannot do --------------------------------------------------------------


def limits_refusal(kind: EngineKind, worker: str) -> str | None:
    """One line when ``kind`` would run ``worker`` without some of its resource limits."""
    missing = kind.missing_controllers
    if not missing:
        return None
    return (
        f"worker '{worker}' needs its {'/'.join(missing)} limits, and {kind.label} on "
        f"cgroup v{kind.cgroup_version} cannot set them (it would run the container without "
        "them and only warn): use Docker or rootful Podman, or cgroup v2 with the memory, "
        "pids and cpu controllers delegated to the user (systemd `Delegate=yes` for "
        "user@.service)"
    )


def gvisor_refusal(kind: EngineKind, worker: str, trust: str) -> str:
    """One line: gVisor is set up for Docker only."""
    return (
        f"worker '{worker}' (trust {trust}) runs under gVisor, which the orchestrator sets up "
        f"for Docker only, not for {kind.label}: run it on Docker (unset DOCKER_HOST or point "
        f"it at dockerd), or accept runc for trust {trust} with `isolation: {{{trust}: runc}}` "
        "in the project file"
    )


def full_network_refusal(kind: EngineKind, worker: str) -> str:
    """One line: ``network: full`` keeps runs apart with inter-container traffic off, which
    Podman's networks cannot do (it ignores Docker's ``enable_icc=false``)."""
    return (
        f"worker '{worker}' declares network: full, whose runs must not reach each other "
        f"(Docker's enable_icc=false), and {kind.label} ignores that setting: run it on "
        "Docker, or declare an allowlist (network: {allow: [...]}), which works on Podman"
    )


def check_spec(engine: DockerClient, spec: ContainerSpec) -> None:
    """Refuse, in one line, a container ``engine`` cannot run as ``spec`` says."""
    kind = engine_kind(engine)
    if not kind.podman:
        return
    if spec.isolation == "gvisor":
        raise EngineError(gvisor_refusal(kind, spec.worker, spec.trust))
    if spec.network.mode == "full":
        raise EngineError(full_network_refusal(kind, spec.worker))
    if spec.network.credentials:
        raise EngineError(
            f"worker '{spec.worker}' holds egress credentials, whose credential proxy is "
            f"not supported on {kind.label} yet: run it on Docker (docs/secrets.md)"
        )
    refusal = limits_refusal(kind, spec.worker)
    limits = spec.limits
    if refusal is not None and (limits.memory or limits.pids or limits.cpus):
        raise EngineError(refusal)


# -- seccomp as a file -------------------------------------------------------------------


def profile_folder() -> Path:
    """A folder only this user may write: the runtime folder, else the cache folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.getuid():
        return Path(runtime) / PROFILE_FOLDER
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / PROFILE_FOLDER


def profile_file(text: str, folder: Path | None = None) -> Path:
    """The profile ``text`` as a file named by its hash, written once and checked on reuse.

    Podman reads the file when it creates the container. The folder must belong to this
    user and be writable by nobody else, or another local user could swap the profile
    between our write and Podman's read.
    """
    folder = folder or profile_folder()
    digest = hashlib.sha256(text.encode()).hexdigest()
    path = folder / f"seccomp-{digest[:32]}.json"
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    info = os.lstat(folder)
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise EngineError(
            f"{folder} must be a folder of uid {os.getuid()} that only it may write, to hold "
            "the seccomp profile Podman reads; remove it and run again"
        )
    try:
        if path.read_bytes() == text.encode():
            return path
    except OSError:
        pass
    fd, temp = tempfile.mkstemp(dir=folder, prefix=".seccomp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def security_opt(options: list[str]) -> list[str]:
    """Docker-style options (``seccomp=<JSON>``) as Podman takes them (``seccomp=<path>``)."""
    return [
        f"seccomp={profile_file(option.removeprefix('seccomp='))}"
        if option.startswith("seccomp={")
        else option
        for option in options
    ]


def tmpfs(
    mounts: dict[str, str], *, read_only: bool = False, binds: Sequence[str] = ()
) -> dict[str, str]:
    """tmpfs options as Podman 4 takes them, meaning what they mean to Docker.

    * ``notmpcopyup`` on every one: Podman otherwise copies what the image or a bind mount
      holds at the target into the new tmpfs, and a tmpfs that masks a folder (the
      sandbox's own files inside a writable repo) would show the very files it hides.
    * Podman refuses ``uid=``/``gid=``. Only the outbox has them (``mode=0700`` and the
      worker's uid, for the worker to write to); on Podman it is ``mode=1777`` instead:
      sticky and writable by every uid, of which the container holds two, the worker's and
      the idle keep-alive process's.
    * With a read-only root, Podman mounts writable tmpfs at /run and /var/tmp (Docker
      mounts nothing there). /run is root's (mode 755), but /var/tmp is everyone's: it gets
      an empty read-only tmpfs, as read-only as the image's own under Docker.
    """
    converted = {}
    under = [t for t in [*mounts, *binds] if t == VAR_TMP or t.startswith(VAR_TMP + "/")]
    if read_only and not under:
        mounts = {**mounts, VAR_TMP: VAR_TMP_MASK}
    for target, options in mounts.items():
        parts = [p for p in options.split(",") if p and p != "tmpcopyup"]
        if any(p.startswith(("uid=", "gid=")) for p in parts):
            parts = [p for p in parts if not p.startswith(("uid=", "gid=", "mode="))]
            parts.append("mode=1777")
        converted[target] = ",".join([*parts, "notmpcopyup"])
    return converted


def tmpfs_for(
    engine: DockerClient,
    mounts: dict[str, str],
    *,
    read_only: bool = False,
    binds: Sequence[str] = (),
) -> dict[str, str]:
    """``mounts`` (tmpfs target -> options) in the form ``engine`` takes, for a container
    with a read-only root or not, and bind mounts at ``binds``."""
    if not engine_kind(engine).podman:
        return mounts
    return tmpfs(mounts, read_only=read_only, binds=binds)


def pid_max() -> int:
    """The kernel's highest pid: an RLIMIT_NPROC this high never binds."""
    try:
        return int(Path(PID_MAX).read_text().strip())
    except (OSError, ValueError):
        return DEFAULT_NPROC


def ulimits_for(engine: DockerClient, ulimits: list[Ulimit]) -> list[Ulimit]:
    """``ulimits`` plus, for rootful Podman, an explicit ``nproc`` of the kernel's pid_max.

    Docker leaves RLIMIT_NPROC as the daemon has it. Rootful Podman asks for 1048576
    unless told otherwise, which the runtime cannot set where root lacks CAP_SYS_RESOURCE
    (some container and VM sandboxes), so no container starts at all. pid_max is no limit
    either: what bounds a worker's processes is its pids limit. Rootless Podman already
    uses its own current limit.
    """
    kind = engine_kind(engine)
    if not kind.podman or kind.rootless or any(u.name == "nproc" for u in ulimits):
        return ulimits
    return [*ulimits, Ulimit(name="nproc", soft=pid_max(), hard=pid_max())]


def stopped_refusal(status: int | None, explanation: str) -> bool:
    """Whether an engine refused an exec because the container is not running: Docker
    says "is not running" (409); Podman says "container state improper"."""
    if status == 409 and "not running" in explanation:
        return True
    return "can only create exec sessions on running containers" in explanation


def exec_frames(frames: Iterator[tuple[Stream, bytes]]) -> Iterator[tuple[Stream, bytes]]:
    """An exec's frames, with Podman's report of a command it could not start in Docker's
    form, which :class:`.engine.DockerExec` turns into a ``StartFailure`` (126/127).

    Docker writes ``OCI runtime exec failed: ...`` on stdout; Podman writes
    ``Error: runc: exec failed: ...`` (or ``Error: crun: ...``) on stderr.
    """
    first = True
    try:
        for stream, chunk in frames:
            failed = first and stream == "stderr" and chunk.startswith(b"Error: ")
            if failed and any(mark in chunk for mark in _EXEC_FAILURE_MARKS):
                stream, chunk = "stdout", b"OCI runtime exec failed: " + chunk[len(b"Error: ") :]
            first = False
            yield stream, chunk
    finally:
        close = getattr(frames, "close", None)
        if close is not None:  # closing this closes the connection at once, as without it
            close()


def exec_frames_for(
    engine: DockerClient, frames: Iterator[tuple[Stream, bytes]]
) -> Iterator[tuple[Stream, bytes]]:
    return exec_frames(frames) if engine_kind(engine).podman else frames


def init_failure(log: bytes) -> int | None:
    """126/127 when ``log`` is only catatonit's report that the command could not run."""
    match = _CATATONIT_FAILED.match(b"".join(log.strip().splitlines()))
    if match is None:
        return None
    return Exit.NOT_FOUND if b"No such file" in match.group(1) else Exit.CANNOT_INVOKE


def exit_code_for(engine: DockerClient, container_id: str, code: int) -> int:
    """A container's exit code as Docker's init would have made it.

    Podman's init (catatonit) exits 1 when the command cannot be run at all, where
    Docker's (tini) exits 127 (not found) or 126 (not runnable). Only an exit code of 1
    on Podman costs a look at the container's last log lines.
    """
    if code != 1 or not engine_kind(engine).podman:
        return code
    log = b""
    for _ in range(LOG_ATTEMPTS):  # conmon may write the log a moment after the exit
        with engine_errors("reading the container's log"):
            log = engine.api.logs(container_id, stdout=True, stderr=True, tail=2)
        if log.endswith(b"\n"):  # a whole line: conmon writes the log on its own time
            break
        time.sleep(0.05)
    return init_failure(log) or code


def security_opt_for(engine: DockerClient, options: list[str]) -> list[str]:
    """``options`` (``seccomp=<JSON>`` as Docker takes it) in the form ``engine`` takes."""
    return security_opt(options) if engine_kind(engine).podman else options
