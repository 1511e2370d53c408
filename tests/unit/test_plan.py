"""Grant and plan: refusals before anything exists, and hardened defaults in every spec."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli.main import main
from orchestrator.config import load_project, load_worker
from orchestrator.docker.netnames import network_name
from orchestrator.errors import ConfigError, PolicyError
from orchestrator.plan import Limits, Network, Tmpfs, compile_plan, project_key
from orchestrator.policy import RunPaths, grant_for
from orchestrator.prepare import prepare

PLAN_KEYS = {
    "image", "command", "uid", "gid", "workdir", "env", "mounts", "tmpfs", "limits",
    "network", "labels", "read_only_rootfs", "no_new_privileges", "seccomp", "capabilities",
    "init", "ulimits", "isolation", "run_id", "worker", "trust", "session_id", "outbox",
    "supervisor_user", "args", "inputs",
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
    assert spec.capabilities == []
    assert spec.no_new_privileges is True
    assert spec.seccomp == "orchestrator-default"
    assert [(u.name, u.soft, u.hard) for u in spec.ulimits] == [
        ("core", 0, 0),
        ("nofile", 1024, 4096),
    ]
    assert spec.to_dict()["ulimits"][0] == {"name": "core", "soft": 0, "hard": 0}
    assert spec.init is True
    assert spec.network == Network("none")
    assert spec.limits == Limits(memory=512 << 20, cpus=1.0, pids=256, timeout_s=600.0)
    assert spec.tmpfs_at("/tmp") == Tmpfs("/tmp", size=64 << 20)  # mode 1777, exec allowed
    assert spec.uid != 0 and spec.user == f"{spec.uid}:{spec.gid}"
    assert [(m.target, m.read_only) for m in spec.mounts] == [
        ("/session", False),
        ("/workers", True),
        ("/data", True),
        ("/out", False),
    ]
    assert spec.outbox == "/staged"
    assert spec.tmpfs_at("/staged") == Tmpfs(
        "/staged", size=256 << 20, mode=0o700, uid=spec.uid, gid=spec.gid, noexec=True
    )
    assert spec.supervisor_user not in (None, spec.user)
    assert spec.trust == "untrusted"
    assert spec.env["ORCHESTRATOR_INSTRUCTIONS"] == "Do it."
    assert not any("docker.sock" in m.source for m in spec.mounts)


def test_limits_merge_worker_over_project_over_builtin(project):
    project.extra = "defaults:\n  resources: {memory: 1g, pids: 100}\n  network: full\n"
    project.write_project()
    project.worker("w", "trust: session\nresources: {memory: 128m, timeout: 5}")
    loaded, worker = load(project)
    spec = prepare(loaded, worker, timeout=2).spec
    assert spec.limits.memory == 128 << 20  # worker
    assert spec.limits.pids == 100  # project
    assert spec.limits.cpus == 1.0  # built in
    assert spec.limits.timeout_s == 2  # command line
    # One network per project, never the engine's default one: the plan names the project.
    assert spec.network == Network("full", project=project_key(loaded.root))


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
    assert data["limits"] == {
        "memory": 512 << 20, "cpus": 1.0, "pids": 256, "timeout_s": 600.0
    }  # fmt: skip
    assert data["network"] == {
        "mode": "none", "allow": [], "services": [], "project": "", "credentials": [],
        "trust_ca": [],
    }  # fmt: skip
    assert {"target": "/tmp", "size": 64 << 20, "mode": 0o1777, "uid": None, "gid": None,
            "noexec": False, "mask": False} in data["tmpfs"]  # fmt: skip
    assert data["seccomp"] == "orchestrator-default" and data["no_new_privileges"] is True
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


def test_outbox_is_capped_by_the_memory_limit_and_plan_says_so(project, capsys):
    project.extra = "sandbox: {outbox: {size: 999t}}\n"
    project.write_project()
    project.worker("w", 'command: ["true"]\nsandbox: {}\nresources: {memory: 64m}')
    spec = prepare(*load(project)).spec
    assert spec.tmpfs_at("/staged").size == 64 << 20
    with pytest.raises(SystemExit) as exited:
        main(["plan", "w", "--project", str(project.root)])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "a fresh 64 MiB tmpfs, staged after the run (sandbox.outbox.size 999 TiB, capped" in out
    assert "/tmp 64 MiB" in out


def test_plan_shows_resolved_zone_folders_and_which_leave_the_project(project, tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    project.zone("inside")
    project.zones["ext"] = ("../elsewhere", "ro", "")
    project.write_project()
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: inside}, {name: ext}]}')
    with pytest.raises(SystemExit):
        main(["plan", "w", "--project", str(project.root)])
    lines = capsys.readouterr().out.splitlines()
    (ext,) = [line for line in lines if line.startswith("  /ext ")]
    assert ext.split() == [
        "/ext",
        "ro",
        str(outside.resolve()),
        "[outside",
        "the",
        "project",
        "folder]",
    ]
    (inside,) = [line for line in lines if line.startswith("  /inside ")]
    assert "outside" not in inside
    assert str((project.root / "inside").resolve()) in inside


def test_each_allowlisted_run_gets_a_network_of_its_own(project):
    project.extra = "network:\n  services:\n    - network: my-test-net\n"
    project.write_project()
    project.worker("w", "network: {allow: [web.my-test-net, api.example.org]}")
    loaded, worker = load(project)
    first, second = prepare(loaded, worker).spec, prepare(loaded, worker).spec
    assert first.network == Network(
        "allowlist",
        allow=[
            "api.example.org:80",
            "api.example.org:443",
            "web.my-test-net:80",
            "web.my-test-net:443",
        ],
        services=["my-test-net"],
    )  # the allowlist normalised: sorted, one entry per port
    assert first.run_id != second.run_id  # each engine names a run's own network after it
    assert network_name(first) == f"orchestrator-run-{first.run_id}"
    assert network_name(first) != network_name(second)  # never shared between runs
    assert first.env["HTTP_PROXY"] == "http://proxy:3128"
    project.worker("closed", "{}")
    assert prepare(*load(project, "closed")).spec.network.services == []  # no proxy, no services


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bridge", "not a user-defined network"),
        ("orchestrator-egress", "not a user-defined network"),
        ("bad name", "not a Docker network name"),
    ],
)
def test_local_service_networks_must_be_the_users_own(project, name, message):
    project.extra = f"network:\n  services:\n    - network: '{name}'\n"
    project.write_project()
    with pytest.raises(ConfigError, match=message) as info:
        load_project(project.root)
    assert "network.services" in str(info.value)


def test_image_user_is_planned_only_under_gvisor_and_wants_root_for_writable_folders(
    project, monkeypatch
):
    from orchestrator.plan import IMAGE_USER_CAPABILITIES, IMAGE_USER_SECCOMP
    from orchestrator.runtime.run import refuse_image_user

    project.zone("out", "rw", extra="untrusted_output: true")
    project.worker("w", "image_user: true\nsandbox: {zones: [{name: out, mode: rw}]}")
    spec = prepare(*load(project)).spec
    assert (spec.isolation, spec.image_user, spec.read_only_rootfs) == ("gvisor", True, False)
    assert spec.capabilities == list(IMAGE_USER_CAPABILITIES)
    assert "NET_RAW" not in spec.capabilities and "MKNOD" not in spec.capabilities
    assert (spec.seccomp, spec.no_new_privileges, spec.user) == (IMAGE_USER_SECCOMP, True, "")
    assert "HOME" not in spec.env  # the image's user's own

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(ConfigError) as refused:
        refuse_image_user(spec)
    (line,) = refused.value.problems
    assert "image_user with writable /session, /out needs" in line and "as root" in line
    monkeypatch.setattr("os.geteuid", lambda: 0)
    refuse_image_user(spec)

    project.isolation = "runc"
    project.write_project()
    with pytest.raises(ConfigError) as under_runc:
        prepare(*load(project))
    (line,) = under_runc.value.problems
    assert "w.worker" in line and "image_user" in line and "needs gVisor" in line
