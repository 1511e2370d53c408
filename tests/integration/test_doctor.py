"""``orchestrator doctor`` for real: through the console entry point, on this engine.

The firewall test takes the host rule and its exceptions away (if they were there), sees the
doctor fail for real (the rule check, and an allowlisted worker reaching a listener on the
host), applies ``--fix``, sees everything pass, and restores the machine as it found it. The other tests
interrupt and kill a doctor mid-way and check that nothing it made is left behind.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from orchestrator.docker import egress_gc
from orchestrator.docker.egress import EGRESS_KEY
from orchestrator.docker.testservers import HTTP_PORT, SELFTEST
from orchestrator.doctor import firewall
from orchestrator.policy.network import egress_key
from tests.host_firewall import input_chain, present, without_the_host_rule
from tests.integration.conftest import IN_CI, cli

pytestmark = [pytest.mark.docker, pytest.mark.serial]  # the host firewall, gc: alone

NAMED = {
    "engine",
    "runtimes",
    "seccomp",
    "cgroups",
    "rootless",
    "user namespaces",
    "engine dns",
    "disk",
    "images",
    "firewall",
}
#: One row per claim of the self-test, for each isolation it runs under.
NONE_ROWS = ["loopback only", "no route", "TCP fails", "UDP fails", "DNS fails"]
ALLOW_ROWS = [
    "allowed name",
    "other name refused",
    "direct IP fails",
    "outside DNS fails",
    "UDP/QUIC fails",
    "host services unreachable",
    "decisions logged",
]
DOCTOR_TIMEOUT = 300


def isolations(engine) -> list[str]:
    """runc, and gVisor where the engine has it (always under CI: make sets it up)."""
    from orchestrator.docker import runtimes

    missing = set(runtimes.GVISOR_ARGS) - set(runtimes.engine_runtimes(engine))
    if missing and IN_CI:
        pytest.fail(f"CI=true and no gVisor runtime: `{runtimes.setup_command()}`")
    return ["runc"] if missing else ["runc", "gvisor"]


def doctor_project(project, used: list[str]):
    """A project whose levels use exactly ``used``: gVisor for untrusted when listed."""
    levels = {"untrusted": used[-1], "session": "runc", "workspace": "runc", "full": "runc"}
    project.extra = "isolation: {" + ", ".join(f"{k}: {v}" for k, v in levels.items()) + "}\n"
    project.write_project()
    return str(project.root)


def rows(data: dict) -> dict[str, dict]:
    return {row["name"]: row for row in data["checks"]}


def one_json_object(stdout: str) -> dict:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def egress_names(used: list[str]) -> list[str]:
    return [
        f"egress {mode} ({isolation}): {claim}"
        for isolation in used
        for mode, claims in (("none", NONE_ROWS), ("allowlist", ALLOW_ROWS))
        for claim in claims
    ]


def selftest_objects(engine) -> list:
    return [o for o in engine.list_managed() if SELFTEST in o.labels]


def test_the_report_names_every_field_as_one_json_object(engine, project):
    done = cli("doctor", "--json", "--no-egress", "--project", str(project.root))
    data = one_json_object(done.stdout)
    checks = rows(data)
    assert set(checks) >= NAMED | {"project"}
    failed = [row for row in checks.values() if row["status"] == "fail"]
    assert done.returncode == (1 if failed else 0) == data["exit_code"], done.stderr
    assert all(row["fix"] for row in failed)
    facts = data["facts"]
    assert facts["engine"]["version"] == engine.api.version()["Version"]
    assert facts["engine"]["api_version"] and facts["engine"]["client_api_version"] == "1.41"
    assert "runc" in facts["engine"]["runtimes"]
    assert facts["engine"]["seccomp_profile"]
    assert facts["engine"]["cgroup_version"] in {"1", "2"}
    assert set(facts["engine"]["limits"]) == {"memory", "swap", "cpu", "pids"}
    assert isinstance(facts["engine"]["rootless"], bool)
    with open("/proc/sys/user/max_user_namespaces") as handle:
        assert facts["host"]["max_user_namespaces"] == int(handle.read())
    assert facts["disk"]["free"] > 0
    assert facts["disk"]["path"] == str(project.root.resolve() / ".sandbox")
    assert facts["images"]["orchestrator/worker:latest"] is True
    assert facts["firewall"]["command"].startswith("iptables -I INPUT -i oeg-+")
    # The same report as a table: every row, and the same exit code.
    table = cli("doctor", "--no-egress", "--project", str(project.root))
    assert table.returncode == done.returncode
    for name in checks:
        assert name in table.stdout


def test_a_missing_firewall_rule_fails_for_real_and_fix_makes_everything_pass(engine, project):
    used = isolations(engine)
    root = doctor_project(project, used)
    # A worker with an allowlist of its own (a unique name: a proxy no other test shares).
    listed = f"doctor-warning-{uuid.uuid4().hex[:8]}.test"
    project.worker("listed", f'command: ["true"]\nnetwork: {{allow: [{listed}]}}')
    key = egress_key(firewall_entries(listed))
    try:
        with without_the_host_rule():
            failing = cli("doctor", "--json", "--project", root, timeout=DOCTOR_TIMEOUT)
            data = one_json_object(failing.stdout)
            checks = rows(data)
            assert failing.returncode == 1, failing.stderr
            assert checks["firewall"]["status"] == "fail"
            assert "doctor --fix" in checks["firewall"]["fix"]
            reached = [f"egress allowlist ({i}): host services unreachable" for i in used]
            for name in egress_names(used):
                wanted = "fail" if name in reached else "pass"
                assert checks[name]["status"] == wanted, checks[name]
            for name in reached:  # a worker really got to a listener on the host
                assert "was reached at" in checks[name]["detail"]

            # `run` warns while the rule is missing: one line, once.
            run = cli("run", "listed", "--project", root)
            assert run.returncode == 0, run.stderr
            assert run.stderr.count("firewall rule is missing") == 1

            fixed = cli("doctor", "--fix", "--json", "--project", root, timeout=DOCTOR_TIMEOUT)
            data = one_json_object(fixed.stdout)
            checks = rows(data)
            assert fixed.returncode == 0, [c for c in data["checks"] if c["status"] == "fail"]
            exceptions = [*firewall.ENGINE_DNS_RULES]
            if firewall.firewall_state().resolvers:
                exceptions += firewall.DNS_RULES
            assert data["fixed"] == [
                firewall.command("-I", rule) for rule in (firewall.RULE, *exceptions[::-1])
            ]
            assert all(present(rule) for rule in (firewall.RULE, *exceptions))
            assert checks["firewall"]["status"] == "pass"
            assert checks["firewall engine dns"]["status"] == "pass"
            for name in egress_names(used):
                assert checks[name]["status"] == "pass", checks[name]
            assert checks["egress test servers"]["status"] == "pass"

            again = cli("doctor", "--fix", "--json", "--no-egress", "--project", root)
            assert one_json_object(again.stdout)["fixed"] == []  # idempotent
            listing = input_chain()
            assert listing.count("-i oeg-+") == 1
            assert listing.count("-i oeg-podman") == 2  # udp and tcp, once each

            quiet = cli("run", "listed", "--project", root)
            assert quiet.returncode == 0 and "firewall rule" not in quiet.stderr
    finally:
        egress_gc.remove_egress(engine, key)
    assert not selftest_objects(engine)


def firewall_entries(name: str):
    from orchestrator.config.allowlist import validate_allowlist

    return validate_allowlist([name])


def _doctor_process(root: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "doctor", "--project", root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(process: subprocess.Popen, words: str, timeout: float = 120.0) -> list[str]:
    """Read the doctor's progress lines until one contains ``words``; return them all."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        if words in line:
            return seen
    process.kill()
    pytest.fail(f"the doctor never said {words!r}: {''.join(seen)}")


def _network_of(lines: list[str]) -> str:
    first = next(line for line in lines if "starting two test servers" in line)
    return first.rsplit(" ", 1)[1].strip()


def _temp_folders() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "orchestrator-doctor-*")))


def _proxy_key(network: str) -> str:
    return egress_key(firewall_entries(f"allowed.{network}:{HTTP_PORT}"), [network])


def test_an_interrupted_doctor_removes_what_it_started(engine, project):
    root = doctor_project(project, ["runc"])
    folders = _temp_folders()
    process = _doctor_process(root)
    try:
        lines = _wait_for(process, "a worker with network allowlist")
        network = _network_of(lines)
        time.sleep(1.0)  # in the middle of the allowlisted run
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "interrupted; what it started is removed" in err
    assert not selftest_objects(engine)
    assert not engine.api.networks(names=[network])
    key = _proxy_key(network)
    assert not engine.api.containers(all=True, filters={"label": f"{EGRESS_KEY}={key}"})
    assert _temp_folders() <= folders


def test_a_killed_doctor_is_cleaned_up_by_gc(engine, project):
    root = doctor_project(project, ["runc"])
    folders = _temp_folders()
    process = _doctor_process(root)
    try:
        lines = _wait_for(process, "a worker with network allowlist")
        network = _network_of(lines)
        time.sleep(1.0)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    key = _proxy_key(network)
    try:
        assert selftest_objects(engine)  # the servers and their network outlive it...
        done = cli("gc", "--project", root)
        assert done.returncode == 0, done.stderr
        assert not selftest_objects(engine)  # ...until gc: they carry the owner labels
        assert not engine.api.networks(names=[network])
        # The shared proxy is left for the idle pass; it serves nothing any more.
        for proxy in engine.api.containers(all=True, filters={"label": f"{EGRESS_KEY}={key}"}):
            attached = set(proxy["NetworkSettings"]["Networks"])
            assert network not in attached and not any(
                name.startswith("orchestrator-run-") for name in attached
            )
    finally:
        egress_gc.remove_egress(engine, key)
        for folder in _temp_folders() - folders:  # the killed doctor's throw-away project
            subprocess.run(["rm", "-rf", folder], check=False)


def test_everyday_tools_run_in_one_gvisor_worker_and_name_the_runsc_version(engine, project):
    from orchestrator.docker import runsc
    from orchestrator.doctor.everyday import OPERATIONS
    from tests.integration.conftest import require_gvisor

    require_gvisor(engine)
    done = cli("doctor", "--json", "--no-egress", "--project", str(project.root))
    row = rows(one_json_object(done.stdout))["everyday tools (gvisor)"]
    path = runsc.find()
    assert path is not None
    assert row["status"] == "pass", row
    assert runsc.version(path) in row["detail"]
    for operation in OPERATIONS:
        assert operation in row["detail"]
    skipped = cli("doctor", "--json", "--no-egress", "--no-tools", "--project", str(project.root))
    assert "everyday tools (gvisor)" not in rows(one_json_object(skipped.stdout))
