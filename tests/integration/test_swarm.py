"""``--engine swarm``: runs and batches as replicated-job services on a real swarm.

The session fixture ``swarm`` (tests/integration/conftest.py) makes this engine a
single-node swarm when it is not in one, and leaves it as it found it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from orchestrator.docker.swarm import SwarmBackend
from orchestrator.docker.swarm.engine import SWARM
from orchestrator.runner import Orchestrator
from tests.integration.conftest import batch_of_docs, batch_summary, cli, script_worker
from tests.integration.conftest import swarm_docker as _docker
from tests.integration.conftest import swarm_gone as _gone
from tests.integration.conftest import swarm_ours as _ours

pytestmark = pytest.mark.docker

TOKEN = "tok-5f2e9a7c1b3d4e6f"


def _networks() -> set[str]:
    return set(_docker("network", "ls", "--format", "{{.Name}}").stdout.split())


@pytest.fixture
def swarm_project(swarm, project):
    project.extra = "isolation: {untrusted: runc, session: runc}\n"
    project.write_project()
    return project


def test_a_run_propagates_its_exit_code_and_its_results_are_collected(swarm_project):
    script_worker(
        swarm_project,
        """
        import os, sys
        print("to stdout")
        open("/staged/report.md", "w").write("findings\\n")
        os.symlink("/etc/passwd", "/staged/passwd")
        os.mkfifo("/staged/pipe")
        os.makedirs("/staged/.git")
        open("/staged/.git/config", "w").write("[core]\\n")
        sys.exit(3)
        """,
    )
    done = cli("run", "w", "--project", str(swarm_project.root), "--engine", "swarm", "--json")
    assert done.returncode == 3, done.stderr
    result = done.json()
    assert result["status"] == "exited" and result["container_removed"]
    assert "to stdout" in result["stdout"]
    outbox = result["outbox"]
    assert outbox["files"] == 1  # report.md only
    reasons = {r["path"]: r["reason"] for r in outbox["rejected"]}
    assert "passwd" in reasons and "pipe" in reasons and any(".git" in p for p in reasons)
    shown = cli("staged", "show", outbox["change_id"], "--project", str(swarm_project.root))
    assert "report.md" in shown.stdout and "findings" in shown.stdout


def test_a_batch_of_twenty_inputs_becomes_one_change_set(swarm_project, tmp_path):
    script_worker(
        swarm_project,
        """
        import os
        name = sorted(os.listdir("/inputs"))[0]
        text = open(os.path.join("/inputs", name)).read()
        open("/staged/result.txt", "w").write("seen " + text)
        """,
    )
    args = ["--engine", "swarm", "--concurrency", "4"]
    summary = batch_of_docs(swarm_project, tmp_path / "in", 20, *args)
    assert summary["succeeded"] == 20 and summary["change_files"] == 21  # + the manifest
    batch = swarm_project.root / ".sandbox" / "batches" / summary["batch_id"]
    lines = [json.loads(x) for x in (batch / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 20 and all(r["files"][0]["path"] == "result.txt" for r in lines)
    shown = cli("staged", "show", summary["change_id"], "--project", str(swarm_project.root))
    assert "0001-d00.txt/result.txt" in shown.stdout and "BATCH-MANIFEST.json" in shown.stdout
    # Resumed: nothing runs again.
    again = cli(
        "batch", "w", "--resume", summary["batch_id"], "--engine", "swarm", "--json",
        "--project", str(swarm_project.root),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert '"skipped": 20' in again.stdout


def test_hardening_holds_inside_the_task(swarm_project):
    script_worker(
        swarm_project,
        """
        import os
        status = dict(l.split(":", 1) for l in open("/proc/self/status"))
        print("ids", os.getuid(), os.getgid())
        print("capeff", status["CapEff"].strip())
        try:
            open("/rootfs-write", "w")
        except OSError as e:
            print("rootfs errno", e.errno)
        print("pids", open("/sys/fs/cgroup/pids/pids.max").read().strip())
        print("memory", open("/sys/fs/cgroup/memory/memory.limit_in_bytes").read().strip())
        st = os.statvfs("/tmp")
        print("tmp", st.f_blocks * st.f_frsize)
        print("tmpopts", [l.split()[3] for l in open("/proc/mounts") if l.split()[1] == "/tmp"])
        """,
        "sandbox: {}\nresources: {memory: 96m, pids: 48, tmp: 8m}",
    )
    with Orchestrator(swarm_project.root, backend="swarm") as orch:
        result = orch.run("w")
    out = result.stdout
    uid, gid = swarm_project.identity
    assert result.exit_code == 0, (out, result.stderr, result.error)
    assert f"ids {uid} {gid}" in out
    assert "capeff 0000000000000000" in out
    assert "rootfs errno 30" in out  # EROFS
    assert "pids 48" in out
    assert f"memory {96 << 20}" in out
    assert f"tmp {8 << 20}" in out
    assert "nosuid" in out and "nodev" in out


def test_network_none_has_no_route_out(swarm_project):
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # shut by the test once the run is over
            accepted.append(server.accept())

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    gateway = _docker(
        "network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}"
    ).stdout.strip()
    script_worker(
        swarm_project,
        f"""
        import socket
        routes = open("/proc/net/route").read().splitlines()[1:]
        print("default", any(r.split()[1] == "00000000" for r in routes))
        for host in ({gateway!r}, "192.0.2.1"):  # the host, and TEST-NET-1 (never routed)
            s = socket.socket()
            s.settimeout(3)
            print("connect", host, s.connect_ex((host, {port})))
        """,
    )
    try:
        with Orchestrator(swarm_project.root, backend="swarm") as orch:
            result = orch.run("w")
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        server.close()
        listener.join(timeout=5)
    assert not listener.is_alive()
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "default False" in result.stdout
    assert f"connect {gateway} 0" not in result.stdout
    assert "connect 192.0.2.1 0" not in result.stdout
    assert not accepted


def test_a_secret_is_a_swarm_secret_file_never_env_and_removed_after(swarm, project):
    project.extra = (
        "isolation: {untrusted: runc, session: runc}\n"
        "credentials:\n  api: {source: env, env: API_TOKEN}\n"
    )
    project.write_project()
    script_worker(
        project,
        """
        import os
        value = open("/run/secrets/api").read()
        print("env has it:", any(value in v for v in os.environ.values()))
        print("mode", oct(os.stat("/run/secrets/api").st_mode & 0o777))
        print("leak attempt:", value)
        """,
        "trust: session\nsecrets: [api]",
    )
    os.environ["API_TOKEN"] = TOKEN
    try:
        with Orchestrator(project.root, backend="swarm") as orch:
            result = orch.run("w")
    finally:
        del os.environ["API_TOKEN"]
    assert result.exit_code == 0, (result.stdout, result.stderr, result.error)
    assert "env has it: False" in result.stdout
    assert "mode 0o400" in result.stdout
    assert "leak attempt: [REDACTED]" in result.stdout
    assert not _gone(swarm, os.getpid())  # service, network and secret gone
    names = _docker("secret", "ls", "--format", "{{.Name}}").stdout
    assert result.run_id not in names


def test_gvisor_is_refused_naming_the_opt_out(swarm, project):
    script_worker(project, "print('never')")
    done = cli("run", "w", "--project", str(project.root), "--engine", "swarm")
    assert done.returncode == 125
    assert "isolation: {untrusted: runc}" in done.stderr
    assert "Traceback" not in done.stderr
    services = _docker("service", "ls", "--format", "{{.Name}}", "--filter", f"label={SWARM}")
    assert "orchestrator-" not in services.stdout


def test_plan_states_what_the_swarm_does_not_enforce(project):
    script_worker(project, "print(1)")
    done = cli("plan", "w", "--project", str(project.root), "--engine", "swarm", "--json")
    assert done.returncode == 0, done.stderr
    swarm = done.json()["swarm"]
    text = " ".join(swarm["not_enforced"])
    assert "no-new-privileges" in text and "seccomp" in text and "nosuid" in text
    assert "setuid or setgid file is refused" in text and "stripped" in text
    assert "gVisor" in swarm["refused"]


def test_a_sigkilled_run_leaves_a_service_that_gc_removes(swarm, project):
    project.extra = (
        "isolation: {untrusted: runc, session: runc}\n"
        "credentials:\n  api: {source: env, env: API_TOKEN}\n"
    )
    project.write_project()
    script_worker(project, "import time; time.sleep(120)", "trust: session\nsecrets: [api]")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "w", "--engine", "swarm",
         "--project", str(project.root)],
        env={**os.environ, "API_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kinds = {o.kind for o in _ours(swarm, proc.pid)}
            if {"service", "network", "secret"} <= kinds:
                break
            time.sleep(0.2)
        assert {"service", "network", "secret"} <= kinds
        service = next(o.name for o in _ours(swarm, proc.pid) if o.kind == "service")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _ours(swarm, proc.pid)  # left behind
    done = cli("gc", "--project", str(project.root), "--json")
    assert done.returncode == 0, done.stderr
    removed = {(o["kind"]) for o in done.json()["removed"]}
    assert {"service", "network", "secret"} <= removed
    assert not _gone(swarm, proc.pid)
    label = f"label=com.docker.swarm.service.name={service}"
    deadline = time.monotonic() + 15  # the engine stops and removes a running task's container
    while (left := _docker("ps", "-aq", "--filter", label).stdout.split()) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert not left  # its task's container went with it


def test_an_allowlist_reaches_the_listed_host_through_the_proxy_only(engine, swarm, swarm_project):
    from tests.integration.test_egress import (
        TESTWEB_IMAGE,
        build_test_images,
        last_json,
        probe_script,
    )

    build_test_images(engine)

    api = swarm.api
    net = f"svc-swarm-{os.getpid()}"  # the user's own service network: a swarm overlay
    api.create_network(net, driver="overlay", attachable=True)
    web = None
    try:
        web = api.create_container(
            image=TESTWEB_IMAGE,
            name=f"orchestrator-test-swarmweb-{os.getpid()}",
            environment={"TESTWEB_NAME": "service"},
            labels={"io.orchestrator.test": "swarm"},
            host_config=api.create_host_config(
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
                network_mode=net,
            ),
            networking_config={"EndpointsConfig": {net: {"Aliases": ["web", "other"]}}},
        )["Id"]
        api.start(web)
        address = ""
        deadline = time.monotonic() + 10
        while not address and time.monotonic() < deadline:
            networks = api.inspect_container(web)["NetworkSettings"]["Networks"]
            address = (networks.get(net) or {}).get("IPAddress", "")
            time.sleep(0.1)
        swarm_project.extra += f"network:\n  services:\n    - network: {net}\n"
        swarm_project.write_project()
        jobs = [
            ["fetch", "listed", f"http://web.{net}/"],
            ["fetch", "unlisted", f"http://other.{net}/"],
            ["fetch", "internet", "http://example.com/"],
            ["connect", "direct", address, 80],
            ["resolve", "dns", "example.com"],
        ]
        script_worker(swarm_project, probe_script(jobs), f"network: {{allow: [web.{net}]}}")
        done = cli("run", "w", "--project", str(swarm_project.root), "--engine", "swarm", "--json")
        assert done.returncode == 0, done.stderr
        result = done.json()
        seen = last_json(result["stdout"])
        assert seen["listed"][:2] == ["ok", 200], seen
        assert seen["unlisted"][:2] == ["http-error", 403], seen
        assert seen["internet"][:2] == ["http-error", 403], seen
        assert seen["direct"][0] == "failed", seen  # only through the proxy
        assert seen["dns"][0] == "failed", seen
        verdicts = {(d["host"], d["allowed"]) for d in result["egress"]}
        assert (f"web.{net}", True) in verdicts and (f"other.{net}", False) in verdicts
    finally:
        if web is not None:
            api.remove_container(web, force=True)
        for _ in range(50):  # the proxy's endpoint leaves the network a moment later
            if _docker("network", "rm", net).returncode == 0 or net not in _networks():
                break
            time.sleep(0.2)


def test_a_timeout_removes_the_service_and_exits_124(swarm, swarm_project):
    script_worker(swarm_project, "import time; time.sleep(60)")
    started = time.monotonic()
    done = cli(
        "run", "w", "--project", str(swarm_project.root), "--engine", "swarm", "--json",
        "--timeout", "3",
    )  # fmt: skip
    assert done.returncode == 124, done.stderr
    assert done.json()["status"] == "timeout"
    assert time.monotonic() - started < 30
    assert not _gone(swarm, os.getpid())


def test_fail_fast_removes_the_services_still_running(swarm, swarm_project, tmp_path):
    script_worker(
        swarm_project,
        """
        import os, sys, time
        text = open("/inputs/" + sorted(os.listdir("/inputs"))[0]).read()
        if text == "fail":
            time.sleep(2)  # the others are running by now
            sys.exit(3)
        time.sleep(60)
        """,
    )
    folder = tmp_path / "in"
    folder.mkdir()
    for n, text in enumerate(["fail", "sleep", "sleep"]):
        (folder / f"d{n}.txt").write_text(text)
    started = time.monotonic()
    done = cli(
        "batch", "w", "--inputs", str(folder), "--engine", "swarm", "--concurrency", "3",
        "--fail-fast", "--json", "--project", str(swarm_project.root),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 45  # not the sleepers' 60 s
    summary = batch_summary(done.stdout)
    assert summary["failed"] == 1 and summary["cancelled"] == 2, summary
    services = _docker("service", "ls", "--format", "{{.Name}}", "--filter", f"label={SWARM}")
    assert "orchestrator-" not in services.stdout


def test_a_zone_holding_the_engine_socket_is_refused_before_any_service(swarm, swarm_project):
    swarm_project.zones["engine"] = ("/var/run", "ro", "")
    swarm_project.write_project()
    script_worker(swarm_project, "print(1)", "sandbox: {zones: [{name: engine, mode: ro}]}")
    done = cli("run", "w", "--project", str(swarm_project.root), "--engine", "swarm")
    assert done.returncode == 125, done.stderr
    assert "engine" in done.stderr and "Traceback" not in done.stderr
    assert not _ours(swarm, os.getpid())


def test_the_node_check_passes_on_this_node_and_leaves_nothing(swarm, swarm_project):
    zone = swarm_project.zone("data", "ro", files={"a.txt": "a"})
    script_worker(swarm_project, "print(1)", "sandbox: {zones: [{name: data, mode: ro}]}")
    with Orchestrator(swarm_project.root) as orch:
        prepared = orch.prepare("w")
        started = time.monotonic()
        SwarmBackend(swarm).check_nodes(
            prepared, force=True
        )  # probed, although this is the only node
        took = time.monotonic() - started
    assert zone.is_dir() and took < 30
    assert not [p.name for p in prepared.paths.sandbox_root.iterdir() if "node-check" in p.name]
    assert not _gone(swarm, os.getpid())
    names = _docker("ps", "-a", "--format", '{{.Label "com.docker.swarm.service.name"}}').stdout
    assert "orchestrator-nodes-" not in names  # the probe's task container went with it
