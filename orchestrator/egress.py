"""The egress proxy's contract, for every engine: what it is given and what it answers. Pure.

An allowlisted worker's only way out is a proxy (``images/proxy``: squid behind
``entry.py``) on its run's internal network. This module describes that proxy once:
its image and configuration version, the name and port workers reach it by and the
environment that points their clients at it, the environment it takes and how a plan's
allowlist becomes that environment, its limits, its health check and the line it logs for
every decision, with the parser for those lines. Each engine renders it its own way
(:mod:`orchestrator.docker.egress` as one shared container per allowlist,
:mod:`orchestrator.docker.swarm.egress` as a service of the run) and keeps its own API calls.

The image cannot import this package; ``tests/unit/test_egress_contract.py`` checks that
``images/proxy`` reads and writes what is declared here. A proxy feature (a variable, a
rule, a log field) goes here first, then into the image and the adapters; bump
:data:`PROXY_VERSION` when what the proxy is given or must do changes. See docs/network.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from orchestrator.config.allowlist import AllowEntry

__all__ = [
    "ALLOWED",
    "DECISION_FIELDS",
    "DECISION_MARK",
    "ENV_ALLOW",
    "ENV_EXCLUDE",
    "ENV_PORT",
    "ENV_REACH",
    "FLOOD_MARK",
    "FLOOD_WINDOW",
    "LINE_MAX",
    "LOG_ALLOWED",
    "LOG_DENIED",
    "PROXY_ALIAS",
    "PROXY_HEALTH",
    "PROXY_IMAGE",
    "PROXY_LOG_OPTIONS",
    "PROXY_MEMORY",
    "PROXY_NANO_CPUS",
    "PROXY_NOFILE",
    "PROXY_PIDS",
    "PROXY_PORT",
    "PROXY_TMP",
    "PROXY_TMP_SIZE",
    "PROXY_URL",
    "PROXY_VARIABLES",
    "PROXY_VERSION",
    "RUN_ALLOWED",
    "RUN_DENIED",
    "Decision",
    "Flood",
    "HealthCheck",
    "allow_text",
    "network_env",
    "parse_decisions",
    "parse_floods",
    "proxy_environment",
]

#: The proxy image, built from ``images/proxy``.
PROXY_IMAGE = "orchestrator/proxy:latest"
#: The proxy's configuration contract: what the orchestrator passes it and what it must do
#: (environment, networks, health check, rules). Bump it whenever that changes: a shared
#: proxy carrying another version (or none: made before the label existed) is replaced
#: when no run of an older version still uses it. 2: per-run networks, EGRESS_EXCLUDE, the
#: health check, EGRESS_REACH (private destinations other than these refused). 3: decisions
#: logged within a budget per client, the rest counted in FLOOD_MARK lines.
PROXY_VERSION = "3"

# -- how workers reach it ---------------------------------------------------------------

#: The port the proxy listens on, and its DNS name on every internal network.
PROXY_PORT = 3128
PROXY_ALIAS = "proxy"
PROXY_URL = f"http://{PROXY_ALIAS}:{PROXY_PORT}"
#: Proxy variables a worker file may not set itself.
PROXY_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
)


def network_env(proxy_url: str = PROXY_URL) -> dict[str, str]:
    """The environment that sends a worker's HTTP(S) clients through the proxy."""
    no_proxy = "localhost,127.0.0.1"
    values = (proxy_url, proxy_url, proxy_url, proxy_url, no_proxy, no_proxy)
    return dict(zip(PROXY_VARIABLES, values, strict=True))


# -- what it is given -------------------------------------------------------------------

#: The admitted entries (:func:`allow_text`), separated by spaces.
ENV_ALLOW = "EGRESS_ALLOW"
#: The port to listen on (:data:`PROXY_PORT`).
ENV_PORT = "EGRESS_PORT"
#: IPv4 networks (CIDR) never served: the proxy's own way out and the local service
#: networks it joins. Its only other networks are the runs' own, whose every client it
#: serves.
ENV_EXCLUDE = "EGRESS_EXCLUDE"
#: The only private IPv4 networks (CIDR) that may be destinations: the same networks.
#: Anything else private may be a run's network, which the proxy joins and must never
#: bridge.
ENV_REACH = "EGRESS_REACH"


def allow_text(allow: Iterable[AllowEntry]) -> str:
    """The allowlist as the proxy image reads it (and as the Docker label shows it)."""
    return " ".join(str(entry) for entry in sorted(set(allow)))


def proxy_environment(allow: Iterable[AllowEntry], private: Sequence[str]) -> dict[str, str]:
    """The proxy's environment for normalised allowlist entries; ``private`` are the
    subnets of its outside network and of the local service networks it joins."""
    return {
        ENV_ALLOW: allow_text(allow),
        ENV_PORT: str(PROXY_PORT),
        ENV_EXCLUDE: " ".join(private),
        ENV_REACH: " ".join(private),
    }


# -- limits and health ------------------------------------------------------------------

PROXY_MEMORY = 128 << 20
PROXY_PIDS = 64
PROXY_NANO_CPUS = 1_000_000_000
PROXY_NOFILE = 4096
#: Its only writable place (a tmpfs; its root filesystem is read-only), and its size.
PROXY_TMP = "/tmp"
PROXY_TMP_SIZE = 16 << 20
#: Options of the ``json-file`` log its decisions are read back from: 3 files of 10 MB.
#: A run follows the log while it runs (:mod:`orchestrator.docker.egress_log`), and each
#: client's decisions are logged within a budget (:data:`LOG_DENIED`), so no worker can
#: rotate another run's decisions (or its own) away before they are read.
PROXY_LOG_OPTIONS = {"max-size": "10m", "max-file": "3"}


@dataclass(frozen=True)
class HealthCheck:
    """A container health check; times in seconds."""

    test: tuple[str, ...]
    interval: float
    timeout: float
    retries: int
    start_period: float


#: The proxy's health check (CIS 5.27): squid must answer a request on loopback. A shared
#: proxy the engine reports ``unhealthy`` (3 failures 30 s apart) is replaced on its next
#: use.
PROXY_HEALTH = HealthCheck(
    test=("CMD", "/usr/local/bin/egress-proxy", "--health"),
    interval=30.0,
    timeout=5.0,
    retries=3,
    start_period=10.0,
)

# -- what it answers --------------------------------------------------------------------

#: Every decision is one line on stdout: the mark, then these fields, separated by spaces.
DECISION_MARK = "EGRESS"
DECISION_FIELDS = ("start", "method", "host", "port", "verdict", "status", "code", "client")
#: The verdict field of a request an allowlist entry admitted (``-`` otherwise).
ALLOWED = "allow"

#: Per client (a run's worker), the proxy logs at most this many denied (allowed)
#: decisions at once, refilled at that many per :data:`FLOOD_WINDOW` seconds; what goes
#: beyond is counted, and reported about once a second while it lasts as one line:
#: ``EGRESS-FLOOD <time> <client> <denied> <allowed> <bytes>``, then once with zero counts
#: when it has ended (nothing more to report). A line is cut at :data:`LINE_MAX` bytes.
LOG_DENIED = 100
LOG_ALLOWED = 1000
FLOOD_WINDOW = 60.0
FLOOD_MARK = "EGRESS-FLOOD"
LINE_MAX = 512
#: What a run keeps of its decisions one by one (in memory, the audit log and its result):
#: this many denied and :data:`RUN_ALLOWED` allowed; the rest are counted (a flood).
RUN_DENIED = 200
RUN_ALLOWED = 2000


@dataclass(frozen=True)
class Decision:
    """One request the proxy decided on.

    ``time`` is when the proxy received the request (aware, UTC); ``status`` is the HTTP
    status the proxy answered (403 for a denial, 200 for an opened tunnel, 0 when the
    client went away first); ``client`` is the address the request came from.
    """

    host: str
    port: int
    allowed: bool
    time: datetime
    method: str
    status: int = 0
    client: str = ""


def parse_decisions(text: str) -> list[Decision]:
    """Parse the proxy's decision lines (other lines are ignored).

    A line reads ``EGRESS <start> <method> <host> <port> <allow|-> <status> <squid code>
    <client>`` (older proxies omit the client); requests squid could not parse (no host)
    are reported with host ``-`` and port 0.
    """
    found: list[Decision] = []
    for line in text.splitlines():
        if not line.startswith(DECISION_MARK + " "):
            continue
        fields = line.split()
        if len(fields) < 7:
            continue
        _, start, method, host, port, verdict, status = fields[:7]
        try:
            moment = datetime.fromtimestamp(float(start), UTC)
        except (ValueError, OverflowError):
            continue
        found.append(
            Decision(
                host=host.lower(),
                port=int(port) if port.isdigit() else 0,
                allowed=verdict == ALLOWED,
                time=moment,
                method=method,
                status=int(status) if status.isdigit() else 0,
                client=fields[8] if len(fields) > 8 else "",
            )
        )
    return found


@dataclass(frozen=True)
class Flood:
    """Requests of one client the proxy counted instead of logging them (over its budget):
    ``denied`` and ``allowed`` requests, ``size`` bytes of log lines, reported at ``time``.
    All zero: the client's flood has ended, everything of it was reported."""

    client: str
    time: datetime
    denied: int
    allowed: int
    size: int

    @property
    def ended(self) -> bool:
        return not (self.denied or self.allowed)


def parse_floods(text: str) -> list[Flood]:
    """Parse the proxy's :data:`FLOOD_MARK` lines (other lines are ignored)."""
    found: list[Flood] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6 or fields[0] != FLOOD_MARK:
            continue
        _, moment, client, denied, allowed, size = fields
        if not (denied.isdigit() and allowed.isdigit() and size.isdigit()):
            continue
        try:
            when = datetime.fromtimestamp(float(moment), UTC)
        except (ValueError, OverflowError):
            continue
        found.append(Flood(client, when, int(denied), int(allowed), int(size)))
    return found
