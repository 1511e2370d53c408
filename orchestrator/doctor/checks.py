"""The doctor's verdicts: facts in, :class:`Check` rows out (pass, warn or fail).

Pure functions over facts read elsewhere (the engine's in
:mod:`orchestrator.docker.inspection`, the host's in :mod:`.host`, the firewall's in
:mod:`.firewall`), so each verdict is testable without an engine. A failure names its fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.config.models import human_size
from orchestrator.doctor import firewall

if TYPE_CHECKING:
    from orchestrator.docker.inspection import EngineFacts
    from orchestrator.doctor.host import DiskFree, EmbeddedUpstream

Status = Literal["pass", "warn", "fail"]

#: Below this much free space under the sandbox root, runs are likely to fail.
DISK_FAIL = 512 << 20
#: Below this much, say so before it matters.
DISK_WARN = 2 << 30


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, the verdict, what was seen, the fix."""

    name: str
    status: Status
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass
class Report:
    """Every check, the facts behind them, and what ``--fix`` did."""

    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if check.status == "fail"]

    @property
    def exit_code(self) -> int:
        """0 when nothing failed (warnings allowed), 1 otherwise."""
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(c.status == s for c in self.checks) for s in ("pass", "warn", "fail")}
        return {
            "ok": not self.failed,
            "exit_code": self.exit_code,
            "counts": counts,
            "checks": [check.to_dict() for check in self.checks],
            "facts": self.facts,
            "fixed": list(self.fixed),
        }


def engine_check(facts: EngineFacts) -> Check:
    detail = (
        f"Docker {facts.version} on {facts.os}, API {facts.api_version} "
        f"(the orchestrator uses {facts.client_api_version})"
    )
    if _version(facts.api_version) < _version(facts.client_api_version):
        return Check(
            "engine",
            "fail",
            detail,
            f"upgrade the engine to one speaking API {facts.client_api_version} "
            "(Docker 20.10 or later)",
        )
    return Check("engine", "pass", detail)


def runtimes_check(facts: EngineFacts, *, gvisor: Sequence[str], needed: bool, setup: str) -> Check:
    """The engine's runtimes; ``gvisor`` names the runtimes gVisor runs need, ``needed``
    says whether the project runs anything under gVisor, ``setup`` registers them."""
    names = ", ".join(
        f"{name}{' (default)' if name == facts.default_runtime else ''}"
        for name in sorted(facts.runtimes)
    )
    missing = [name for name in gvisor if name not in facts.runtimes]
    if not missing:
        path = facts.runtimes[gvisor[0]] if gvisor else "?"
        return Check("runtimes", "pass", f"{names}; gVisor: registered ({path})")
    others = [name for name in facts.gvisor_runtimes if name not in gvisor]
    also = (
        f" (a gVisor runtime is registered as {', '.join(others)}, not as these)" if others else ""
    )
    detail = f"{names}; gVisor: {', '.join(missing)} not registered{also}"
    fix = f"{setup} (Debian: apt-get install runsc first)"
    if needed:
        return Check("runtimes", "fail", detail + "; the project runs workers under gVisor", fix)
    return Check("runtimes", "pass", detail + " (this project runs nothing under gVisor)")


def build_runtimes_check(
    facts: EngineFacts, *, wanted: Mapping[str, Sequence[str]], needed: bool, setup: str
) -> Check:
    """The runtimes ``orchestrator build`` runs ``RUN`` steps under (``wanted``: name ->
    the arguments each needs, e.g. ``--overlay2=none`` so that a step's writes reach its
    layer); ``needed``: the project configures builds (a failure then, else a warning)."""
    problems = []
    for name, arguments in wanted.items():
        if name not in facts.runtimes:
            problems.append(f"{name} not registered")
            continue
        given = facts.runtime_args.get(name, [])
        lacking = [arg for arg in arguments if arg not in given]
        if lacking:
            problems.append(f"{name} runs without {' '.join(lacking)}")
    if not problems:
        shown = ", ".join(f"{name} ({' '.join(args)})" for name, args in wanted.items())
        return Check("build runtimes", "pass", f"registered: {shown}")
    detail = (
        f"{'; '.join(problems)}: `orchestrator build` (and task images built from a "
        "Dockerfile) cannot run a RUN step"
    )
    return Check("build runtimes", "fail" if needed else "warn", detail, setup)


def seccomp_check(facts: EngineFacts) -> Check:
    if facts.seccomp_profile is None:
        return Check(
            "seccomp",
            "fail",
            "the engine runs without seccomp: the orchestrator's profile cannot be applied",
            "use an engine built with seccomp support on a kernel with CONFIG_SECCOMP_FILTER",
        )
    return Check(
        "seccomp",
        "pass",
        f"supported (engine profile: {facts.seccomp_profile}); runs get the orchestrator's "
        "own profile",
    )


def cgroups_check(facts: EngineFacts, host_version: str | None) -> Check:
    enforced = [name for name, ok in facts.limits.items() if ok]
    missing = [name for name, ok in facts.limits.items() if not ok]
    host = f", host v{host_version}" if host_version and facts.local else ""
    detail = (
        f"cgroup v{facts.cgroup_version} ({facts.cgroup_driver} driver{host}); enforceable: "
        f"{', '.join(enforced) or 'none'}"
    )
    if missing:
        detail += f"; NOT enforceable: {', '.join(missing)}"
    hard = [name for name in missing if name != "swap"]
    if hard:
        return Check(
            "cgroups",
            "fail",
            detail,
            "enable the missing cgroup controllers (kernel command line, e.g. "
            "cgroup_enable=memory) and restart the engine",
        )
    if missing:
        return Check(
            "cgroups",
            "warn",
            detail + " (a worker may swap beyond its memory limit)",
            "boot with swapaccount=1 (cgroup v1) or use cgroup v2",
        )
    return Check("cgroups", "pass", detail)


def rootless_check(facts: EngineFacts) -> Check:
    if facts.rootless:
        return Check(
            "rootless",
            "pass",
            "rootless engine: containers cannot gain more than its user has",
        )
    return Check(
        "rootless",
        "pass",
        "rootful engine (workers still run as an unprivileged uid, every capability dropped)",
    )


def userns_check(facts: EngineFacts, max_namespaces: int | None) -> Check:
    remap = "on" if facts.userns_remap else "off"
    if max_namespaces is None:
        kernel = "unknown (/proc/sys/user/max_user_namespaces unreadable)"
    else:
        kernel = f"available (max {max_namespaces})" if max_namespaces else "disabled (max 0)"
    detail = f"kernel: {kernel}; engine userns-remap: {remap}"
    if max_namespaces == 0:
        return Check(
            "user namespaces",
            "warn",
            detail,
            "sysctl -w user.max_user_namespaces=15000 (rootless engines and gVisor need them)",
        )
    return Check("user namespaces", "pass", detail)


def disk_check(disk: DiskFree) -> Check:
    where = f"under {disk.path}" + (
        f" (measured at {disk.measured})" if disk.measured != disk.path else ""
    )
    detail = f"{human_size(disk.free)} free of {human_size(disk.total)} {where}"
    fix = "free space on that filesystem, or move sandbox.root in orchestrator.yaml"
    if disk.free < DISK_FAIL:
        return Check("disk", "fail", detail, fix)
    if disk.free < DISK_WARN:
        return Check("disk", "warn", detail, fix)
    return Check("disk", "pass", detail)


def images_check(present: Mapping[str, bool], built_here: set[str]) -> Check:
    missing = [image for image, ok in present.items() if not ok]
    if not missing:
        return Check("images", "pass", ", ".join(present) + " present")
    ours = [image for image in missing if image in built_here]
    theirs = [image for image in missing if image not in built_here]
    fixes = (["orchestrator images build"] if ours else []) + [
        f"build or `docker load` {image} (no registry is consulted)" for image in theirs
    ]
    return Check("images", "fail", f"missing: {', '.join(missing)}", "; ".join(fixes))


def firewall_checks(
    state: firewall.FirewallState, facts: EngineFacts, *, podman: bool = False
) -> list[Check]:
    """The INPUT rule, the engine's DNS exception (Podman's), and the DNS exception when
    the host runs Docker's resolver."""
    fix = f"orchestrator doctor --fix (as root), or: {firewall.command('-I', firewall.RULE)}"
    if facts.rootless:
        return [
            Check(
                "firewall",
                "pass",
                "not applicable: a rootless engine's bridges live in its own network "
                "namespace, not the host's",
            )
        ]
    if not facts.local:
        return [Check("firewall", "warn", "cannot check: the engine runs on another machine", fix)]
    if not state.checked:
        return [
            Check(
                "firewall",
                "warn",
                f"cannot check: {state.reason}",
                "run `orchestrator doctor` as root" if state.reason == "not root" else fix,
            )
        ]
    if state.rule or state.plain_rule:
        form = "" if state.rule else " (the plain form: it also drops replies to the host)"
        rows = [
            Check(
                "firewall",
                "pass",
                f"INPUT drops connections from the egress bridges ({firewall.BRIDGES}) to "
                f"the host{form}",
            )
        ]
    else:
        rows = [
            Check(
                "firewall",
                "fail",
                f"missing: allowlisted workers can reach services on the host's addresses "
                f"(no INPUT rule for {firewall.BRIDGES})",
                fix,
            )
        ]
    rows.append(_engine_dns_check(state, podman=podman))
    if state.resolvers:
        resolvers = ", ".join(state.resolvers)
        if state.dns_rules:
            rows.append(
                Check(
                    "firewall dns",
                    "pass",
                    f"the proxies may query the host's resolver {resolvers} (port 53 accepted "
                    f"on {firewall.OUTSIDE_BRIDGE})",
                )
            )
        else:
            rows.append(
                Check(
                    "firewall dns",
                    "fail" if state.protected else "warn",
                    f"the host runs Docker's resolver ({resolvers}): with the rule, the "
                    f"proxies' name lookups need port 53 accepted on {firewall.OUTSIDE_BRIDGE}",
                    "orchestrator doctor --fix (as root), or: "
                    + "; ".join(firewall.command("-I", rule) for rule in firewall.DNS_RULES),
                )
            )
    return rows


def _engine_dns_check(state: firewall.FirewallState, *, podman: bool) -> Check:
    """Podman's DNS on its outside bridge's address, let through ahead of the drop rule."""
    name = "firewall engine dns"
    what = f"port 53 on {firewall.PODMAN_BRIDGE}'s own address (Podman's aardvark-dns)"
    if state.engine_dns:
        return Check(name, "pass", f"accepted: {what}")
    if not state.protected:
        return Check(name, "pass", f"not needed while the rule is missing: {what}")
    fix = "orchestrator doctor --fix (as root), or: " + "; ".join(
        firewall.command("-I", rule) for rule in firewall.ENGINE_DNS_RULES
    )
    if any(firewall.command("-I", rule) in state.behind for rule in firewall.ENGINE_DNS_RULES):
        dropped = f"dropped: {what}: the exception is listed after the drop rule"
        fix = "orchestrator doctor --fix (as root): it puts the exception back ahead"
    else:
        dropped = f"dropped: {what}"
    if podman:
        return Check(
            name,
            "fail",
            f"{dropped}; the proxies cannot resolve names (allowed hosts get 502)",
            fix,
        )
    return Check(
        name,
        "warn",
        f"{dropped}; Docker does not need it, Podman's proxies on this host would",
        fix,
    )


#: CVE-2024-29018 (GHSA-mq39-4gv4-mvpx): dockerd forwards DNS queries from containers on
#: internal networks through the host's namespace when the upstream resolver is a loopback
#: address. Fixed in these releases; 24.0 (end of life) never was.
DNS_CVE = "CVE-2024-29018"
DNS_CVE_FIXED = ((23, 0, 11), (25, 0, 5), (26, 0, 0))


def dns_cve_affected(version: str) -> bool:
    """Whether a Docker Engine version lacks the fix for :data:`DNS_CVE` (by its number:
    a distribution's backported patch is not seen)."""
    got = _version(version.split("+")[0].split("-")[0])[:3]
    if got >= max(DNS_CVE_FIXED):
        return False
    return not any(got[0] == fixed[0] and got >= fixed for fixed in DNS_CVE_FIXED)


def dns_cve_check(facts: EngineFacts, upstream: EmbeddedUpstream, *, podman: bool) -> Check:
    """The engine's version against :data:`DNS_CVE`, with the host resolver set-up that
    exposes it (a loopback upstream other than systemd-resolved's stub alone)."""
    name = "engine dns"
    fixed = ", ".join(".".join(map(str, v)) for v in sorted(DNS_CVE_FIXED, reverse=True))
    if podman:
        return Check(name, "pass", f"not applicable: {DNS_CVE} is Docker Engine's (Podman)")
    if not dns_cve_affected(facts.version):
        return Check(name, "pass", f"Docker {facts.version} has the fix for {DNS_CVE}")
    affected = f"Docker {facts.version} is affected by {DNS_CVE} (fixed in {fixed})"
    if not facts.local:
        return Check(
            name,
            "warn",
            f"{affected}; the engine runs on another machine: its resolvers are not seen",
            f"upgrade Docker to {fixed} or later",
        )
    if not upstream.loopback:
        servers = ", ".join(upstream.servers) or "none"
        return Check(
            name,
            "pass",
            f"{affected}, but not exposed here: {upstream.source} names no loopback resolver "
            f"({servers})",
        )
    return Check(
        name,
        "warn",
        f"{affected} and exposed: {upstream.source} names the loopback resolver "
        f"{', '.join(upstream.loopback)}, which the engine queries from the host's namespace "
        "for containers on internal networks too (a DNS way out around any allowlist). "
        "This orchestrator's workers get no resolver (dns 0.0.0.0) and never use it; other "
        "containers on internal networks do",
        f"upgrade Docker to {fixed} or later, or point the host (or daemon.json `dns`) at a "
        "resolver that is not a loopback address (systemd-resolved's stub alone is fine)",
    )


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
