"""E2B's network options mapped onto a worker's network: narrower or refused, never wider."""

from __future__ import annotations

import pytest

from orchestrator.e2b.network import ALL_TRAFFIC, NetworkRefused, narrowed

DECLARED = ["api.example.org:443", "api.example.org:80", "*.cdn.example.org:443"]


def only(*hosts: str) -> dict[str, object]:
    return {"network": {"denyOut": [ALL_TRAFFIC], "allowOut": list(hosts)}}


def test_nothing_asked_keeps_the_workers_network():
    for mode in ("none", "full", "allowlist"):
        assert narrowed({}, "w", mode, DECLARED) is None
    assert narrowed({"allow_internet_access": True}, "w", "full", []) is None


def test_no_internet_is_none_whatever_the_worker_has():
    for mode in ("none", "full", "allowlist"):
        assert narrowed({"allow_internet_access": False}, "w", mode, DECLARED) == "none"
    assert narrowed(only(), "w", "allowlist", DECLARED) == "none"


def test_an_allowlist_within_the_workers():
    assert narrowed(only("api.example.org"), "w", "allowlist", DECLARED) == [
        "api.example.org:80",
        "api.example.org:443",
    ]
    assert narrowed(only("x.cdn.example.org:443"), "w", "allowlist", DECLARED) == [
        "x.cdn.example.org:443"
    ]
    assert narrowed(only("*.a.cdn.example.org:443"), "w", "allowlist", DECLARED) == [
        "*.a.cdn.example.org:443"
    ]
    assert narrowed(only("anything.example.net"), "w", "full", []) == [
        "anything.example.net:80",
        "anything.example.net:443",
    ]


@pytest.mark.parametrize(
    ("body", "mode", "says"),
    [
        (
            only("other.example.org"),
            "allowlist",
            "other.example.org:80, other.example.org:443 not on",
        ),
        (only("x.cdn.example.org:80"), "allowlist", "x.cdn.example.org:80 not on"),
        (only("cdn.example.org:443"), "allowlist", "cdn.example.org:443 not on"),
        (only("api.example.org"), "none", "has network 'none'"),
        (only("10.0.0.0/8"), "full", "network.allow_out:"),
        ({"network": {"denyOut": ["1.1.1.1"]}}, "full", "only all traffic"),
        ({"network": {"allowOut": ["api.example.org"]}}, "full", "only all traffic"),
        ({"allow_internet_access": True}, "allowlist", "has network 'allowlist', not full"),
        ({"allow_internet_access": True}, "none", "has network 'none', not full"),
        ({"network": {"rules": {"a.org": []}}}, "full", "network.rules:"),
        ({"network": {"dnsServers": ["1.1.1.1"]}}, "full", "network.dnsServers:"),
        ({"network": "open"}, "full", "network: give an object"),
        ({"allow_internet_access": False, **only("a.org")}, "full", "give one of them"),
    ],
)
def test_refused_in_one_line(body, mode, says):
    with pytest.raises(NetworkRefused) as refused:
        narrowed(body, "w", mode, DECLARED)
    assert says in str(refused.value) and "\n" not in str(refused.value)
