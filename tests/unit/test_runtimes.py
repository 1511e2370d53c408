"""The Docker adapter's isolation runtimes without a daemon: names, what a gVisor container
is created with, the missing-runtime refusal, and ``engine setup --gvisor``'s file work and
reload (against a stand-in dockerd process, never the real one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.docker import runtimes, seccomp
from orchestrator.docker.engine import DockerEngine
from orchestrator.errors import EngineError
from orchestrator.plan import SECCOMP_PROFILE, ContainerSpec, Limits, Network, Ulimit


class FakeAPI:
    """Just enough of docker.APIClient: who it is, its runtimes, and create."""

    base_url = "http+docker://fake"

    def __init__(self, runtime_names=("runc",)):
        self.runtime_names = set(runtime_names)
        self.calls = []
        self.created = {}

    def version(self):
        return {"Version": "20.10.24", "Components": []}

    def info(self):
        self.calls.append("info")
        return {"Runtimes": {name: {"path": name} for name in self.runtime_names}}

    def create_host_config(self, **kwargs):
        return kwargs

    def create_container(self, **kwargs):
        self.calls.append("create")
        self.created = kwargs
        return {"Id": f"c{len(self.calls)}"}

    # An allowlisted run's network has its egress proxy attached before the run is made.
    def containers(self, filters=None, **kwargs):
        return [{"Id": "proxy"}] if filters and filters.get("network") else []

    def inspect_container(self, container):
        network = spec().labels[labels.RUN_ID]  # the run network of spec(): one per run id
        return {"NetworkSettings": {"Networks": {f"orchestrator-run-{network}": {
            "IPAddress": "10.9.0.2"}}}}  # fmt: skip


def spec(isolation="runc", network="none") -> ContainerSpec:
    return ContainerSpec(
        image="img", command=["true"], uid=1000, gid=1000, network=Network(network),
        limits=Limits(memory=1 << 26, cpus=1.0, pids=64, timeout_s=600.0),
        labels={labels.RUN_ID: "r1"}, run_id="r1", worker="w", trust="untrusted",
        ulimits=[Ulimit("core", 0, 0)], isolation=isolation,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(DockerEngine, "_seen_runtimes", set())
    monkeypatch.setattr(DockerEngine, "_gvisor_containers", {})
    monkeypatch.setattr(DockerEngine, "_exec_nofile", {})


def test_runtime_names_follow_isolation_and_network():
    assert runtimes.runtime_name("runc", "none") == "runc"
    assert runtimes.runtime_name("runc", "allowlist") == "runc"
    assert runtimes.runtime_name("gvisor", "none") == runtimes.GVISOR_NONE
    assert runtimes.runtime_name("gvisor", "allowlist") == runtimes.GVISOR_NETWORK
    assert runtimes.runtime_name("gvisor", "full") == runtimes.GVISOR_NETWORK
    assert runtimes.GVISOR_ARGS[runtimes.GVISOR_NONE][0] == "--network=none"
    assert runtimes.GVISOR_ARGS[runtimes.GVISOR_NETWORK][0] == "--network=host"
    assert all("--oci-seccomp" in args for args in runtimes.GVISOR_ARGS.values())


def test_only_a_parent_may_connect_to_a_host_socket_under_gvisor():
    assert runtimes.runtime_name("runc", "none", broker=True) == "runc"
    assert runtimes.runtime_name("gvisor", "none", broker=True) == runtimes.GVISOR_BROKER_NONE
    assert runtimes.runtime_name("gvisor", "full", broker=True) == runtimes.GVISOR_BROKER_NETWORK
    with_uds = {name for name, args in runtimes.GVISOR_ARGS.items() if "--host-uds=open" in args}
    assert with_uds == {runtimes.GVISOR_BROKER_NONE, runtimes.GVISOR_BROKER_NETWORK}
    for plain, broker in (
        (runtimes.GVISOR_NONE, runtimes.GVISOR_BROKER_NONE),
        (runtimes.GVISOR_NETWORK, runtimes.GVISOR_BROKER_NETWORK),
    ):  # the same sandbox otherwise
        assert runtimes.GVISOR_ARGS[broker] == [*runtimes.GVISOR_ARGS[plain], "--host-uds=open"]


def test_a_session_opened_for_snapshots_gets_the_build_runtime_under_gvisor():
    assert runtimes.runtime_name("gvisor", "none", capture=True) == runtimes.GVISOR_BUILD
    assert runtimes.runtime_name("gvisor", "full", capture=True) == runtimes.GVISOR_BUILD_NETWORK
    assert runtimes.runtime_name("runc", "none", capture=True) == "runc"
    # a parent keeps its broker runtime (its snapshot is refused: see runtime.snapshots)
    assert runtimes.runtime_name("gvisor", "none", broker=True, capture=True) == (
        runtimes.GVISOR_BROKER_NONE
    )
    assert "--overlay2=none" in runtimes.GVISOR_ARGS[runtimes.GVISOR_BUILD]


def test_a_parent_gets_the_broker_runtime_and_an_engine_set_up_before_it_says_so():
    from dataclasses import replace

    from orchestrator.plan import BROKER_DIR, Mount

    parent = replace(spec("gvisor"), mounts=[Mount("/host/run/broker", BROKER_DIR, True)])
    assert parent.calls_children and not spec("gvisor").calls_children
    api = FakeAPI({"runc", *runtimes.GVISOR_ARGS})
    assert DockerEngine(client=api).runtime_for(parent) == runtimes.GVISOR_BROKER_NONE
    older = FakeAPI({"runc", runtimes.GVISOR_NONE, runtimes.GVISOR_NETWORK})
    older.base_url = "http+docker://set-up-before"  # another engine
    assert DockerEngine(client=older).runtime_for(spec("gvisor")) == runtimes.GVISOR_NONE
    with pytest.raises(EngineError, match="no 'orchestrator-runsc-broker' runtime: register it"):
        DockerEngine(client=older).runtime_for(parent)


def test_a_missing_gvisor_runtime_is_one_line_naming_the_setup_and_the_opt_out():
    api = FakeAPI()
    with pytest.raises(EngineError) as refused:
        DockerEngine(client=api).create(spec("gvisor"))
    message = str(refused.value)
    assert "\n" not in message
    assert "no 'orchestrator-runsc' runtime" in message
    assert "`sudo orchestrator engine setup --gvisor`" in message
    assert "apt-get install runsc" in message
    assert "`isolation: {untrusted: runc}` in the project file" in message
    assert "create" not in api.calls


def test_runc_needs_no_question_and_a_found_runtime_is_remembered():
    api = FakeAPI({"runc", *runtimes.GVISOR_ARGS})
    engine = DockerEngine(client=api)
    assert engine.runtime_for(spec("runc")) == "runc"
    assert api.calls == []
    assert engine.runtime_for(spec("gvisor")) == runtimes.GVISOR_NONE
    assert engine.runtime_for(spec("gvisor")) == runtimes.GVISOR_NONE
    assert api.calls == ["info"]


def test_a_gvisor_container_keeps_the_process_limit_inside_and_a_runsc_seccomp_profile():
    api = FakeAPI({"runc", *runtimes.GVISOR_ARGS})
    DockerEngine(client=api).create(spec("gvisor", network="allowlist"))
    host = api.created["host_config"]
    assert host["runtime"] == runtimes.GVISOR_NETWORK
    assert host["extra_hosts"] == {"proxy": "10.9.0.2"}  # found without the engine's DNS
    assert host["pids_limit"] == runtimes.host_pids_limit(runtimes.GVISOR_NETWORK, 64) > 64
    assert {(u["Name"], u["Soft"], u["Hard"]) for u in host["ulimits"]} == {
        ("core", 0, 0),
        ("nproc", 64, 64),
    }
    [profile] = [o.removeprefix("seccomp=") for o in host["security_opt"] if "seccomp=" in o]
    clone3 = [r for r in json.loads(profile)["syscalls"] if r["names"] == ["clone3"]]
    assert clone3 and all(r["action"] == "SCMP_ACT_ALLOW" for r in clone3)

    DockerEngine(client=api).create(spec("runc"))
    host = api.created["host_config"]
    assert (host["runtime"], host["pids_limit"]) == ("runc", 64)
    assert [u["Name"] for u in host["ulimits"]] == ["core"]
    [profile] = [o.removeprefix("seccomp=") for o in host["security_opt"] if "seccomp=" in o]
    clone3 = [r for r in json.loads(profile)["syscalls"] if r["names"] == ["clone3"]]
    assert [(r["action"], r.get("errnoRet")) for r in clone3] == [("SCMP_ACT_ERRNO", 38)]


def test_the_runsc_profile_differs_only_in_clone3_and_is_supplied_when_none_is_named():
    plain = json.loads(seccomp.profile_text(SECCOMP_PROFILE))
    variant = json.loads(seccomp.profile_text(SECCOMP_PROFILE, gvisor=True))
    changed = [
        (a, b) for a, b in zip(plain["syscalls"], variant["syscalls"], strict=True) if a != b
    ]
    assert [a["names"] for a, _ in changed] == [["clone3"]]
    assert {k: v for k, v in plain.items() if k != "syscalls"} == {
        k: v for k, v in variant.items() if k != "syscalls"
    }
    options = seccomp.security_opt(["no-new-privileges:true"], gvisor=True)
    assert options[0] == "no-new-privileges:true"
    assert options[1] == f"seccomp={seccomp.profile_text(SECCOMP_PROFILE, gvisor=True)}"
    assert seccomp.security_opt(["no-new-privileges:true"]) == ["no-new-privileges:true"]


# -- engine setup --gvisor --------------------------------------------------------------


class Dockerd:
    """A stand-in dockerd: a process named ``dockerd`` (a copy of ``sleep``) with a pid file,
    and an engine whose runtimes are what the daemon.json says once it got SIGHUP."""

    def __init__(self, folder: Path, config: Path) -> None:
        binary = folder / "dockerd"
        shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
        self.process = subprocess.Popen([str(binary), "60"])
        self.pid_file = folder / "docker.pid"
        self.pid_file.write_text(str(self.process.pid))
        self.config = config
        self.loaded: dict = {"runc": {"path": "runc"}}
        self.api = self  # DockerClient-like: .api.info()
        deadline = time.monotonic() + 5
        while runtimes._comm(self.process.pid) != "dockerd" and time.monotonic() < deadline:
            time.sleep(0.01)

    def info(self):
        if self.process.poll() == -signal.SIGHUP:  # "reloaded": what the file declares now
            self.loaded = json.loads(self.config.read_text())["runtimes"]
        return {"Runtimes": self.loaded}

    def close(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture
def dockerd(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    config = tmp_path / "daemon.json"
    fake = Dockerd(tmp_path, config)
    kill = os.kill

    def only_the_stand_in(pid: int, signum: int) -> None:
        assert pid == fake.process.pid, "only the stand-in dockerd may be signalled"
        kill(pid, signum)

    monkeypatch.setattr(os, "kill", only_the_stand_in)
    yield fake
    fake.close()


def setup(fake, **kwargs):
    return runtimes.setup_gvisor(
        fake, daemon_json=fake.config, pid_file=fake.pid_file, runsc="/usr/bin/runsc", **kwargs
    )


def test_setup_merges_backs_up_reloads_and_verifies(dockerd):
    original = {
        "storage-driver": "fuse-overlayfs",
        "log-opts": {"max-size": "10m"},
        "runtimes": {"mine": {"path": "/opt/mine"}},
    }
    dockerd.config.write_text(json.dumps(original))
    dockerd.config.chmod(0o600)
    result = setup(dockerd)
    assert (result.changed, result.reloaded) == (True, True)
    assert dockerd.process.wait(5) == -signal.SIGHUP  # the one signal it got
    written = json.loads(dockerd.config.read_text())
    assert written["storage-driver"] == "fuse-overlayfs" and written["log-opts"] == {
        "max-size": "10m"
    }
    assert written["runtimes"]["mine"] == {"path": "/opt/mine"}
    for name, args in runtimes.GVISOR_ARGS.items():
        assert written["runtimes"][name] == {"path": "/usr/bin/runsc", "runtimeArgs": args}
    assert result.backup is not None and json.loads(result.backup.read_text()) == original
    assert dockerd.config.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in dockerd.config.parent.iterdir() if p.name.startswith(".")) == []


def test_setup_again_changes_and_signals_nothing(dockerd):
    setup(dockerd)
    dockerd.process.wait(5)
    before = sorted(dockerd.config.parent.iterdir())
    again = setup(dockerd)  # the stand-in is gone: a signal now would fail
    assert (again.changed, again.reloaded, again.backup) == (False, False, None)
    assert sorted(dockerd.config.parent.iterdir()) == before


def test_a_new_file_is_written_without_backup(dockerd):
    result = setup(dockerd)
    assert result.backup is None and set(json.loads(dockerd.config.read_text())) == {"runtimes"}


def test_a_dockerd_that_does_not_load_them_is_reported_with_the_backup(dockerd, monkeypatch):
    monkeypatch.setattr(runtimes, "RELOAD_WAIT_S", 0.3)
    dockerd.config.write_text("{}")
    monkeypatch.setattr(Dockerd, "info", lambda self: {"Runtimes": {"runc": {}}})
    with pytest.raises(EngineError, match=r"did not load runtime\(s\) orchestrator-runsc.*backup"):
        setup(dockerd)


def test_refusals_name_the_fix(tmp_path, monkeypatch):
    config = tmp_path / "daemon.json"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EngineError, match=r"run it as root, `sudo .* engine setup --gvisor`"):
        runtimes.setup_gvisor(None, daemon_json=config)  # type: ignore[arg-type]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setattr(runtimes, "_in_sbin", lambda _name: None)
    with pytest.raises(EngineError, match="`sudo apt-get install runsc`"):
        runtimes.setup_gvisor(None, daemon_json=config)  # type: ignore[arg-type]
    config.write_text('{"mtu": 1400,,}')
    with pytest.raises(EngineError, match=r"daemon.json: not valid JSON \(line 1"):
        runtimes.setup_gvisor(None, daemon_json=config, runsc="/usr/bin/runsc")  # type: ignore[arg-type]
    config.write_text('{"runtimes": []}')
    with pytest.raises(EngineError, match="'runtimes' is not a mapping"):
        runtimes.setup_gvisor(None, daemon_json=config, runsc="/usr/bin/runsc")  # type: ignore[arg-type]
    assert not list(tmp_path.glob("*backup*"))
