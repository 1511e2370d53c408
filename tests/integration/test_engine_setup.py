"""The engine set-up ``make demo`` and ``make test`` run (``scripts/ensure-engine.sh
--gvisor``, which runs ``orchestrator engine setup --gvisor --firewall``), for real, as
root: on a machine without the host firewall rule it installs the rule and Podman's DNS
exception ahead of it, running it again adds nothing, and an exception found behind the
drop rule is moved ahead of it.

``serial``: it changes the host firewall, which it takes away first and puts back as it
found it at the end (``tests/host_firewall.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.doctor import firewall
from tests.host_firewall import input_chain, present, without_the_host_rule

pytestmark = [pytest.mark.docker, pytest.mark.serial]  # the host firewall: alone

SCRIPT = Path(__file__).parents[2] / "scripts" / "ensure-engine.sh"
DROP = "-A INPUT -i oeg-+ -m conntrack ! --ctstate RELATED,ESTABLISHED -j DROP"
EXCEPTIONS = [
    f"-A INPUT -i oeg-podman -p {proto} -m {proto} --dport 53 -m addrtype --dst-type LOCAL "
    "--limit-iface-in -j ACCEPT"
    for proto in ("udp", "tcp")
]


def set_up() -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--gvisor", sys.executable],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_the_engine_set_up_run_twice_installs_the_host_rule_once(engine):
    with without_the_host_rule():
        assert "-i oeg-" not in input_chain()
        first = set_up()
        second = set_up()
        lines = input_chain().splitlines()
    assert lines.count(DROP) == 1, lines
    assert [lines.count(rule) for rule in EXCEPTIONS] == [1, 1], lines
    assert sum("-i oeg-" in line for line in lines) == 3, lines
    # The exceptions ahead of the drop rule, where they can match.
    assert max(lines.index(rule) for rule in EXCEPTIONS) < lines.index(DROP)
    said = f"host firewall rule: {firewall.command('-I', firewall.RULE)}"
    assert said in first.stderr  # the rule, word for word
    assert "host firewall rule: already in place" in second.stderr
    assert "iptables -I" not in second.stderr and "iptables -D" not in second.stderr


def insert(rule: tuple[str, ...]) -> None:
    assert subprocess.run(["iptables", "-w", "10", "-I", *rule], check=False).returncode == 0


def test_the_engine_set_up_adds_the_missing_exception_ahead_of_the_drop_rule(engine):
    with without_the_host_rule():
        insert(firewall.RULE)
        set_up()
        lines = input_chain().splitlines()
        assert all(map(present, firewall.ENGINE_DNS_RULES))
    assert lines.count(DROP) == 1
    assert max(lines.index(rule) for rule in EXCEPTIONS) < lines.index(DROP)


def test_the_engine_set_up_moves_exceptions_found_behind_the_drop_rule_ahead(engine):
    """As an older ``doctor --fix`` left them: it inserted the drop rule at the top, after
    the exceptions (which then never matched: Podman's proxies got 502)."""
    with without_the_host_rule():
        for rule in firewall.ENGINE_DNS_RULES:
            insert(rule)
        insert(firewall.RULE)
        before = input_chain().splitlines()
        assert min(before.index(rule) for rule in EXCEPTIONS) > before.index(DROP)
        set_up()
        lines = input_chain().splitlines()
    assert lines.count(DROP) == 1
    assert [lines.count(rule) for rule in EXCEPTIONS] == [1, 1], lines
    assert max(lines.index(rule) for rule in EXCEPTIONS) < lines.index(DROP)
