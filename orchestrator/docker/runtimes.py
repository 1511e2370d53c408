"""Isolation runtimes: which engine runtime runs a plan's container, and registering gVisor.

The plan says ``isolation: runc`` or ``gvisor``; the engine's runtime names are this
adapter's business. ``runc`` is Docker's own runtime. ``gvisor`` is Debian's ``runsc``,
which Docker runs as a runtime declared in ``/etc/docker/daemon.json``. runsc needs a
network argument that matches the container's network, so two runtimes are declared:

``orchestrator-runsc``
    ``--network=none``: for the plan's network ``none``; the sandbox has loopback only.
``orchestrator-runsc-net``
    ``--network=host``: for the run's own internal network or a ``full`` bridge. runsc's
    own network stack refuses to start under Docker 20.10 here ("cannot run with network
    enabled in root network namespace"); with ``host`` the Sentry passes network calls to
    the container's own network namespace (never the host's), so the network the plan
    names is exactly the one the worker gets.
``orchestrator-runsc-broker``, ``orchestrator-runsc-net-broker``
    The same two with ``--host-uds=open``, for a parent only (a plan that mounts a broker
    socket): runsc refuses a sandbox's ``connect()`` to a host Unix socket by default, the
    broker's among them. ``open`` lets it connect to a socket that is already there in its
    mounts, nothing more (it cannot create or bind one on the host); the Sentry still
    checks the socket file's owner and mode against the worker's uid, as Linux would under
    runc. Workers without children never get it (docs/security.md, "Isolation runtimes").
``orchestrator-runsc-build`` and ``orchestrator-runsc-build-net``
    The same two for the steps of ``orchestrator build`` (:mod:`orchestrator.build`), plus
    ``--overlay2=none``: runsc otherwise keeps the root filesystem's writes in the
    sandbox's own memory (``root:memory``), where ``docker commit`` never sees them; with
    it, a step's writes reach the container's layer and are committed.

:func:`setup_gvisor` merges all six into ``daemon.json`` (every other key kept, written
atomically, the old file backed up) and makes dockerd reload it with SIGHUP, which
reloads ``runtimes`` without stopping a single container. It is what ``orchestrator
engine setup --gvisor`` runs; ``scripts/ensure-engine.sh`` runs it for ``make``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.config.models import Isolation
from orchestrator.docker.client import DockerClient, engine_errors
from orchestrator.errors import EngineError
from orchestrator.plan import NetworkMode

DAEMON_JSON = Path("/etc/docker/daemon.json")
DOCKER_PID = Path("/var/run/docker.pid")
#: For the plan's network ``none``.
GVISOR_NONE = "orchestrator-runsc"
#: For every other network mode (the run's own internal network, a ``full`` bridge).
GVISOR_NETWORK = "orchestrator-runsc-net"
#: The two above for a parent, whose broker socket is a host Unix socket in its mounts.
GVISOR_BROKER_NONE = "orchestrator-runsc-broker"
GVISOR_BROKER_NETWORK = "orchestrator-runsc-net-broker"
#: Lets a sandbox connect to a host Unix socket in its mounts (runsc's default: none).
HOST_UDS_OPEN = "--host-uds=open"
#: Build steps (``orchestrator build``): their writes must reach the container's layer.
GVISOR_BUILD = "orchestrator-runsc-build"
GVISOR_BUILD_NETWORK = "orchestrator-runsc-build-net"
GVISOR_ARGS = {
    GVISOR_NONE: ["--network=none", "--oci-seccomp"],
    GVISOR_NETWORK: ["--network=host", "--oci-seccomp"],
    GVISOR_BROKER_NONE: ["--network=none", "--oci-seccomp", HOST_UDS_OPEN],
    GVISOR_BROKER_NETWORK: ["--network=host", "--oci-seccomp", HOST_UDS_OPEN],
    GVISOR_BUILD: ["--network=none", "--oci-seccomp", "--overlay2=none"],
    GVISOR_BUILD_NETWORK: ["--network=host", "--oci-seccomp", "--overlay2=none"],
}
#: The runtimes of build steps (what ``orchestrator doctor`` checks for builds).
BUILD_RUNTIMES = (GVISOR_BUILD, GVISOR_BUILD_NETWORK)
#: Docker's own runtime: always there, never declared.
RUNC = "runc"
#: Host tasks a gVisor sandbox needs besides its guest's (the Sentry's and the gofer's
#: threads: about 60 measured with nothing running inside).
GVISOR_BASE_TASKS = 128
#: Host tasks per guest task, at most (on the ptrace platform each guest process has a stub
#: process of its own: about 5.3 host tasks per forked Python process measured).
GVISOR_TASKS_PER_GUEST = 8
#: How long dockerd may take to show the reloaded runtimes.
RELOAD_WAIT_S = 10.0


def setup_command() -> str:
    """The command that registers the gVisor runtimes, as the user would type it."""
    return "sudo orchestrator engine setup --gvisor"


def runtime_name(
    isolation: Isolation, network: NetworkMode, *, broker: bool = False, capture: bool = False
) -> str:
    """The engine runtime for a container of ``isolation`` with the plan's ``network``;
    ``broker``: the plan mounts a broker socket the worker must be able to connect to;
    ``capture``: the root filesystem's writes must reach the container's layer, where a
    snapshot's commit sees them (a session opened for snapshots, without a broker: the
    build runtimes, ``--overlay2=none``)."""
    if isolation == "runc":
        return RUNC
    if capture and not broker:
        return build_runtime_name(network)
    if broker:
        return GVISOR_BROKER_NONE if network == "none" else GVISOR_BROKER_NETWORK
    return GVISOR_NONE if network == "none" else GVISOR_NETWORK


def build_runtime_name(network: NetworkMode) -> str:
    """The engine runtime for a build step (``orchestrator build``) on ``network``."""
    return GVISOR_BUILD if network == "none" else GVISOR_BUILD_NETWORK


def is_gvisor(runtime: str) -> bool:
    return runtime in GVISOR_ARGS


def host_pids_limit(runtime: str, pids: int) -> int:
    """The engine's pids limit for a plan's ``pids``.

    Under runc it is the plan's. Under gVisor the host cgroup counts the sandbox's own
    threads (the Sentry, the gofer, a stub process per guest process), not the worker's
    processes: the plan's limit there would stop the sandbox starting or kill it outright
    (exit 2) instead of failing the worker's fork. So the worker's limit is kept inside
    the sandbox as ``RLIMIT_NPROC`` (the Sentry enforces it per sandbox: fork and thread
    creation fail with EAGAIN), and the host cgroup gets room for the sandbox's threads on
    top, still a hard bound.
    """
    if not is_gvisor(runtime):
        return pids
    return GVISOR_BASE_TASKS + GVISOR_TASKS_PER_GUEST * pids


def missing_message(worker: str, trust: str, runtime: str) -> str:
    """One line: the run needs gVisor, the engine lacks it; how to set it up or opt out."""
    return (
        f"worker '{worker}' (trust {trust}) runs under gVisor, but this Docker engine has no "
        f"'{runtime}' runtime: register it with `{setup_command()}` (Debian: `apt-get install "
        f"runsc` first), or accept runc for trust {trust} with `isolation: {{{trust}: runc}}` "
        "in the project file (the trade-off is in docs/security.md)"
    )


def engine_runtimes(client: DockerClient) -> dict[str, Any]:
    """The runtimes the engine reports (``docker info``): name -> path and arguments."""
    with engine_errors("reading the engine's runtimes"):
        info = client.api.info()
    runtimes = info.get("Runtimes") or {}
    return runtimes if isinstance(runtimes, dict) else {}


# -- registering gVisor with dockerd ------------------------------------------------------


@dataclass(frozen=True)
class SetupResult:
    """What :func:`setup_gvisor` did."""

    runtimes: tuple[str, ...]
    changed: bool
    """``daemon.json`` was rewritten (False: it already declared the runtimes)."""
    reloaded: bool
    """dockerd was sent SIGHUP."""
    backup: Path | None
    runsc: str


def setup_gvisor(
    client: DockerClient,
    *,
    daemon_json: Path = DAEMON_JSON,
    pid_file: Path = DOCKER_PID,
    runsc: str | None = None,
) -> SetupResult:
    """Declare the gVisor runtimes in ``daemon_json`` and have dockerd load them.

    Idempotent: a file that already declares them is left alone, and dockerd is signalled
    only when it does not report them yet. Raises :class:`EngineError` with one line
    naming the fix (not root, runsc missing, an unreadable file, a dockerd that did not
    load them).
    """
    if os.geteuid() != 0:
        raise EngineError(
            f"registering the gVisor runtime rewrites {daemon_json} and signals dockerd: "
            f"run it as root, `sudo {sys.executable} -m orchestrator engine setup --gvisor`"
        )
    found = runsc or shutil.which("runsc") or _in_sbin("runsc")
    if found is None:
        raise EngineError(
            "runsc (gVisor) is not installed: `sudo apt-get install runsc` (Debian, Ubuntu), "
            "then run `orchestrator engine setup --gvisor` again"
        )
    wanted = {name: {"path": found, "runtimeArgs": args} for name, args in GVISOR_ARGS.items()}
    config = _read_config(daemon_json)
    runtimes = config.get("runtimes", {})
    if not isinstance(runtimes, dict):
        raise EngineError(
            f"{daemon_json}: 'runtimes' is not a mapping; fix it by hand (see dockerd's docs)"
        )
    changed = any(runtimes.get(name) != entry for name, entry in wanted.items())
    backup = None
    if changed:
        config["runtimes"] = {**runtimes, **wanted}
        backup = _write_config(daemon_json, config)
    reloaded = False
    if _differences(engine_runtimes(client), wanted):
        _reload_dockerd(pid_file, daemon_json)
        reloaded = True
        _wait_for(client, wanted, daemon_json, backup)
    return SetupResult(tuple(wanted), changed, reloaded, backup, found)


def _in_sbin(name: str) -> str | None:
    for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"):
        path = Path(folder) / name
        if os.access(path, os.X_OK):
            return str(path)
    return None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise EngineError(f"{path}: cannot read it ({exc.strerror}); fix its permissions") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineError(
            f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); dockerd cannot read it "
            "either: fix it first"
        ) from None
    if not isinstance(data, dict):
        raise EngineError(f"{path}: not a JSON object; fix it first")
    return data


def _write_config(path: Path, config: dict[str, Any]) -> Path | None:
    """Write ``config`` to ``path`` atomically (same folder, fsynced, renamed into place);
    the previous file, if any, is kept as ``<path>.orchestrator-backup-<UTC time>``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    mode = 0o644
    if path.exists():
        mode = path.stat().st_mode & 0o7777
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        backup = path.with_name(f"{path.name}.orchestrator-backup-{stamp}")
        shutil.copy2(path, backup)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(config, out, indent=2)
            out.write("\n")
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return backup


def dockerd_pid(pid_file: Path = DOCKER_PID) -> int | None:
    """dockerd's pid: from its pid file when that names a live dockerd, else the only
    process called ``dockerd``."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid > 0 and _comm(pid) == "dockerd":
        return pid
    found = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    named = [p for p in found if _comm(p) == "dockerd"]
    return named[0] if len(named) == 1 else None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _reload_dockerd(pid_file: Path, daemon_json: Path) -> None:
    """SIGHUP: dockerd re-reads its configuration file and reloads ``runtimes`` (running
    containers are not touched; a restart would stop them)."""
    pid = dockerd_pid(pid_file)
    if pid is None:
        raise EngineError(
            f"{daemon_json} declares the gVisor runtimes, but no single local dockerd process "
            "was found to reload it: restart the engine (e.g. `sudo systemctl restart docker`)"
        )
    os.kill(pid, signal.SIGHUP)


def _differences(loaded: dict[str, Any], wanted: dict[str, dict[str, Any]]) -> list[str]:
    """The wanted runtimes dockerd does not run as declared (missing, other path or args)."""
    return [
        name
        for name, entry in wanted.items()
        if not isinstance(loaded.get(name), dict)
        or loaded[name].get("path") != entry["path"]
        or list(loaded[name].get("runtimeArgs") or []) != entry["runtimeArgs"]
    ]


def _wait_for(
    client: DockerClient, wanted: dict[str, dict[str, Any]], daemon_json: Path, backup: Path | None
) -> None:
    deadline = time.monotonic() + RELOAD_WAIT_S
    while True:
        missing = _differences(engine_runtimes(client), wanted)
        if not missing:
            return
        if time.monotonic() > deadline:
            kept = f"; the previous file is {backup}" if backup else ""
            raise EngineError(
                f"dockerd did not load runtime(s) {', '.join(missing)} as declared in "
                f"{daemon_json} after SIGHUP: is it started with another --config-file, or "
                f"does its log show a configuration error?{kept}"
            )
        time.sleep(0.2)
