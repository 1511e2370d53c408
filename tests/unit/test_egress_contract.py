"""The egress proxy's contract (orchestrator.egress): its environment and its decision log."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator import egress as contract
from orchestrator.config.allowlist import validate_allowlist


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
