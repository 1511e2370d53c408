"""The egress self-test's verdicts: what the probe saw in a worker, judged claim by claim.

Pure: the probe's results (:mod:`.probe`), the run's decisions and the audit log's come in,
:class:`~orchestrator.doctor.checks.Check` rows go out (named by claim; the self-test adds
the mode and isolation). A claim the probe did not report on fails: silence is no pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.docker.testservers import HTTP_PORT, UDP_PORT
from orchestrator.doctor.checks import Check
from orchestrator.doctor.firewall import RULE, command

#: Only resolved, and resolving it must fail: a worker has no way to outside names.
OUTSIDE_NAME = "example.org"
ALLOWED, REFUSED = "allowed", "refused"


@dataclass(frozen=True)
class Targets:
    """The self-test's servers as a worker sees them: names on ``network``, one address."""

    network: str
    allowed_ip: str

    def host(self, alias: str) -> str:
        return f"{alias}.{self.network}"

    def url(self, alias: str) -> str:
        return f"http://{self.host(alias)}:{HTTP_PORT}/"


class Seen(dict[str, Any]):
    """The probe's results; a job that reported nothing reads as ``["missing"]``."""

    def __missing__(self, key: str) -> list[Any]:
        return ["missing"]


def judge_none(seen: Seen, targets: Targets) -> list[Check]:
    """Loopback only, no route, and TCP, UDP and DNS all fail."""
    allowed = targets.allowed_ip
    interfaces = listed(seen["interfaces"])
    routes = listed(seen["routes"])
    return [
        row("loopback only", interfaces == ["lo"], f"interfaces: {', '.join(interfaces)}"),
        row("no route", not routes, "no route" if not routes else f"routes: {'; '.join(routes)}"),
        row(
            "TCP fails",
            seen["tcp"][0] == "failed",
            f"TCP to {allowed}:{HTTP_PORT}: {said(seen['tcp'])}",
        ),
        row(
            "UDP fails",
            seen["udp"][0] == "failed",
            f"UDP to {allowed}:{UDP_PORT}: {said(seen['udp'])}",
        ),
        row(
            "DNS fails",
            seen["dns"][0] == "failed",
            f"{OUTSIDE_NAME}: {said(seen['dns'])}",
        ),
    ]


def judge_allowlist(
    seen: Seen,
    targets: Targets,
    *,
    egress: Iterable[dict[str, Any]],
    audited: Iterable[tuple[str, Any, bool]],
    accepted: list[str],
) -> list[Check]:
    """The allowed name answers through the proxy, everything else fails, the host's
    listener got no connection (``accepted`` lists who it accepted), and each decision
    is in the run's result (``egress``) and the audit log (``audited``)."""
    allowed_ip = targets.allowed_ip
    tried: dict[str, list[Any]] = seen["host"][1] if seen["host"][:1] == ["ok"] else {}
    reached = [address for address, outcome in tried.items() if outcome[:1] == ["connected"]]
    if reached:
        host_detail = (
            f"a listener on the host was reached at {', '.join(reached)} (from "
            f"{', '.join(accepted) or '?'})"
        )
    elif tried:
        outcomes = "; ".join(f"{a}: {said(o)}" for a, o in tried.items())
        host_detail = f"a listener on the host is unreachable ({outcomes})"
    else:
        host_detail = f"no address of the host to try ({said(seen['host'])})"
    wanted = {
        (targets.host(ALLOWED), HTTP_PORT, True),
        (targets.host(REFUSED), HTTP_PORT, False),
        (allowed_ip, HTTP_PORT, False),
    }
    logged = {(d["host"], d["port"], d["allowed"]) for d in egress}
    missing = [f"run result {w}" for w in sorted(wanted - logged)]
    missing += [f"audit log {w}" for w in sorted(wanted - set(audited))]
    return [
        row(
            "allowed name",
            seen["allowed"][:2] == ["ok", 200],
            f"{targets.url(ALLOWED)} through the proxy: {said(seen['allowed'])}",
        ),
        row(
            "other name refused",
            seen["refused"][:2] == ["http-error", 403],
            f"{targets.url(REFUSED)} through the proxy: {said(seen['refused'])}",
        ),
        row(
            "direct IP fails",
            seen["direct"][0] == "failed" and seen["ip_literal"][:2] == ["http-error", 403],
            f"TCP to {allowed_ip}:{HTTP_PORT}: {said(seen['direct'])}; through the proxy: "
            f"{said(seen['ip_literal'])}",
        ),
        row(
            "outside DNS fails",
            seen["dns"][0] == "failed",
            f"{OUTSIDE_NAME}: {said(seen['dns'])}",
        ),
        row(
            "UDP/QUIC fails",
            seen["udp"][0] == "failed",
            f"UDP to {allowed_ip}:{UDP_PORT}: {said(seen['udp'])}",
        ),
        row(
            "host services unreachable",
            not reached and not accepted and seen["host"][:1] == ["ok"],
            host_detail,
            f"orchestrator doctor --fix (as root), or: {command('-I', RULE)}",
        ),
        row(
            "decisions logged",
            not missing,
            f"{len(logged)} decisions in the run's result and the audit log"
            if not missing
            else f"not logged: {'; '.join(missing)}",
        ),
    ]


def listed(result: list[Any]) -> list[str]:
    """The list an ``ok`` result carries; a failed job's words otherwise."""
    if result[:1] == ["ok"] and isinstance(result[1], list):
        return [str(item) for item in result[1]]
    return [said(result)]


def row(name: str, ok: bool, detail: str, fix: str | None = None) -> Check:
    return Check(name, "pass" if ok else "fail", detail, None if ok else fix)


def said(result: list[Any]) -> str:
    """A probe result in words: ``failed (ConnectionRefusedError)``, ``ok 200``, ..."""
    if not result:
        return "nothing"
    word, *rest = result
    details = [str(r).strip() for r in rest if str(r).strip() and r != 0]
    return f"{word} ({', '.join(details)})" if details else str(word)
