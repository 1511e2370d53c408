"""``--engine swarm`` on two nodes: this engine (the manager) and a Docker-in-Docker node.

The second node is a container of ``images/dind`` (Debian's docker.io on the project's base
image, built once for this module and removed after unless it was there before), on a
network the module makes, with the module's shared folder bind-mounted at the same path (a
stand-in for a shared file system such as NFS), its own storage (vfs) and the worker image
loaded into it (``docker save | docker -H ... load``). It joins the session's swarm with the
worker token. At the end it leaves, is removed from the node list, and its container, its
volume, the network, its cgroups and the image go: the engine is left as found.

Such a container needs nearly every capability. ``--privileged`` would be the usual way, but
an engine that lacks one capability itself (as on the machines these tests were written on,
where CAP_SYS_RESOURCE is not in the engine's bounding set) cannot start privileged
containers, so the node gets the capabilities this process has, no seccomp or AppArmor
profile, unmasked ``/proc`` paths and the host's cgroup folders (its containers under a
cgroup parent of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import docker
import pytest
import requests

from orchestrator.docker.images import BASE_REPOSITORY, WORKER_IMAGE, build_image, host_suite
from tests.conftest import ProjectDir
from tests.integration.conftest import batch_of_docs, cli, script_worker, swarm_gone, unavailable

pytestmark = pytest.mark.docker

DIND_IMAGE = "orchestrator/test-dind:latest"
TEST_LABEL = {"io.orchestrator.test": "swarm-nodes"}
#: Linux capability names by bit number.
CAPS = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
]


def _capabilities() -> list[str]:
    """The capabilities in this process's bounding set (those the engine can grant)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if "CapBnd" in x)
    bits = int(line.split()[1], 16)
    return [name for bit, name in enumerate(CAPS) if bits >> bit & 1]


def _remove_cgroups(parent: str) -> None:
    """The cgroup folders the node's engine made under its parent, deepest first."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        top = controller / parent
        if not top.is_dir():
            continue
        for folder in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
            if folder.is_dir():
                folder.rmdir()
        top.rmdir()


class SecondNode:
    def __init__(self, api: docker.APIClient, node_id: str, hostname: str, shared: Path):
        self.api, self.node_id, self.hostname, self.shared = api, node_id, hostname, shared


@pytest.fixture(scope="module")
def second_node(swarm, engine, tmp_path_factory):
    if engine.api.info().get("CgroupVersion") not in (None, "1"):
        unavailable("the Docker-in-Docker node is set up for cgroup v1 hosts")
    address = (swarm.api.info().get("Swarm") or {}).get("NodeAddr", "")
    if address.startswith("127.") or not address:
        unavailable(f"the swarm's manager advertises {address!r}, which another node cannot reach")
    api = swarm.api
    token = api.inspect_swarm()["JoinTokens"]["Worker"]
    managers = [m["Addr"] for m in api.info()["Swarm"]["RemoteManagers"]]
    had_image = engine.image_exists(DIND_IMAGE)
    if not had_image:
        base = f"{BASE_REPOSITORY}:{host_suite()}"
        build_image(engine, "dind", DIND_IMAGE, base, lambda _: None)
    shared = tmp_path_factory.mktemp("shared")
    tag = f"orchestrator-test-node-{os.getpid()}"
    nodes_before = {n["ID"] for n in api.nodes()}
    network = container = None
    ip = ""
    try:
        network = api.create_network(tag, driver="bridge", labels=TEST_LABEL)["Id"]
        host_config = api.create_host_config(
            cap_add=_capabilities(),
            security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            binds={
                str(shared): {"bind": str(shared), "mode": "rw"},
                "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
            },
            network_mode=tag,
        )
        host_config["MaskedPaths"] = []  # dockerd writes /proc/sys (forwarding)
        host_config["ReadonlyPaths"] = []
        container = api.create_container(
            DIND_IMAGE,
            name=tag,
            hostname=tag,
            labels=TEST_LABEL,
            host_config=host_config,
            # A task's image is pulled before it starts, unless this is set: no registry
            # answers here, and the attempt would hang until it times out.
            environment={"DOCKER_SERVICE_PREFER_OFFLINE_IMAGE": "1"},
            command=[
                "dockerd", "--host=tcp://0.0.0.0:2375", "--tls=false",
                "--storage-driver=vfs", f"--cgroup-parent=/{tag}", "--bip=10.213.0.1/24",
                # Its own networks (docker_gwbridge) from a pool of their own: from the
                # default pools it would take 172.17.0.0/16 and hide the manager's address.
                "--default-address-pool=base=10.214.0.0/16,size=24",
            ],
        )["Id"]  # fmt: skip
        api.start(container)
        ip = api.inspect_container(container)["NetworkSettings"]["Networks"][tag]["IPAddress"]
        node = docker.APIClient(base_url=f"tcp://{ip}:2375", version="1.41", timeout=120)
        deadline = time.monotonic() + 60
        while True:
            try:
                node.ping()
                break
            except (docker.errors.DockerException, requests.RequestException):
                if time.monotonic() > deadline:
                    logs = api.logs(container).decode(errors="replace")[-2000:]
                    unavailable(f"the Docker-in-Docker node did not start: {logs}")
                time.sleep(0.3)
        load = subprocess.run(
            ["bash", "-o", "pipefail", "-c",
             f"docker save {WORKER_IMAGE} | docker -H tcp://{ip}:2375 load"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert load.returncode == 0, load.stderr
        node.join_swarm(managers, token, listen_addr="0.0.0.0:2377", advertise_addr=ip)
        node_id = node.info()["Swarm"]["NodeID"]
        deadline = time.monotonic() + 60
        while (api.inspect_node(node_id).get("Status") or {}).get("State") != "ready":
            assert time.monotonic() < deadline, "the second node did not become ready"
            time.sleep(0.3)
        yield SecondNode(node, node_id, tag, shared)
    finally:
        if container is not None:
            with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
                docker.APIClient(base_url=f"tcp://{ip}:2375", version="1.41").leave_swarm(
                    force=True
                )
            for n in api.nodes():
                if n["ID"] not in nodes_before:
                    api.remove_node(n["ID"], force=True)
            api.remove_container(container, force=True, v=True)
            _remove_cgroups(tag)
        if network is not None:
            api.remove_network(network)
        if not had_image:
            engine.api.remove_image(DIND_IMAGE)
    assert {n["ID"] for n in api.nodes()} == nodes_before
    assert not api.containers(all=True, filters={"label": "io.orchestrator.test=swarm-nodes"})


@pytest.fixture
def shared_project(second_node, request):
    root = second_node.shared / request.node.name[:40]
    p = ProjectDir(root)
    p.extra = "isolation: {untrusted: runc, session: runc}\n"
    p.write_project()
    return p


def test_a_batch_spreads_over_both_nodes_and_its_results_are_collected(
    swarm, second_node, shared_project, tmp_path
):
    script_worker(
        shared_project,
        """
        import os, time
        name = sorted(os.listdir("/inputs"))[0]
        text = open(os.path.join("/inputs", name)).read()
        time.sleep(1)  # long enough for the scheduler to spread the next ones
        open("/staged/result.txt", "w").write("seen " + text)
        """,
    )
    args = ["--engine", "swarm", "--concurrency", "4"]
    summary = batch_of_docs(shared_project, tmp_path / "in", 20, *args, timeout=400)
    assert summary["succeeded"] == 20 and summary["change_files"] == 21  # + the manifest
    shown = cli("staged", "show", summary["change_id"], "--project", str(shared_project.root))
    assert "0020-d19.txt/result.txt" in shown.stdout and "seen doc 19" in shown.stdout
    audit = shared_project.root / ".sandbox" / "audit.jsonl"
    ended = [json.loads(line) for line in audit.read_text().splitlines() if '"run.ended"' in line]
    ran_on = [e["metadata"]["node"] for e in ended]
    assert len(ran_on) == 20
    manager = swarm.local_node_id()
    assert set(ran_on) == {manager, second_node.node_id}, ran_on
    assert not swarm_gone(swarm, os.getpid())


def test_a_zone_missing_on_the_other_node_is_refused_naming_it(
    swarm, second_node, shared_project, tmp_path
):
    elsewhere = tmp_path / "elsewhere"  # on this node only: not in the shared folder
    elsewhere.mkdir()
    shared_project.zones["data"] = (str(elsewhere), "ro", "")
    shared_project.write_project()
    script_worker(shared_project, "print(1)", "sandbox: {zones: [{name: data, mode: ro}]}")
    done = cli("run", "w", "--project", str(shared_project.root), "--engine", "swarm")
    assert done.returncode == 125, done.stderr
    assert "Traceback" not in done.stderr
    line = next(x for x in done.stderr.splitlines() if "error:" in x)
    assert f"on node {second_node.hostname} (" in line
    assert f"{elsewhere} does not exist" in line
    assert "NFS" in line and "drain" in line
    assert not swarm_gone(swarm, os.getpid())


def test_an_image_missing_on_the_other_node_is_refused_naming_it(
    swarm, second_node, shared_project
):
    script_worker(shared_project, "print(1)", "network: {allow: [example.com]}")
    done = cli("run", "w", "--project", str(shared_project.root), "--engine", "swarm")
    assert done.returncode == 125, done.stderr
    assert "Traceback" not in done.stderr
    line = next(x for x in done.stderr.splitlines() if "error:" in x)
    assert f"node {second_node.hostname} (" in line
    assert "lacks image orchestrator/proxy:latest" in line
    assert "docker save orchestrator/proxy:latest | docker -H NODE load" in line
    assert not swarm_gone(swarm, os.getpid())
