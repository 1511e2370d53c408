"""The host firewall rule of docs/network.md for tests: look, take away, apply, put back.

Tests that change it are ``serial`` (they need the host to themselves), and put back
exactly what was there: each rule present or absent as before, exceptions ahead of the drop
rule. Nothing else in the chain is touched: rules are added and deleted one by one, by
their exact words, never by flushing a chain.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.doctor import firewall
from tests.integration.conftest import unavailable

#: The drop rule, either form, then the exceptions (which must end up ahead of it).
DROPS = (firewall.RULE, firewall.PLAIN_RULE)
EXCEPTIONS = (*firewall.ENGINE_DNS_RULES, *firewall.DNS_RULES)
ALL = (*DROPS, *EXCEPTIONS)


def iptables(action: str, rule: tuple[str, ...]) -> bool:
    done = subprocess.run(
        ["iptables", "-w", "10", action, *rule], capture_output=True, text=True, check=False
    )
    return done.returncode == 0


def present(rule: tuple[str, ...]) -> bool:
    return iptables("-C", rule)


def state() -> dict[tuple[str, ...], bool]:
    return {rule: present(rule) for rule in ALL}


def input_chain() -> str:
    """``iptables -S INPUT``: to count how often a rule is there."""
    return subprocess.run(
        ["iptables", "-w", "10", "-S", "INPUT"], capture_output=True, text=True, check=True
    ).stdout


def require_root() -> None:
    """Where the firewall cannot be changed: skipped, a failure under CI=true."""
    if os.geteuid() != 0:
        unavailable("the host firewall rule is checked and applied as root only")
    if subprocess.run(["iptables", "-V"], capture_output=True, check=False).returncode:
        unavailable("iptables is not installed")


def remove(rules: tuple[tuple[str, ...], ...] = ALL) -> None:
    """Delete every copy of ``rules`` (by their exact words)."""
    for rule in rules:
        while present(rule):
            assert iptables("-D", rule), rule


def restore(before: dict[tuple[str, ...], bool]) -> None:
    """Make each rule present or absent as in ``before``; exceptions inserted last (ahead)."""
    for rule, was_there in before.items():
        if not was_there:
            remove((rule,))
    missing = [rule for rule in ALL if before.get(rule) and not present(rule)]
    if any(rule in DROPS for rule in missing):
        # An exception must come back ahead of the drop rule: take it out and put it back.
        remove(tuple(rule for rule in EXCEPTIONS if before.get(rule)))
        missing = [rule for rule in ALL if before.get(rule) and not present(rule)]
    for rule in missing:
        assert iptables("-I", rule), rule
    assert state() == before


@contextmanager
def without_the_host_rule() -> Iterator[None]:
    """The drop rule and its exceptions taken away for the block; put back after."""
    require_root()
    before = state()
    remove()
    try:
        yield
    finally:
        restore(before)


@contextmanager
def with_the_host_rule() -> Iterator[list[str]]:
    """The rule applied as ``orchestrator doctor --fix`` does (yields its commands); after
    the block, the firewall as it was before."""
    require_root()
    before = state()
    try:
        yield firewall.apply_fix()
    finally:
        restore(before)
