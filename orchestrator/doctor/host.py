"""Facts about the host itself: cgroups, user namespaces, disk, the resolvers Docker uses.

Read from ``/sys``, ``/proc`` and ``/etc`` without privileges and without the engine. They
describe the machine this process runs on, which is the engine's only when the engine is
local (``EngineFacts.local``); the doctor says so otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
MAX_USER_NAMESPACES = Path("/proc/sys/user/max_user_namespaces")
DAEMON_JSON = Path("/etc/docker/daemon.json")
RESOLV_CONF = Path("/etc/resolv.conf")
#: Where Docker looks when /etc/resolv.conf names only loopback resolvers (systemd-resolved).
SYSTEMD_RESOLV_CONF = Path("/run/systemd/resolve/resolv.conf")


@dataclass(frozen=True)
class DiskFree:
    """Free space on the filesystem that holds ``path`` (or its nearest existing parent)."""

    path: Path
    measured: Path
    free: int
    total: int


def cgroup_version(root: Path = CGROUP_ROOT) -> str:
    """``2`` on a unified hierarchy, ``1`` otherwise (also for the hybrid layout)."""
    return "2" if (root / "cgroup.controllers").is_file() else "1"


def cgroup_controllers(root: Path = CGROUP_ROOT) -> list[str]:
    """The controllers the host offers: v2 lists them in a file, v1 mounts one per folder."""
    controllers = root / "cgroup.controllers"
    try:
        if controllers.is_file():
            return sorted(controllers.read_text().split())
        return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "unified")
    except OSError:
        return []


def max_user_namespaces(path: Path = MAX_USER_NAMESPACES) -> int | None:
    """The kernel's user namespace limit (0: none may be created); None when unknown."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def disk_free(path: Path) -> DiskFree:
    """Free space where ``path`` is (or will be): a sandbox root may not exist yet."""
    measured = path
    while not measured.exists() and measured != measured.parent:
        measured = measured.parent
    usage = shutil.disk_usage(measured)
    return DiskFree(path=path, measured=measured, free=usage.free, total=usage.total)


def docker_nameservers(
    daemon_json: Path = DAEMON_JSON,
    resolv_conf: Path = RESOLV_CONF,
    systemd_resolv_conf: Path = SYSTEMD_RESOLV_CONF,
) -> list[str]:
    """The resolvers the engine forwards containers' outside names to, as Docker picks
    them: ``dns`` in daemon.json, else the host's resolv.conf, whose loopback entries it
    skips (systemd-resolved's stub sends it to the upstream list instead)."""
    try:
        configured = json.loads(daemon_json.read_text()).get("dns")
    except (OSError, ValueError, AttributeError):
        configured = None
    if isinstance(configured, list) and configured:
        return [str(server) for server in configured]
    servers = _nameservers(resolv_conf)
    if servers and all(_is_loopback(server) for server in servers):
        servers = _nameservers(systemd_resolv_conf) or servers
    return [server for server in servers if not _is_loopback(server)]


#: systemd-resolved's stub: a resolv.conf naming it alone sends Docker to SYSTEMD_RESOLV_CONF.
SYSTEMD_STUB = "127.0.0.53"


@dataclass(frozen=True)
class EmbeddedUpstream:
    """Where the engine's embedded DNS (127.0.0.11 on user-defined networks) sends names
    it does not know: ``servers`` from ``source``; ``loopback`` are those it queries from
    the host's own network namespace, for containers on internal networks too unless the
    engine has the fix for CVE-2024-29018."""

    source: str
    servers: list[str]
    loopback: list[str]


def embedded_upstream(
    daemon_json: Path = DAEMON_JSON,
    resolv_conf: Path = RESOLV_CONF,
    systemd_resolv_conf: Path = SYSTEMD_RESOLV_CONF,
) -> EmbeddedUpstream:
    """As Engine 20.10 to 25 pick them: ``dns`` in daemon.json, else the host's
    resolv.conf, or systemd-resolved's upstream list when that names only its stub."""
    try:
        configured = json.loads(daemon_json.read_text()).get("dns")
    except (OSError, ValueError, AttributeError):
        configured = None
    if isinstance(configured, list) and configured:
        source, servers = f"{daemon_json} (dns)", [str(server) for server in configured]
    else:
        source, servers = str(resolv_conf), _nameservers(resolv_conf)
        if servers == [SYSTEMD_STUB]:
            source, servers = str(systemd_resolv_conf), _nameservers(systemd_resolv_conf)
    return EmbeddedUpstream(source, servers, [s for s in servers if _is_loopback(s)])


def host_resolvers(servers: list[str]) -> list[str]:
    """Those of ``servers`` that are this host's own non-loopback addresses: queries to
    them arrive through the host's INPUT chain, from the egress bridges too."""
    return [server for server in servers if is_local_address(server)]


def is_local_address(address: str) -> bool:
    """True when ``address`` is assigned to one of this host's interfaces (a bind to it
    succeeds only then)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def _nameservers(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [
        words[1]
        for words in (line.split() for line in lines)
        if len(words) >= 2 and words[0] == "nameserver"
    ]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def is_root() -> bool:
    return os.geteuid() == 0
