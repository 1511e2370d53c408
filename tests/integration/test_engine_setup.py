"""The engine set-up ``make demo`` and ``make test`` run (``scripts/ensure-engine.sh
--gvisor``), for real, as root: on a machine without the host firewall rule it installs the
rule and Podman's DNS exception ahead of it, and running it again adds nothing.

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
    assert "added the host firewall rule" in first.stderr
    assert "firewall" not in second.stderr and "added" not in second.stderr
    assert firewall.command("-I", firewall.RULE) in first.stderr  # the rule, word for word


def test_the_engine_set_up_adds_the_missing_exception_ahead_of_the_drop_rule(engine):
    with without_the_host_rule():
        assert subprocess.run(["iptables", "-w", "10", "-I", *firewall.RULE]).returncode == 0
        set_up()
        lines = input_chain().splitlines()
        assert all(map(present, firewall.ENGINE_DNS_RULES))
    assert lines.count(DROP) == 1
    assert max(lines.index(rule) for rule in EXCEPTIONS) < lines.index(DROP)
