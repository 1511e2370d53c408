"""``orchestrator doctor`` without an engine: verdicts over facts, host facts from files,
the firewall through a stand-in ``iptables``, the in-worker probe, and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.docker.egress import BRIDGE_PREFIX, OUTSIDE_BRIDGE
from orchestrator.docker.inspection import EngineFacts
from orchestrator.docker.podman import PODMAN_OUTSIDE_BRIDGE
from orchestrator.doctor import checks, firewall, host, probe, verdicts
from orchestrator.doctor.checks import Check, Report


def facts(**changes) -> EngineFacts:
    base = {
        "version": "20.10.24",
        "api_version": "1.41",
        "min_api_version": "1.12",
        "client_api_version": "1.41",
        "os": "Debian",
        "kernel": "6.1",
        "runtimes": {"runc": "runc"},
        "default_runtime": "runc",
        "seccomp_profile": "default",
        "rootless": False,
        "userns_remap": False,
        "cgroup_version": "2",
        "cgroup_driver": "systemd",
        "limits": {"memory": True, "swap": True, "cpu": True, "pids": True},
        "docker_root": "/var/lib/docker",
        "storage_driver": "overlay2",
    }
    return EngineFacts(**{**base, **changes})


GVISOR = ("orchestrator-runsc", "orchestrator-runsc-net")


# -- verdicts -----------------------------------------------------------------------------


def test_an_engine_older_than_the_api_the_orchestrator_uses_fails():
    assert checks.engine_check(facts()).status == "pass"
    old = checks.engine_check(facts(api_version="1.40"))
    assert old.status == "fail" and "1.41" in (old.fix or "")


def test_gvisor_missing_fails_only_when_the_project_uses_it():
    runtimes = {"runc": "runc", "runsc": "/usr/bin/runsc"}
    needed = checks.runtimes_check(
        facts(runtimes=runtimes), gvisor=GVISOR, needed=True, setup="orchestrator engine setup"
    )
    assert needed.status == "fail"
    assert "orchestrator engine setup" in (needed.fix or "")
    assert "registered as runsc" in needed.detail  # someone else's gVisor runtime is named
    spare = checks.runtimes_check(facts(), gvisor=GVISOR, needed=False, setup="x")
    assert spare.status == "pass" and "runs nothing under gVisor" in spare.detail
    present = {"runc": "runc", **dict.fromkeys(GVISOR, "/usr/bin/runsc")}
    ok = checks.runtimes_check(facts(runtimes=present), gvisor=GVISOR, needed=True, setup="x")
    assert ok.status == "pass" and "/usr/bin/runsc" in ok.detail


def test_seccomp_cgroups_userns_and_rootless_verdicts():
    assert checks.seccomp_check(facts(seccomp_profile=None)).status == "fail"
    no_swap = checks.cgroups_check(facts(limits={"memory": True, "swap": False, "cpu": True,
                                                 "pids": True}), "2")  # fmt: skip
    assert no_swap.status == "warn" and "NOT enforceable: swap" in no_swap.detail
    no_pids = checks.cgroups_check(
        facts(limits={"memory": True, "swap": True, "cpu": True, "pids": False}), "2"
    )
    assert no_pids.status == "fail"
    assert checks.cgroups_check(facts(), "2").detail.startswith("cgroup v2 (systemd driver")
    assert checks.userns_check(facts(), 0).status == "warn"
    assert "max 15000" in checks.userns_check(facts(), 15000).detail
    assert "rootless" in checks.rootless_check(facts(rootless=True)).detail


def test_disk_thresholds(tmp_path: Path):
    def disk(free: int) -> host.DiskFree:
        return host.DiskFree(path=tmp_path / "x", measured=tmp_path, free=free, total=10 << 30)

    assert checks.disk_check(disk(100 << 20)).status == "fail"
    assert checks.disk_check(disk(1 << 30)).status == "warn"
    good = checks.disk_check(disk(5 << 30))
    assert good.status == "pass" and f"measured at {tmp_path}" in good.detail


def test_missing_images_name_the_way_to_get_them():
    row = checks.images_check(
        {"orchestrator/worker:latest": False, "mine:1": False, "orchestrator/proxy:latest": True},
        {"orchestrator/worker:latest", "orchestrator/proxy:latest"},
    )
    assert row.status == "fail"
    assert "orchestrator images build" in (row.fix or "") and "docker load` mine:1" in row.fix


def test_firewall_verdicts():
    rule = firewall.FirewallState(checked=True, rule=True, engine_dns=True)
    assert [c.status for c in checks.firewall_checks(rule, facts())] == ["pass", "pass"]
    missing = checks.firewall_checks(firewall.FirewallState(checked=True), facts())
    assert missing[0].status == "fail" and "doctor --fix" in (missing[0].fix or "")
    assert missing[1].status == "pass" and "not needed" in missing[1].detail
    plain = checks.firewall_checks(
        firewall.FirewallState(checked=True, plain_rule=True, engine_dns=True), facts()
    )
    assert plain[0].status == "pass" and "plain form" in plain[0].detail
    # The drop rule without Podman's DNS exception: Podman's proxies resolve nothing.
    no_engine_dns = firewall.FirewallState(checked=True, rule=True)
    for podman, status in ((True, "fail"), (False, "warn")):
        row = checks.firewall_checks(no_engine_dns, facts(), podman=podman)[1]
        assert (row.name, row.status) == ("firewall engine dns", status)
        assert "--limit-iface-in" in (row.fix or "") and "oeg-podman" in row.detail
    not_root = checks.firewall_checks(firewall.FirewallState(False, "not root"), facts())
    assert not_root[0].status == "warn" and "cannot check: not root" in not_root[0].detail
    assert checks.firewall_checks(rule, facts(rootless=True))[0].detail.startswith("not applicable")
    assert checks.firewall_checks(rule, facts(local=False))[0].status == "warn"
    dns = firewall.FirewallState(
        checked=True, rule=True, resolvers=["10.0.0.2"], dns_rules=False, engine_dns=True
    )
    rows = checks.firewall_checks(dns, facts())
    assert [r.status for r in rows] == ["pass", "pass", "fail"]
    assert "--dport 53" in (rows[2].fix or "")


def test_the_report_exits_1_only_on_a_failure():
    report = Report(checks=[Check("a", "pass", ""), Check("b", "warn", "")])
    assert report.exit_code == 0
    report.checks.append(Check("c", "fail", "", "do this"))
    data = report.to_dict()
    assert (report.exit_code, data["ok"], data["counts"]) == (
        1,
        False,
        {"pass": 1, "warn": 1, "fail": 1},
    )
    assert data["checks"][2] == {"name": "c", "status": "fail", "detail": "", "fix": "do this"}


# -- host facts ---------------------------------------------------------------------------


def test_cgroup_version_and_controllers(tmp_path: Path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    assert host.cgroup_version(tmp_path) == "2"
    assert host.cgroup_controllers(tmp_path) == ["cpu", "memory", "pids"]
    v1 = tmp_path / "v1"
    for name in ("memory", "pids", "unified"):
        (v1 / name).mkdir(parents=True)
    assert (host.cgroup_version(v1), host.cgroup_controllers(v1)) == ("1", ["memory", "pids"])


def test_user_namespace_limit(tmp_path: Path):
    (tmp_path / "max").write_text("15000\n")
    assert host.max_user_namespaces(tmp_path / "max") == 15000
    assert host.max_user_namespaces(tmp_path / "absent") is None


def test_disk_free_of_a_folder_not_made_yet(tmp_path: Path):
    disk = host.disk_free(tmp_path / "a" / "b")
    assert disk.measured == tmp_path and disk.free > 0


def test_the_resolvers_docker_uses(tmp_path: Path):
    resolv = tmp_path / "resolv.conf"
    systemd = tmp_path / "systemd.conf"
    daemon = tmp_path / "daemon.json"
    resolv.write_text("# c\nnameserver 127.0.0.53\noptions edns0\n")
    systemd.write_text("nameserver 10.1.2.3\nnameserver ::1\n")
    assert host.docker_nameservers(daemon, resolv, systemd) == ["10.1.2.3"]
    resolv.write_text("nameserver 192.0.2.53\nnameserver 127.0.0.1\n")
    assert host.docker_nameservers(daemon, resolv, systemd) == ["192.0.2.53"]
    daemon.write_text(json.dumps({"dns": ["198.51.100.1"]}))
    assert host.docker_nameservers(daemon, resolv, systemd) == ["198.51.100.1"]


def test_local_addresses_are_told_apart():
    assert host.is_local_address("127.0.0.1")
    assert not host.is_local_address("198.51.100.77")  # TEST-NET-2: nobody's
    assert not host.is_local_address("not an address")
    assert host.host_resolvers(["127.0.0.1", "198.51.100.77"]) == ["127.0.0.1"]


# -- the firewall, through a stand-in iptables --------------------------------------------

FAKE_IPTABLES = r"""#!/usr/bin/env python3
import json, os, sys
state = os.environ["FAKE_IPTABLES_STATE"]
rules = json.load(open(state)) if os.path.exists(state) else []
args = sys.argv[1:]
if args[:1] == ["-w"]:
    args = args[2:]
action, rule = args[0], args[1:]
with open(state + ".log", "a") as log:
    log.write(" ".join(args) + "\n")
if action == "-C":
    sys.exit(0 if rule in rules else 1)
if action == "-S":
    print("-P INPUT ACCEPT")
    print("\n".join("-A " + " ".join(r) for r in rules if r[0] == rule[0]))
    sys.exit(0)
if action == "-I":
    rules.insert(0, rule)
if action == "-D":
    if rule not in rules:
        sys.exit(1)
    rules.remove(rule)  # the first copy, as iptables does
json.dump(rules, open(state, "w"))
"""


@pytest.fixture
def iptables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``iptables`` first on PATH, keeping its rules in a JSON file; root pretended."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "iptables"
    script.write_text(FAKE_IPTABLES.replace("/usr/bin/env python3", sys.executable))
    script.chmod(0o755)
    state = tmp_path / "rules.json"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_IPTABLES_STATE", str(state))
    monkeypatch.setattr(firewall, "is_root", lambda: True)
    monkeypatch.setattr(firewall, "docker_nameservers", lambda: [])
    firewall.missing_rule_warning.cache_clear()
    yield state
    firewall.missing_rule_warning.cache_clear()


def rules(state: Path) -> list[list[str]]:
    return json.loads(state.read_text()) if state.exists() else []


#: What a fresh machine gets: Podman's DNS exceptions (udp, tcp), then the drop rule.
APPLIED = [*map(list, firewall.ENGINE_DNS_RULES), list(firewall.RULE)]


def test_fix_adds_the_rule_and_the_engine_dns_exception_once(iptables: Path):
    before = firewall.firewall_state()
    assert before.checked and not before.protected and not before.engine_dns
    assert firewall.missing_rule_warning() is not None
    done = firewall.apply_fix()
    assert done == [
        firewall.command("-I", rule) for rule in (firewall.RULE, *firewall.ENGINE_DNS_RULES[::-1])
    ]
    assert rules(iptables) == APPLIED  # the exceptions ahead of the drop rule
    state = firewall.firewall_state()
    assert state.rule and state.engine_dns
    assert firewall.missing_rule_warning() is None  # the cache was dropped by the fix
    assert firewall.apply_fix() == []  # idempotent: -C finds them
    assert rules(iptables) == APPLIED


def test_the_engine_dns_exception_is_exactly_port_53_on_podman_s_bridge_address():
    assert firewall.PODMAN_BRIDGE == PODMAN_OUTSIDE_BRIDGE
    assert firewall.BRIDGES == BRIDGE_PREFIX + "+" and firewall.OUTSIDE_BRIDGE == OUTSIDE_BRIDGE
    for proto, rule in zip(("udp", "tcp"), firewall.ENGINE_DNS_RULES, strict=True):
        assert firewall.command("-I", rule) == (
            f"iptables -I INPUT -i oeg-podman -p {proto} --dport 53 -m addrtype "
            "--dst-type LOCAL --limit-iface-in -j ACCEPT"
        )


def test_exceptions_already_there_are_moved_ahead_of_a_new_drop_rule(iptables: Path):
    # As left by someone who took the drop rule away: an exception behind a new drop rule
    # would never match.
    iptables.write_text(json.dumps([["INPUT", "-j", "OTHER"], list(firewall.ENGINE_DNS_RULES[1])]))
    done = firewall.apply_fix()
    assert done[0] == firewall.command("-D", firewall.ENGINE_DNS_RULES[1])
    assert rules(iptables) == [*APPLIED, ["INPUT", "-j", "OTHER"]]


def test_a_missing_exception_is_added_ahead_of_the_drop_rule_already_there(iptables: Path):
    udp, tcp = map(list, firewall.ENGINE_DNS_RULES)
    iptables.write_text(json.dumps([udp, list(firewall.RULE)]))
    done = firewall.apply_fix()
    assert done == [firewall.command("-I", firewall.ENGINE_DNS_RULES[1])]
    assert rules(iptables) == [tcp, udp, list(firewall.RULE)]  # udp left where it was


def test_the_plain_rule_counts_as_present(iptables: Path):
    iptables.write_text(json.dumps([list(firewall.PLAIN_RULE)]))
    state = firewall.firewall_state()
    assert state.plain_rule and not state.rule and state.protected
    assert firewall.apply_fix() == [
        firewall.command("-I", rule) for rule in firewall.ENGINE_DNS_RULES[::-1]
    ]
    assert firewall.apply_fix() == []


def test_the_dns_exception_goes_ahead_of_the_drop(iptables: Path, monkeypatch):
    monkeypatch.setattr(firewall, "docker_nameservers", lambda: ["127.0.0.1"])
    assert firewall.firewall_state().resolvers == ["127.0.0.1"]
    done = firewall.apply_fix()
    assert len(done) == 5
    assert rules(iptables) == [
        *map(list, firewall.ENGINE_DNS_RULES),
        *map(list, firewall.DNS_RULES),
        list(firewall.RULE),
    ]
    assert firewall.firewall_state().dns_rules


def test_an_exception_behind_the_drop_rule_is_seen_and_moved_ahead(iptables: Path):
    # As an older `doctor --fix` leaves it when it inserts the drop rule after them.
    iptables.write_text(json.dumps([list(firewall.RULE), *map(list, firewall.ENGINE_DNS_RULES)]))
    state = firewall.firewall_state()
    assert state.protected and not state.engine_dns
    assert state.behind == [firewall.command("-I", r) for r in firewall.ENGINE_DNS_RULES]
    row = checks.firewall_checks(state, facts(), podman=True)[1]
    assert row.status == "fail" and "listed after the drop rule" in row.detail
    done = firewall.apply_fix()
    assert done == [
        *(firewall.command("-D", r) for r in firewall.ENGINE_DNS_RULES),
        *(firewall.command("-I", r) for r in firewall.ENGINE_DNS_RULES[::-1]),
    ]
    assert rules(iptables) == APPLIED
    assert firewall.firewall_state().engine_dns and firewall.apply_fix() == []


def test_rules_are_found_in_iptables_own_listing():
    """``iptables -S`` adds ``-m udp`` and lists ctstates its own way."""
    listed = {
        "drop": "-i oeg-+ -m conntrack ! --ctstate RELATED,ESTABLISHED -j DROP",
        "udp": "-i oeg-podman -p udp -m udp --dport 53 -m addrtype --dst-type LOCAL "
        "--limit-iface-in -j ACCEPT",
        "wider": "-i oeg-podman -p udp -m udp --dport 53 -j ACCEPT",
    }
    words = {key: ["INPUT", *line.split()] for key, line in listed.items()}
    assert firewall._lists(firewall.RULE, words["drop"])
    assert firewall._lists(firewall.PLAIN_RULE, words["drop"])  # a drop either way
    assert firewall._lists(firewall.ENGINE_DNS_RULES[0], words["udp"])
    assert not firewall._lists(firewall.ENGINE_DNS_RULES[1], words["udp"])  # tcp
    assert not firewall._lists(firewall.ENGINE_DNS_RULES[0], words["wider"])


def test_engine_setup_firewall_applies_it_once_through_the_command_line(iptables: Path):
    from orchestrator.cli.engine import engine

    first = CliRunner().invoke(engine, ["setup", "--firewall", "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["firewall"][0] == firewall.command("-I", firewall.RULE)
    again = CliRunner().invoke(engine, ["setup", "--firewall"])
    assert again.exit_code == 0 and "already in place" in again.stderr
    assert rules(iptables) == APPLIED


def test_not_root_checks_nothing_and_warns_nothing(monkeypatch):
    monkeypatch.setattr(firewall, "is_root", lambda: False)
    firewall.missing_rule_warning.cache_clear()
    try:
        assert firewall.firewall_state() == firewall.FirewallState(False, "not root")
        assert firewall.missing_rule_warning() is None
        with pytest.raises(firewall.FirewallError, match="not root"):
            firewall.apply_fix()
    finally:
        firewall.missing_rule_warning.cache_clear()


def test_an_iptables_error_is_reported_not_raised(iptables: Path, tmp_path: Path):
    (tmp_path / "bin" / "iptables").write_text("#!/bin/sh\necho 'no chain' >&2\nexit 2\n")
    state = firewall.firewall_state()
    assert not state.checked and "failed (2): no chain" in state.reason


def test_the_bridge_names_match_the_egress_adapter():
    from orchestrator.docker import egress

    assert firewall.BRIDGES == egress.BRIDGE_PREFIX + "+"
    assert firewall.OUTSIDE_BRIDGE == egress.OUTSIDE_BRIDGE
    assert firewall.command("-C", firewall.RULE).startswith("iptables -C INPUT -i oeg-+ ")
    assert "'!' --ctstate ESTABLISHED,RELATED" in firewall.command("-I", firewall.RULE)


# -- the probe and its verdicts -----------------------------------------------------------


def test_route_addresses_are_read_in_network_order():
    assert probe._address("000012AC") == 0xAC120000  # 172.18.0.0 as the kernel prints it
    assert probe._address("010012AC") == 0xAC120001


def test_the_probe_runs_jobs_one_by_one_where_threads_cannot_start(monkeypatch, capsys):
    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(probe, "results", {})
    monkeypatch.setattr(threading.Thread, "start", refuse)
    probe.main([["resolve", "bad", "no such name.invalid"], ["interfaces", "ifs"]])
    seen = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert seen["bad"][0] == "failed" and seen["ifs"][0] == "ok" and "lo" in seen["ifs"][1]


def test_a_job_that_raises_is_a_result(monkeypatch):
    monkeypatch.setattr(probe, "results", {})
    probe._guarded("connect", "x", "127.0.0.1", "not a port")
    assert probe.results["x"][0] == "error"


TARGETS = verdicts.Targets(network="doctor-t", allowed_ip="10.9.0.2")


def test_the_none_verdicts():
    good = verdicts.Seen(
        interfaces=["ok", ["lo"]],
        routes=["ok", []],
        tcp=["failed", "ENETUNREACH"],
        udp=["failed", "ENETUNREACH"],
        dns=["failed", "gaierror: x"],
    )
    assert [c.status for c in verdicts.judge_none(good, TARGETS)] == ["pass"] * 5
    bad = verdicts.Seen(interfaces=["ok", ["eth0", "lo"]], routes=["ok", ["eth0 0 0"]])
    rows = {c.name: c.status for c in verdicts.judge_none(bad, TARGETS)}
    assert rows["loopback only"] == rows["no route"] == "fail"
    assert rows["TCP fails"] == "fail"  # the probe never said: that is not a pass


def test_the_allowlist_verdicts():
    decided = [
        ("allowed.doctor-t", 8080, True),
        ("refused.doctor-t", 8080, False),
        ("10.9.0.2", 8080, False),
    ]
    egress = [{"host": h, "port": p, "allowed": a} for h, p, a in decided]
    seen = verdicts.Seen(
        allowed=["ok", 200, "doctor test server allowed\n"],
        refused=["http-error", 403, ""],
        direct=["failed", "TimeoutError"],
        ip_literal=["http-error", 403, ""],
        dns=["failed", "gaierror: x"],
        udp=["failed", "TimeoutError"],
        host=["ok", {"10.8.0.1": ["failed", "TimeoutError"]}],
    )
    rows = verdicts.judge_allowlist(seen, TARGETS, egress=egress, audited=decided, accepted=[])
    assert {c.name: c.status for c in rows} == dict.fromkeys([c.name for c in rows], "pass")
    assert len(rows) == 7

    seen["host"] = ["ok", {"10.8.0.1": ["connected"]}]
    seen["ip_literal"] = ["ok", 200, "doctor test server allowed"]
    rows = verdicts.judge_allowlist(
        seen, TARGETS, egress=egress[:1], audited=decided, accepted=["10.8.0.3"]
    )
    by_name = {c.name: c for c in rows}
    host_row = by_name["host services unreachable"]
    assert host_row.status == "fail" and "doctor --fix" in (host_row.fix or "")
    assert "from 10.8.0.3" in host_row.detail
    assert by_name["direct IP fails"].status == "fail"
    assert by_name["decisions logged"].status == "fail"
    assert "run result ('refused.doctor-t', 8080, False)" in by_name["decisions logged"].detail


def test_a_host_connection_seen_only_by_the_listener_still_fails():
    seen = verdicts.Seen(host=["ok", {"10.8.0.1": ["failed", "TimeoutError"]}])
    rows = verdicts.judge_allowlist(seen, TARGETS, egress=[], audited=[], accepted=["10.8.0.3"])
    assert {c.name: c for c in rows}["host services unreachable"].status == "fail"


# -- the command line ---------------------------------------------------------------------


def _report() -> Report:
    return Report(
        checks=[
            Check("engine", "pass", "Docker 20.10"),
            Check("firewall", "fail", "missing", "orchestrator doctor --fix"),
        ],
        facts={"engine": {"version": "20.10"}},
    )


def test_the_table_names_the_fix_and_exits_1(monkeypatch):
    from orchestrator.cli.doctor import doctor

    monkeypatch.setattr("orchestrator.doctor.diagnose", lambda *_a, **_k: _report())
    done = CliRunner().invoke(doctor, ["--no-egress"])
    assert done.exit_code == 1
    lines = done.output.splitlines()
    assert lines[0].split()[:2] == ["ok", "engine"]
    assert lines[1].split()[:3] == ["FAIL", "firewall", "missing"]
    assert lines[2].split() == ["fix:", "orchestrator", "doctor", "--fix"]
    assert lines[-1] == "1 passed, 0 warnings, 1 failed"


def test_json_is_one_object(monkeypatch):
    from orchestrator.cli.doctor import doctor

    monkeypatch.setattr("orchestrator.doctor.diagnose", lambda *_a, **_k: _report())
    done = CliRunner().invoke(doctor, ["--json"])
    assert done.exit_code == 1
    data = json.loads(done.output)
    assert data["exit_code"] == 1 and data["checks"][1]["fix"] == "orchestrator doctor --fix"


def test_no_engine_is_exit_125_through_the_console_entry_point(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"},
        check=False,
    )
    assert done.returncode == 125, done.stderr
    assert "Docker engine unreachable" in done.stderr
    assert json.loads(done.stdout)["exit_code"] == 125


# -- the engine's facts -------------------------------------------------------------------


class _Api:
    base_url = "http+docker://localhost"

    def version(self):
        return {"Version": "20.10.24", "ApiVersion": "1.41", "MinAPIVersion": "1.12"}

    def info(self):
        return {
            "Runtimes": {"runc": {"path": "runc"}, "gv": {"path": "/usr/bin/runsc"}},
            "DefaultRuntime": "runc",
            "SecurityOptions": ["name=seccomp,profile=builtin", "name=rootless", "name=userns"],
            "CgroupVersion": "2",
            "CgroupDriver": "systemd",
            "MemoryLimit": True,
            "SwapLimit": False,
            "CpuCfsQuota": True,
            "CpuCfsPeriod": True,
            "PidsLimit": True,
            "Warnings": ["WARNING: No swap limit support"],
        }


def test_engine_facts_are_named_in_our_terms(monkeypatch):
    from orchestrator.docker import inspection

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    got = inspection.engine_facts(type("Client", (), {"api": _Api()})())
    assert (got.version, got.api_version, got.seccomp_profile) == ("20.10.24", "1.41", "builtin")
    assert got.rootless and got.userns_remap and got.local
    assert got.limits == {"memory": True, "swap": False, "cpu": True, "pids": True}
    assert got.gvisor_runtimes == ["gv"]  # found by the binary it runs, whatever its name
    assert got.to_dict()["warnings"] == ["WARNING: No swap limit support"]
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.9:2376")
    assert not inspection.engine_facts(type("Client", (), {"api": _Api()})()).local


# -- everyday tools -----------------------------------------------------------------------


def test_the_everyday_probe_passes_on_this_host_and_reports_every_operation(tmp_path: Path):
    from orchestrator.doctor import everyday

    data, out = tmp_path / "data", tmp_path / "out"
    for rel, text in everyday.FILES.items():
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text(text)
    out.mkdir()
    rows = everyday.main({"data": str(data), "out": str(out), "git": ["git"]})
    assert [row[0] for row in rows] == list(everyday.OPERATIONS)
    assert {row[1] for row in rows} <= {"ok", "skipped: no git in the image"}, rows
    assert (out / "tree" / "sub" / "deep" / "file.bin").read_text() == everyday.FILES[
        "sub/deep/file.bin"
    ]


def test_a_failing_tool_names_the_operation_the_runsc_version_and_the_fix():
    from orchestrator.doctor import tools

    rows = [
        ["ls -l", "failed: exit 2: ls: cannot access '/data': Invalid argument", ""],
        ["stat", "failed: exit 1: stat: cannot statx '/data/notes.txt': Invalid argument", ""],
        ["sort", "ok", "apple\n"],
        ["git status", "skipped: no git in the image", ""],
    ]
    stdout = "noise\n" + json.dumps(rows) + "\n"
    check = tools.judge(tools.parse(stdout), "runsc version 0.0~20221219.0")
    assert check.status == "fail"
    assert "ls -l (exit 2: ls: cannot access '/data': Invalid argument)" in check.detail
    assert "stat (" in check.detail and "0.0~20221219.0" in check.detail
    assert "worked: sort" in check.detail and "skipped: git status" in check.detail
    assert check.fix and "engine setup --gvisor" in check.fix and "0.0~20240729" in check.fix
    passed = tools.judge([["sort", "ok", ""]], "runsc version 0.0~20240729.0")
    assert passed.status == "pass" and "0.0~20240729.0" in passed.detail
    silent = tools.judge(tools.parse("Traceback ...\n"), "runsc version X", "boom")
    assert silent.status == "fail" and "did not report" in silent.detail and "boom" in silent.detail


def test_the_engine_dns_forwarding_cve_is_judged_by_version_and_resolver(tmp_path: Path):
    """CVE-2024-29018: affected versions, and the host set-up that exposes them."""
    for version in ("20.10.24+dfsg1", "23.0.10", "24.0.9", "25.0.4"):
        assert checks.dns_cve_affected(version), version
    for version in ("23.0.11", "25.0.5", "26.0.0", "27.3.1"):
        assert not checks.dns_cve_affected(version), version
    resolv = tmp_path / "resolv.conf"
    systemd = tmp_path / "systemd.conf"
    daemon = tmp_path / "daemon.json"
    systemd.write_text("nameserver 10.1.2.3\n")
    resolv.write_text("nameserver 127.0.0.53\n")  # the stub alone: Docker asks systemd's list
    stub = host.embedded_upstream(daemon, resolv, systemd)
    assert (stub.source, stub.loopback) == (str(systemd), [])
    resolv.write_text("nameserver 127.0.0.1\nnameserver 10.0.0.2\n")  # e.g. dnsmasq
    local = host.embedded_upstream(daemon, resolv, systemd)
    assert (local.source, local.loopback) == (str(resolv), ["127.0.0.1"])
    daemon.write_text(json.dumps({"dns": ["::1"]}))
    assert host.embedded_upstream(daemon, resolv, systemd).loopback == ["::1"]

    exposed = checks.dns_cve_check(facts(version="20.10.24+dfsg1"), local, podman=False)
    assert exposed.status == "warn"
    assert "CVE-2024-29018" in exposed.detail and "127.0.0.1" in exposed.detail
    assert str(resolv) in exposed.detail and "26.0.0" in (exposed.fix or "")
    quiet = checks.dns_cve_check(facts(version="20.10.24"), stub, podman=False)
    assert quiet.status == "pass" and "not exposed" in quiet.detail
    assert checks.dns_cve_check(facts(version="26.1.0"), local, podman=False).status == "pass"
    assert checks.dns_cve_check(facts(version="4.3.1"), local, podman=True).status == "pass"
    remote = checks.dns_cve_check(facts(version="24.0.7", local=False), stub, podman=False)
    assert remote.status == "warn" and "another machine" in remote.detail
