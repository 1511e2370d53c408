"""Grant and plan: refusals before anything exists, and hardened defaults in every spec."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli.main import main
from orchestrator.config import load_project, load_worker
from orchestrator.errors import ConfigError, PolicyError
from orchestrator.plan import compile_plan
from orchestrator.policy import RunPaths, grant_for
from orchestrator.runtime import prepare

PLAN_KEYS = {
    "image", "command", "user", "working_dir", "env", "mounts", "network_mode",
    "read_only_rootfs", "cap_drop", "cap_add", "security_opt", "pids_limit", "mem_limit",
    "nano_cpus", "tmpfs", "labels",
}  # fmt: skip


def load(project, name="w"):
    loaded = load_project(project.root)
    return loaded, load_worker(loaded, name)


def paths_of(loaded):
    return RunPaths.of(loaded, session_id="s1", workspace="default", run_id="r1")


def test_unknown_zone_and_rw_on_ro_are_refused_together(project):
    project.zone("data", "ro")
    project.worker("w", "sandbox: {zones: [{name: data, mode: rw}, {name: secrets}]}")
    loaded, worker = load(project)
    with pytest.raises(PolicyError) as excinfo:
        grant_for(loaded, worker, paths_of(loaded))
    first, second = excinfo.value.problems
    assert "sandbox.zones[0]: asks rw on zone 'data' but" in first
    assert "allows only ro; ask for ro or raise the zone's mode" in first
    assert "sandbox.zones[1]: zone 'secrets' is not declared in" in second
    assert "(zones: data); add it there or remove it here" in second


def test_no_sandbox_means_no_mounts(project):
    project.zone("data", "rw")
    project.worker("w", 'command: ["true"]')
    spec = prepare(*load(project)).spec
    assert spec.mounts == []


def test_hardened_defaults(project):
    project.zone("data", "ro")
    project.zone("out", "rw", extra="untrusted_output: true")
    project.worker("w", "sandbox: {zones: [{name: data}, {name: out, mode: rw}]}", body="Do it.")
    spec = prepare(*load(project)).spec
    assert spec.read_only_rootfs is True
    assert spec.cap_drop == ["ALL"]
    assert spec.cap_add == []
    assert spec.security_opt == ["no-new-privileges:true"]
    assert spec.privileged is False
    assert spec.init is True
    assert spec.devices == []
    assert spec.network_mode == "none"
    assert spec.mem_limit == spec.memswap_limit == 512 << 20
    assert spec.pids_limit == 256
    assert spec.nano_cpus == 1_000_000_000
    assert spec.tmpfs["/tmp"].startswith("rw,nosuid,nodev,size=")
    assert not spec.user.startswith("0:")
    assert [(m.target, m.read_only) for m in spec.mounts] == [
        ("/session", False),
        ("/workers", True),
        ("/data", True),
        ("/out", False),
    ]
    assert spec.outbox == "/staged"
    assert spec.tmpfs["/staged"].startswith("rw,nosuid,nodev,noexec,size=268435456,mode=0700")
    assert spec.supervisor_user not in (None, spec.user)
    assert spec.trust == "untrusted"
    assert spec.env["ORCHESTRATOR_INSTRUCTIONS"] == "Do it."
    assert not any("docker.sock" in m.source for m in spec.mounts)


def test_limits_merge_worker_over_project_over_builtin(project):
    project.extra = "defaults:\n  resources: {memory: 1g, pids: 100}\n  network: full\n"
    project.write_project()
    project.worker("w", "trust: session\nresources: {memory: 128m, timeout: 5}")
    spec = prepare(*load(project), timeout=2).spec
    assert spec.mem_limit == 128 << 20  # worker
    assert spec.pids_limit == 100  # project
    assert spec.nano_cpus == 1_000_000_000  # built in
    assert spec.timeout_s == 2  # command line
    assert spec.network_mode.startswith("orchestrator-full-")  # never the default bridge


def test_never_uid_0(project):
    project.worker("w", "{}")
    loaded, worker = load(project)
    grant = grant_for(loaded, worker, paths_of(loaded))
    with pytest.raises(ValueError, match="uid 0"):
        compile_plan(loaded, worker, grant, run_id="r", session_id="s", uid=0, gid=0)


def test_env_values_and_reserved_names(project):
    project.worker("w", "env: {A: 1, B: true, C: x}")
    env = prepare(*load(project)).spec.env
    assert (env["A"], env["B"], env["C"]) == ("1", "true", "x")
    project.worker("w", "env: {HOME: /root}")
    with pytest.raises(ConfigError, match="env.HOME: set by the orchestrator itself"):
        prepare(*load(project))


def test_plan_json_has_the_documented_keys(project, capsys):
    project.zone("data", "ro")
    project.worker("w", "sandbox: {zones: [{name: data}]}")
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "w", "--project", str(project.root), "--json"])
    assert exit_info.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= PLAN_KEYS
    assert {
        "source": str((project.root / "data").resolve()),
        "target": "/data",
        "read_only": True,
    } in data["mounts"]
    assert isinstance(data["mem_limit"], int)
    assert data["labels"]["io.orchestrator.worker"] == "w"


def test_cli_errors_are_one_line_per_problem_and_exit_125(project, capsys):
    project.worker("w", "sandbox: {zones: [{name: nope}]}\nnetwork: wide")
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "w", "--project", str(project.root)])
    assert exit_info.value.code == 125
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1
    assert err.startswith("orchestrator: error: ") and "network: 'wide' must be none, full" in err


def test_cli_refuses_a_bad_policy_before_docker(project, capsys, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    project.zone("data", "ro")
    project.worker("w", "sandbox: {zones: [{name: data, mode: rw}]}")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "w", "--project", str(project.root)])
    assert exit_info.value.code == 125
    assert "asks rw on zone 'data'" in capsys.readouterr().err


def test_usage_errors_exit_125(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run"])
    assert exit_info.value.code == 125
    assert "Missing argument" in capsys.readouterr().err
