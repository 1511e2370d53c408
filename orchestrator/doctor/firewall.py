"""The host firewall rule that keeps allowlisted workers away from the host's own services.

On Docker 20.10 an internal bridge still has the host's address as its gateway, so a worker
on a run's own network (and the proxy on the outside network) can open connections to
anything listening on the host. One rule in the INPUT chain closes that for every egress
bridge (their host interfaces are all named ``oeg-...``)::

    iptables -I INPUT -i oeg-+ -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP

It drops what the bridges *start* towards the host; replies to connections the host opens
to its containers still pass (the plain ``-i oeg-+ -j DROP`` drops those too, which breaks,
for example, a host-side health probe of a worker; it is accepted as present, being
stricter). Traffic between a worker and its proxy is bridged and never sees INPUT.

Two kinds of exception go ahead of it, each no wider than what it lets through:

- :data:`ENGINE_DNS_RULES`: Podman's DNS server (aardvark-dns) answers the containers of its
  proxies' outside bridge (``oeg-podman``) on that bridge's own address, in the host's
  namespace; without them every allowlisted request on Podman fails (502: the proxy cannot
  resolve the name). Port 53 (UDP and TCP) on the address of the bridge the query came in
  on, from that bridge only: not another host address, not a run's bridge, not another
  port. Docker needs nothing there (its DNS answers inside each container's namespace).
- :data:`DNS_RULES`: when the host itself runs the resolver Docker forwards names to, the
  proxy's queries to it (on ``oeg-outside``).

An exception behind the drop rule would never match: :func:`apply_fix` keeps them ahead
(``scripts/ensure-engine.sh`` does the same, in shell).

Checking needs root (``iptables -C``), so does :func:`apply_fix`. Nothing here runs when
the caller is not root: the answer is then "cannot check". The rule is not persistent
across reboots; see docs/network.md.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache

from orchestrator.doctor.host import docker_nameservers, host_resolvers, is_root

#: Matches the host side of every egress bridge (orchestrator.docker.egress.BRIDGE_PREFIX).
BRIDGES = "oeg-+"
#: The outside bridge, where the proxies' own DNS queries come from (OUTSIDE_BRIDGE).
OUTSIDE_BRIDGE = "oeg-outside"
#: Podman's outside bridge (orchestrator.docker.podman.PODMAN_OUTSIDE_BRIDGE): its
#: aardvark-dns answers there, on the bridge's own address.
PODMAN_BRIDGE = "oeg-podman"

RULE: tuple[str, ...] = (
    "INPUT", "-i", BRIDGES, "-m", "conntrack", "!", "--ctstate", "ESTABLISHED,RELATED",
    "-j", "DROP",
)  # fmt: skip
#: The stricter form docs/network.md gave first: it protects the host just as well.
PLAIN_RULE: tuple[str, ...] = ("INPUT", "-i", BRIDGES, "-j", "DROP")
DNS_RULES: tuple[tuple[str, ...], ...] = tuple(
    ("INPUT", "-i", OUTSIDE_BRIDGE, "-p", proto, "--dport", "53", "-j", "ACCEPT")
    for proto in ("udp", "tcp")
)
#: The engine's own DNS on its bridge's address (``--limit-iface-in``: an address of the
#: interface the packet came in on, i.e. the gateway its containers see). Always applied.
ENGINE_DNS_RULES: tuple[tuple[str, ...], ...] = tuple(
    (
        "INPUT", "-i", PODMAN_BRIDGE, "-p", proto, "--dport", "53",
        "-m", "addrtype", "--dst-type", "LOCAL", "--limit-iface-in", "-j", "ACCEPT",
    )
    for proto in ("udp", "tcp")
)  # fmt: skip
_TIMEOUT = 20.0


class FirewallError(Exception):
    """iptables could not be run or refused a rule (the message names the command)."""


@dataclass(frozen=True)
class FirewallState:
    """What :func:`firewall_state` found; ``checked`` False means nothing was looked at."""

    checked: bool
    reason: str = ""
    """Why it could not be checked (not root, no iptables, iptables failed)."""
    rule: bool = False
    plain_rule: bool = False
    resolvers: list[str] = field(default_factory=list)
    """The host's own addresses that Docker forwards names to: they need DNS_RULES."""
    dns_rules: bool = True
    """Every DNS exception is present (True when none is needed)."""
    engine_dns: bool = False
    """Both :data:`ENGINE_DNS_RULES` are present, ahead of the drop rule when it is there."""
    behind: list[str] = field(default_factory=list)
    """Exceptions listed after the drop rule (as ``iptables -I`` commands): they never
    match. Put there by whatever inserted the drop rule at the top after them."""

    @property
    def protected(self) -> bool:
        return self.rule or self.plain_rule


def command(action: str, rule: tuple[str, ...]) -> str:
    """The shell command for ``action`` (``-I``, ``-C``, ``-D``) on ``rule``."""
    return " ".join(["iptables", action, *(f"'{w}'" if w == "!" else w for w in rule)])


def firewall_state() -> FirewallState:
    """Look the rules up (``iptables -C``); never raises."""
    if not is_root():
        return FirewallState(checked=False, reason="not root")
    try:
        rule = _present(RULE)
        plain = not rule and _present(PLAIN_RULE)
        resolvers = host_resolvers(docker_nameservers())
        behind = _behind([*ENGINE_DNS_RULES, *DNS_RULES]) if rule or plain else []
        dns = all(_present(r) and r not in behind for r in DNS_RULES) if resolvers else True
        engine_dns = all(_present(r) and r not in behind for r in ENGINE_DNS_RULES)
    except FirewallError as exc:
        return FirewallState(checked=False, reason=str(exc))
    return FirewallState(
        checked=True,
        rule=rule,
        plain_rule=plain,
        resolvers=resolvers,
        dns_rules=dns,
        engine_dns=engine_dns,
        behind=[command("-I", r) for r in behind],
    )


def apply_fix() -> list[str]:
    """Add what is missing, the exceptions ahead of the drop rule; return the commands run.

    Idempotent (``-C`` before every ``-I``): a rule already there (the drop rule in either
    form) is left alone, and nothing is ever added twice. ``-I`` inserts at the top, so an
    exception must be inserted after the drop rule to end up ahead of it: when the drop rule
    is missing, the exceptions already there are taken out first and put back after it, and
    so is an exception found behind the drop rule (where it never matches: something
    inserted the drop rule after it). Raises FirewallError when not root or when iptables
    refuses.
    """
    if not is_root():
        raise FirewallError(f"not root: run it as root, or yourself: {command('-I', RULE)}")
    exceptions = [*ENGINE_DNS_RULES]
    if host_resolvers(docker_nameservers()):
        exceptions += DNS_RULES
    done: list[str] = []
    protected = _present(RULE) or _present(PLAIN_RULE)
    for rule in _behind(exceptions) if protected else exceptions:
        while _present(rule):  # put back below, ahead of the drop rule
            _iptables("-D", rule)
            done.append(command("-D", rule))
    if not protected:
        _iptables("-I", RULE)
        done.append(command("-I", RULE))
    for rule in reversed(exceptions):  # each -I goes first: they end up in the listed order
        if not _present(rule):
            _iptables("-I", rule)
            done.append(command("-I", rule))
    missing_rule_warning.cache_clear()
    return done


@cache
def missing_rule_warning() -> str | None:
    """One line for ``run`` while the rule is missing; None when present or not checkable
    (not root). Costs one or two ``iptables -C`` once per process."""
    state = firewall_state()
    if not state.checked or state.protected:
        return None
    return (
        "warning: allowlisted workers can reach services on this host: the firewall rule "
        "is missing; apply it with `orchestrator doctor --fix` (docs/network.md, Limits)"
    )


def _behind(exceptions: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The ``exceptions`` listed after the first drop rule (either form) with no copy ahead
    of it (``iptables -S INPUT``): they never match."""
    listed = _iptables("-S", ("INPUT",)).stdout.splitlines()
    lines = [line.split()[1:] for line in listed if line.startswith("-A ")]
    drop = next(
        (i for i, line in enumerate(lines) if _lists(RULE, line) or _lists(PLAIN_RULE, line)),
        len(lines),
    )
    return [
        rule
        for rule in exceptions
        if any(_lists(rule, line) for line in lines[drop + 1 :])
        and not any(_lists(rule, line) for line in lines[:drop])
    ]


def _lists(rule: tuple[str, ...], line: list[str]) -> bool:
    """Whether ``line`` (the words of an ``iptables -S`` line after ``-A``) is ``rule``:
    its words in order, with what iptables adds when listing between them (``-m udp``
    after ``-p udp``), comma lists in any order (``RELATED,ESTABLISHED``)."""

    def words(given: Iterable[str]) -> list[str]:
        return [",".join(sorted(w.split(","))) if "," in w else w for w in given]

    listed = iter(words(line))
    return all(word in listed for word in words(rule))


def _present(rule: tuple[str, ...]) -> bool:
    done = _iptables("-C", rule, check=False)
    if done.returncode == 0:
        return True
    if done.returncode == 1:  # "Bad rule (does a matching rule exist in that chain?)"
        return False
    raise FirewallError(_failure("-C", rule, done))


def _iptables(
    action: str, rule: tuple[str, ...], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            ["iptables", "-w", "10", action, *rule],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise FirewallError("iptables is not installed (apt-get install iptables)") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FirewallError(f"{command(action, rule)}: {exc}") from None
    if check and done.returncode != 0:
        raise FirewallError(_failure(action, rule, done))
    return done


def _failure(action: str, rule: tuple[str, ...], done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line and not line.startswith("# Warning")]
    return f"{command(action, rule)} failed ({done.returncode}): {' '.join(lines) or 'no output'}"
