#!/usr/bin/python3
"""Render squid's configuration from the allowlist in the environment, then run squid.

Environment:
  EGRESS_ALLOW    entries separated by spaces or commas: DOMAIN (ports 80 and 443),
                  DOMAIN:PORT, *.DOMAIN[:PORT] (subdomains only, not DOMAIN itself) or an
                  IPv4 address[:PORT]. Required and non-empty.
  EGRESS_PORT     the port squid listens on (default 3128).
  EGRESS_CLIENTS  IPv4 networks (CIDR) allowed to use the proxy, separated by spaces or
                  commas (default: any client).
  EGRESS_EXCLUDE  IPv4 networks (CIDR) never served, even inside EGRESS_CLIENTS: the
                  proxy's own way out and the local service networks it joins.
  EGRESS_REACH    IPv4 networks (CIDR) in private address space that listed names may
                  still reach: the outside network and the local service networks.
                  Every other private (RFC 1918), shared (100.64.0.0/10) or unique local
                  (fc00::/7) address is never a destination, whatever a name resolves
                  to: the proxy sits on every run's network and must not bridge them.

Every request is logged on stdout as one line:

  EGRESS <start time> <method> <host> <port> <allow|-> <status> <squid status> <client>

where the fifth field is ``allow`` when the allowlist admitted the request and ``-`` when
it was denied, and the last is the client's address. Squid's own messages go to stderr.

squid runs as this script's child and writes its decision lines into a pipe; the script
passes them on with a budget per client (a run's worker): a bucket of LOG_DENIED denied
and LOG_ALLOWED allowed decisions, refilled over FLOOD_WINDOW seconds. What exceeds it is
counted, not logged, and reported once a second while it lasts as one line

  EGRESS-FLOOD <time> <client> <denied> <allowed> <bytes>

(requests not logged one by one since the last such line, and the bytes their lines would
have taken), then one with zero counts once it has ended, so a flood of requests cannot
rotate other decisions out of the log. A line is cut at LINE_MAX bytes.
``--check`` renders the configuration, lets squid parse it and exits; ``--print`` prints
it; ``--health`` asks the running squid for an answer over loopback (not logged) and exits
0 when one comes, 1 otherwise (the container's health check).
"""

from __future__ import annotations

import ipaddress
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

CONFIG = "/tmp/squid.conf"
DEFAULT_PORTS = (80, 443)
LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
#: Never a destination, whatever a name resolves to: loopback, 'this host', link-local
#: (cloud metadata services live there), and unique local IPv6.
NEVER = ("127.0.0.0/8", "0.0.0.0/8", "169.254.0.0/16", "::1", "fe80::/10", "fc00::/7")
#: Private and shared address space, where the runs' networks live: never a destination
#: except the networks in EGRESS_REACH.
PRIVATE = ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16")


#: The log budget per client: a bucket of this many denied (allowed) decisions, refilled
#: at that many per FLOOD_WINDOW seconds; beyond it decisions are counted (FLOOD_MARK).
LOG_DENIED = 100
LOG_ALLOWED = 1000
FLOOD_WINDOW = 60.0
FLOOD_MARK = "EGRESS-FLOOD"
#: A decision line is cut here (squid logs host names of any length).
LINE_MAX = 512
LIMITS = {True: LOG_ALLOWED, False: LOG_DENIED}


def fail(message: str) -> None:
    print(f"egress-proxy: {message}", file=sys.stderr)
    sys.exit(2)


def split(text: str) -> list[str]:
    return [part for part in re.split(r"[\s,]+", text) if part]


def parse_entry(entry: str) -> tuple[str, tuple[int, ...]]:
    """One allowlist entry as (squid host pattern, ports); exits on anything invalid."""
    text = entry.strip().lower()
    host, sep, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if sep:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            fail(f"{entry!r}: the port must be a number from 1 to 65535")
        ports: tuple[int, ...] = (int(port_text),)
    else:
        ports = DEFAULT_PORTS
    host = host.removesuffix(".")
    if host.startswith("*."):
        domain = host[2:]
        wildcard = True
    else:
        domain = host
        wildcard = False
    labels = domain.split(".")
    if labels[-1].isdigit() and not wildcard:
        try:
            address = ipaddress.IPv4Address(domain)
        except ValueError:
            fail(f"{entry!r}: not a valid IPv4 address")
        if address.is_loopback or address.is_link_local or address.is_unspecified:
            fail(f"{entry!r}: loopback and link-local addresses are never reachable")
        return str(address), ports
    if len(labels) < 2 or not all(LABEL.match(label) for label in labels):
        fail(f"{entry!r}: not a fully qualified domain name")
    if len(domain) > 253:
        fail(f"{entry!r}: the name is longer than 253 characters")
    return ("." + domain if wildcard else domain), ports


def private_except(reach: list[str]) -> list[str]:
    """The private IPv4 ranges with the ``reach`` networks cut out of them."""
    blocked = [ipaddress.IPv4Network(network) for network in PRIVATE]
    for text in reach:
        keep = ipaddress.IPv4Network(text)
        rest: list[ipaddress.IPv4Network] = []
        for network in blocked:
            if keep.subnet_of(network):
                rest.extend(network.address_exclude(keep))
            elif not network.subnet_of(keep):
                rest.append(network)
        blocked = rest
    return [str(network) for network in ipaddress.collapse_addresses(blocked)]


def render(
    allow: list[str], port: int, clients: list[str], exclude: list[str], reach: list[str]
) -> str:
    rules: dict[str, set[int]] = {}
    for entry in allow:
        host, ports = parse_entry(entry)
        rules.setdefault(host, set()).update(ports)
    lines = [
        "# Rendered by egress-proxy from EGRESS_ALLOW; do not edit.",
        f"http_port {port}",
        "visible_hostname orchestrator-egress",
        "pid_filename none",
        "cache_log /dev/stderr",
        "logfile_rotate 0",
        "netdb_filename none",
        "pinger_enable off",
        "coredump_dir none",
        "cache deny all",
        "cache_mem 8 MB",
        "max_filedescriptors 4096",
        "shutdown_lifetime 1 seconds",
        "forwarded_for delete",
        "httpd_suppress_version_string on",
        "connect_timeout 15 seconds",
        "logformat egress EGRESS %tS %rm %>rd %>rP %{egress}note %>Hs %Ss %>a",
        # The health check's requests come over loopback and are not decisions.
        "acl egress_health src 127.0.0.1/32",
        "access_log stdio:/dev/stdout logformat=egress !egress_health",
        "acl egress_allow annotate_transaction egress=allow",
        "acl egress_http proto HTTP",
        # A dst ACL resolves a name and matches when any of its addresses is listed; it is
        # checked only once a host rule matched, so denied names are never looked up.
        f"acl egress_never dst {' '.join([*NEVER, *private_except(reach)])}",
        "http_access deny manager",
    ]
    lines.append("http_access deny egress_health")
    if exclude:
        lines.append(f"acl egress_excluded src {' '.join(exclude)}")
        lines.append("http_access deny egress_excluded")
    if clients:
        lines.append(f"acl egress_clients src {' '.join(clients)}")
        lines.append("http_access deny !egress_clients")
    for index, (host, ports) in enumerate(sorted(rules.items())):
        name = f"allow{index}"
        lines.append(f"acl {name}_host dstdomain -n {host}")
        lines.append(f"acl {name}_port port {' '.join(str(p) for p in sorted(ports))}")
        match = f"{name}_host"
        if host.startswith("."):
            # squid's ".example.org" also matches example.org itself; a wildcard does not.
            lines.append(f"acl {name}_apex dstdomain -n {host[1:]}")
            match += f" !{name}_apex"
        for kind in ("CONNECT", "egress_http"):
            lines.append(f"http_access allow {kind} {match} {name}_port !egress_never egress_allow")
    lines.append("http_access deny all")
    return "\n".join(lines) + "\n"


def networks(variable: str) -> list[str]:
    found = []
    for network in split(os.environ.get(variable, "")):
        try:
            found.append(str(ipaddress.IPv4Network(network, strict=False)))
        except ValueError:
            fail(f"{variable}: {network!r} is not an IPv4 network")
    return found


def health(port: int) -> int:
    """0 when squid answers a request on loopback within 3 s, else 1."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            sock.sendall(b"GET http://health.invalid/ HTTP/1.0\r\n\r\n")
            answer = sock.recv(12)
    except OSError as exc:
        print(f"egress-proxy: no answer on port {port}: {exc}", file=sys.stderr)
        return 1
    return 0 if answer.startswith(b"HTTP/") else 1


class Budget:
    """One client's log budget: buckets of decisions it may still log, and what it dropped."""

    def __init__(self, now: float) -> None:
        self.tokens = {verdict: float(limit) for verdict, limit in LIMITS.items()}
        self.seen = now
        self.dropped = {True: 0, False: 0}
        self.bytes = 0
        self.flooding = False

    def refill(self, now: float) -> bool:
        """Add what ``now - seen`` earns; True when both buckets are full."""
        elapsed = max(0.0, now - self.seen)
        self.seen = now
        for verdict, limit in LIMITS.items():
            self.tokens[verdict] = min(
                float(limit), self.tokens[verdict] + elapsed * limit / FLOOD_WINDOW
            )
        return all(self.tokens[v] >= limit for v, limit in LIMITS.items())

    def admit(self, allowed: bool, size: int, now: float) -> bool:
        self.refill(now)
        if self.tokens[allowed] >= 1.0:
            self.tokens[allowed] -= 1.0
            return True
        self.dropped[allowed] += 1
        self.bytes += size
        return False

    def report(self, client: str, now: float) -> str | None:
        """The FLOOD_MARK line for what was dropped since the last one; after the last
        line of a flood, one with zero counts (the flood has ended); None otherwise."""
        dropped = bool(self.dropped[True] or self.dropped[False])
        if not (dropped or self.flooding):
            return None
        self.flooding = dropped
        line = (
            f"{FLOOD_MARK} {now:.3f} {client} {self.dropped[False]} {self.dropped[True]} "
            f"{self.bytes}"
        )
        self.dropped = {True: 0, False: 0}
        self.bytes = 0
        return line


class Gate:
    """Decision lines in, the lines to log out: each client within its :class:`Budget`."""

    def __init__(self) -> None:
        self.budgets: dict[str, Budget] = {}

    def take(self, line: str, now: float) -> str | None:
        line = line.rstrip("\n")[:LINE_MAX]
        fields = line.split()
        if len(fields) < 9 or fields[0] != "EGRESS":
            return line or None
        client = fields[8]
        budget = self.budgets.setdefault(client, Budget(now))
        return line if budget.admit(fields[5] == "allow", len(line) + 1, now) else None

    def tick(self, now: float) -> list[str]:
        """The flood lines due now; clients whose buckets are full again are forgotten."""
        lines = []
        for client, budget in list(self.budgets.items()):
            line = budget.report(client, now)
            if line is not None:
                lines.append(line)
            elif budget.refill(now):  # quiet, its flood reported as ended
                del self.budgets[client]
        return lines


def relay(squid: subprocess.Popen[bytes]) -> int:
    """Pass squid's decision lines through a :class:`Gate` to stdout until squid ends."""
    assert squid.stdout is not None
    source = squid.stdout.fileno()
    gate = Gate()
    pending = b""
    last_tick = time.monotonic()
    out = sys.stdout
    while True:
        ready, _, _ = select.select([source], [], [], 1.0)
        chunk = os.read(source, 65536) if ready else b""
        if ready and not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        now = time.time()
        for raw in lines:
            line = gate.take(raw.decode(errors="replace"), now)
            if line is not None:
                out.write(line + "\n")
        if len(pending) > 65536:  # a line without an end: cut it
            pending = b""
        if time.monotonic() - last_tick >= 1.0:
            last_tick = time.monotonic()
            for line in gate.tick(now):
                out.write(line + "\n")
        out.flush()
    for line in gate.tick(time.time()):
        out.write(line + "\n")
    out.flush()
    return squid.wait()


def main() -> None:
    port_text = os.environ.get("EGRESS_PORT", "3128")
    if "--health" in sys.argv[1:]:
        sys.exit(health(int(port_text) if port_text.isdigit() else 3128))
    allow = split(os.environ.get("EGRESS_ALLOW", ""))
    if not allow:
        fail("EGRESS_ALLOW is empty: nothing would be reachable")
    if not port_text.isdigit() or not 1024 <= int(port_text) < 65536:
        fail("EGRESS_PORT must be a number from 1024 to 65535")
    clients = networks("EGRESS_CLIENTS")
    exclude = networks("EGRESS_EXCLUDE")
    reach = networks("EGRESS_REACH")
    config = render(allow, int(port_text), clients, exclude, reach)
    if "--print" in sys.argv[1:]:
        sys.stdout.write(config)
        return
    with open(CONFIG, "w") as handle:
        handle.write(config)
    if "--check" in sys.argv[1:]:
        sys.exit(subprocess.call(["squid", "-k", "parse", "-f", CONFIG]))
    summary = ", ".join(sorted(allow))
    print(f"egress-proxy: allowing {summary}", file=sys.stderr, flush=True)
    squid = subprocess.Popen(["squid", "-N", "-f", CONFIG], stdout=subprocess.PIPE)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, _frame: squid.send_signal(number))
    sys.exit(relay(squid))


if __name__ == "__main__":
    main()
