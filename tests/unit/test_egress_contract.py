"""The egress proxy's contract (orchestrator.egress): its environment and its decision log,
and the proxy image (images/proxy) agreeing with it."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator import egress as contract
from orchestrator.config.allowlist import DEFAULT_PORTS, validate_allowlist


def test_decision_lines_are_parsed():
    text = (
        "egress-proxy: allowing allowed.test:80\n"
        "EGRESS 1700000000.250 GET allowed.test 80 allow 200 TCP_MISS\n"
        "EGRESS 1700000001.000 CONNECT Denied.Test 443 - 403 TCP_DENIED\n"
        "EGRESS 1700000002.000 NONE - - - 400 NONE_NONE\n"
        "EGRESS 1700000003.000 GET allowed.test 80 allow 200 TCP_MISS 172.30.0.2\n"
        "EGRESS garbage\n"
        "EGRESSED 1700000004.000 GET allowed.test 80 allow 200 TCP_MISS 172.30.0.2\n"
    )
    got = contract.parse_decisions(text)
    assert [(d.host, d.port, d.allowed, d.method, d.status, d.client) for d in got] == [
        ("allowed.test", 80, True, "GET", 200, ""),
        ("denied.test", 443, False, "CONNECT", 403, ""),
        ("-", 0, False, "NONE", 400, ""),
        ("allowed.test", 80, True, "GET", 200, "172.30.0.2"),
    ]
    assert got[0].time == datetime.fromtimestamp(1700000000.25, UTC)


def test_the_proxy_environment_carries_the_normalised_allowlist():
    allow = validate_allowlist(["b.example.org:8443", "A.example.org", "*.c.example.org"])
    env = contract.proxy_environment(allow, ["172.20.0.0/16", "192.168.5.0/24"])
    assert env == {
        "EGRESS_ALLOW": (
            "*.c.example.org:80 *.c.example.org:443 a.example.org:80 a.example.org:443 "
            "b.example.org:8443"
        ),
        "EGRESS_PORT": "3128",
        "EGRESS_EXCLUDE": "172.20.0.0/16 192.168.5.0/24",
        "EGRESS_REACH": "172.20.0.0/16 192.168.5.0/24",
    }
    assert contract.network_env() == {
        **dict.fromkeys(
            ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), contract.PROXY_URL
        ),
        "NO_PROXY": "localhost,127.0.0.1",
        "no_proxy": "localhost,127.0.0.1",
    }


# -- the proxy image agrees with the contract ---------------------------------------------
#
# images/proxy/entry.py runs inside the proxy container and cannot import the package, and
# the package does not import it: these tests load the script and its Dockerfile as files.

PROXY_DIR = Path(__file__).resolve().parents[2] / "images" / "proxy"
#: What each of squid's logformat codes in the entry's ``egress`` format stands for.
SQUID_CODES = {
    "%tS": "start",
    "%rm": "method",
    "%>rd": "host",
    "%>rP": "port",
    "%{egress}note": "verdict",
    "%>Hs": "status",
    "%Ss": "code",
    "%>a": "client",
}
#: Read by the image but never set by the orchestrator (clients of a proxy started by hand).
IMAGE_ONLY_ENV = {"EGRESS_CLIENTS"}


@pytest.fixture(scope="module")
def entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("egress_proxy_entry", PROXY_DIR / "entry.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(entry: ModuleType, env: dict[str, str], monkeypatch, capsys) -> str:
    """What the entry renders (``--print``) from ``env``."""
    for name in list(os.environ):
        if name.startswith("EGRESS_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["egress-proxy", "--print"])
    entry.main()
    return capsys.readouterr().out


def test_the_entry_reads_exactly_the_environment_the_contract_sets(entry):
    source = (PROXY_DIR / "entry.py").read_text()
    read = {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"EGRESS_[A-Z]+", node.value)
    }
    declared = {contract.ENV_ALLOW, contract.ENV_PORT, contract.ENV_EXCLUDE, contract.ENV_REACH}
    allow = validate_allowlist(["a.example.org"])
    assert set(contract.proxy_environment(allow, [])) == declared
    assert read == declared | IMAGE_ONLY_ENV
    # The image's defaults are the contract's.
    assert entry.DEFAULT_PORTS == DEFAULT_PORTS
    assert f'os.environ.get("{contract.ENV_PORT}", "{contract.PROXY_PORT}")' in source


def test_the_entry_accepts_what_the_contract_renders(entry, monkeypatch, capsys):
    allow = validate_allowlist(["a.example.org", "*.b.example.org:8443", "192.0.2.10:8080"])
    private = ["172.20.0.0/16", "192.168.5.0/24"]
    config = rendered(entry, contract.proxy_environment(allow, private), monkeypatch, capsys)
    lines = config.splitlines()
    assert f"http_port {contract.PROXY_PORT}" in lines
    assert f"acl egress_excluded src {' '.join(private)}" in lines
    never = next(line for line in lines if line.startswith("acl egress_never dst "))
    assert "192.168.0.0/16" not in never and "192.168.4.0/24" in never  # the reach cut out
    hosts = [line.split()[-1] for line in lines if re.match(r"acl allow\d+_host ", line)]
    assert hosts == [".b.example.org", "192.0.2.10", "a.example.org"]


def test_the_entry_logs_the_decision_line_the_contract_parses(entry, monkeypatch, capsys):
    allow = validate_allowlist(["a.example.org"])
    config = rendered(entry, contract.proxy_environment(allow, []), monkeypatch, capsys)
    [logformat] = [line for line in config.splitlines() if line.startswith("logformat egress ")]
    mark, *codes = logformat.split()[2:]
    assert mark == contract.DECISION_MARK
    assert tuple(SQUID_CODES[code] for code in codes) == contract.DECISION_FIELDS
    # The verdict is the annotation of the allowing rule, and "-" (squid's empty) otherwise.
    assert f"acl egress_allow annotate_transaction egress={contract.ALLOWED}" in config
    sample = {
        "start": "1700000000.5",
        "method": "CONNECT",
        "host": "a.example.org",
        "port": "443",
        "verdict": contract.ALLOWED,
        "status": "200",
        "code": "TCP_TUNNEL",
        "client": "172.30.0.2",
    }
    line = " ".join([mark, *(sample[SQUID_CODES[code]] for code in codes)])
    [decision] = contract.parse_decisions(line)
    assert decision == contract.Decision(
        host="a.example.org",
        port=443,
        allowed=True,
        time=datetime.fromtimestamp(1700000000.5, UTC),
        method="CONNECT",
        status=200,
        client="172.30.0.2",
    )


def test_the_image_installs_the_health_check_and_port_of_the_contract():
    dockerfile = (PROXY_DIR / "Dockerfile").read_text()
    command = contract.PROXY_HEALTH.test
    assert command[0] == "CMD"
    assert f"COPY entry.py {command[1]}\n" in dockerfile
    assert f"ENTRYPOINT {json.dumps([command[1]])}" in dockerfile
    assert f"CMD {json.dumps(list(command[1:]))}" in dockerfile
    health = contract.PROXY_HEALTH
    timings = (
        f"HEALTHCHECK --interval={health.interval:g}s --timeout={health.timeout:g}s "
        f"--start-period={health.start_period:g}s --retries={health.retries}"
    )
    assert timings in dockerfile
    assert f"ENV {contract.ENV_PORT}={contract.PROXY_PORT} " in dockerfile
    assert f"EXPOSE {contract.PROXY_PORT}\n" in dockerfile
    source = (PROXY_DIR / "entry.py").read_text()
    assert f'"{command[2]}" in sys.argv[1:]' in source


# -- the proxy's log budget -----------------------------------------------------------------


def test_the_entry_keeps_the_log_budget_of_the_contract(entry):
    assert entry.LOG_DENIED == contract.LOG_DENIED
    assert entry.LOG_ALLOWED == contract.LOG_ALLOWED
    assert entry.FLOOD_WINDOW == contract.FLOOD_WINDOW
    assert entry.FLOOD_MARK == contract.FLOOD_MARK
    assert entry.LINE_MAX == contract.LINE_MAX


def test_a_flood_of_denials_is_logged_within_the_budget_and_counted(entry):
    """One allowed request, then 100,000 denied ones with 255-character names in 15 s:
    the allowed one and the first denials are logged, the rest counted in flood lines the
    contract parses; another client keeps its own budget."""
    gate = entry.Gate()
    start = 1_700_000_000.0

    def line(when, host, verdict, client="172.30.0.2"):
        return f"EGRESS {when:.3f} GET {host} 80 {verdict} 403 TCP_DENIED {client}"

    logged = [gate.take(line(start, "allowed.test", contract.ALLOWED), start)]
    floods = []
    long_name = "a" * 245 + ".evil.test"
    for n in range(100_000):
        now = start + n * 15 / 100_000
        logged.append(gate.take(line(now, long_name, "-"), now))
        if n % 7000 == 0:
            floods += gate.tick(now)
    logged.append(gate.take(line(start + 15, "other.test", "-", "172.31.0.2"), start + 15))
    floods += gate.tick(start + 16)
    kept = [text for text in logged if text is not None]
    decisions = contract.parse_decisions("\n".join(kept))
    assert decisions[0].host == "allowed.test" and decisions[0].allowed
    assert decisions[-1].host == "other.test"  # another client is not held back
    denied = [d for d in decisions if d.client == "172.30.0.2" and not d.allowed]
    # The bucket, and what it refilled over 15 s.
    assert contract.LOG_DENIED <= len(denied) <= contract.LOG_DENIED * (1 + 16 / 60)
    assert all(len(text) <= contract.LINE_MAX for text in kept)
    counted = contract.parse_floods("\n".join(floods))
    assert {f.client for f in counted} == {"172.30.0.2"}
    assert sum(f.denied for f in counted) == 100_000 - len(denied)
    assert sum(f.allowed for f in counted) == 0
    assert sum(f.size for f in counted) > 250 * (100_000 - len(denied))
    assert len(floods) <= 17  # about one a second while it lasts
    [end] = contract.parse_floods("\n".join(gate.tick(start + 17)))
    assert end.ended and end.client == "172.30.0.2"  # then once: it has ended
    assert gate.tick(start + 200) == [] and not gate.budgets  # quiet clients are forgotten


def test_flood_lines_are_parsed():
    text = (
        "EGRESS-FLOOD 1700000000.500 172.30.0.2 99877 3 30961870\n"
        "EGRESS-FLOOD 1700000001.000 172.30.0.2 x 3 1\n"
        "EGRESS 1700000003.000 GET allowed.test 80 allow 200 TCP_MISS 172.30.0.2\n"
    )
    [flood] = contract.parse_floods(text)
    assert flood == contract.Flood(
        "172.30.0.2", datetime.fromtimestamp(1700000000.5, UTC), 99877, 3, 30961870
    )
    assert len(contract.parse_decisions(text)) == 1  # flood lines are not decisions
