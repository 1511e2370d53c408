"""Integration fixtures: a real engine, the worker image, and a final leak check.

On a laptop without Docker these tests skip; under CI (CI=true) an unreachable engine is a
failure, never a skip.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from orchestrator import labels
from orchestrator.config import load_project, load_worker
from orchestrator.errors import OrchestratorError
from orchestrator.prepare import prepare
from orchestrator.runtime import RunResult, execute, open_audit
from orchestrator.runtime.container import ContainerBackend
from tests.conftest import alive as alive
from tests.conftest import wait_until as wait_until

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def unavailable(message: str) -> NoReturn:
    """Skip a test whose means are missing here; under CI=true that is a failure."""
    if IN_CI:
        pytest.fail(f"CI=true and {message}")
    pytest.skip(message)


@pytest.fixture(scope="session")
def engine():
    from orchestrator.docker import DockerEngine
    from orchestrator.docker.images import WORKER_IMAGE, build_all

    try:
        eng = DockerEngine()
        eng.ping()
    except OrchestratorError as exc:
        unavailable(f"the Docker engine is unreachable: {exc}")
    # One build at a time: under `pytest -n` every worker process has this fixture.
    with open(Path(tempfile.gettempdir()) / "orchestrator-tests-images.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not eng.image_exists(WORKER_IMAGE):
            build_all(eng)
    yield eng
    # Spare credential proxies outlive runs by design (they exit when not taken); the ones
    # this process's runs left ready go with its tests (another test process may be using
    # its own).
    from orchestrator.docker.credproxy_spares import remove_spares

    eng.spares.wait()
    remove_spares(eng, 0, made_by=os.getpid())
    # The suite's last word: nothing labelled by this run of the tests is left.
    # Shared egress proxies and networks outlive runs by design (gc removes them when
    # idle); the egress tests remove their own. Everything else must be gone.
    owned = [o for o in eng.list_managed() if o.labels.get(labels.SHARED) != "true"]
    leftovers = [o for o in owned if labels.owner_state(o.labels) != "alive"]
    leftovers += [o for o in owned if o.labels.get(labels.OWNER_PID) == str(os.getpid())]
    for obj in leftovers:
        eng.remove_object(obj)
    assert not leftovers, f"tests left labelled objects behind: {leftovers}"
    # Nor any pinned mount source (runtime.mount_sources) of a finished or killed run of
    # this suite (pins of other live processes on the machine are theirs).
    from orchestrator.runtime.mount_sources import PIN_ROOT, sweep_pins

    swept = sweep_pins()
    mine = [
        folder.name
        for folder in (PIN_ROOT.iterdir() if PIN_ROOT.is_dir() else [])
        if f'"pid": {os.getpid()},' in _read_or_empty(folder / "owner.json")
    ]
    assert not swept and not mine, f"tests left pinned mount sources behind: {swept + mine}"


#: The isolation runtimes the key tests run under (``isolation`` fixture).
ISOLATIONS = ("runc", "gvisor")


def require_gvisor(engine) -> None:
    """Skip unless the engine has the gVisor runtimes; under CI=true that is a failure
    (``make test`` sets them up). Podman never has them: gVisor is set up for Docker only."""
    from orchestrator.docker import podman, runtimes

    if podman.engine_kind(engine).podman:
        pytest.skip("gVisor is set up for Docker only (docs/engines.md)")
    missing = sorted(set(runtimes.GVISOR_ARGS) - set(runtimes.engine_runtimes(engine)))
    if missing:
        unavailable(f"no gVisor runtime ({', '.join(missing)}): `{runtimes.setup_command()}`")


@pytest.fixture(params=ISOLATIONS)
def isolation(request, engine, project) -> str:
    """The test once per isolation runtime: the project file sets it for every trust level."""
    if request.param == "gvisor":
        require_gvisor(engine)
    project.isolation = request.param
    project.write_project()
    return request.param


@pytest.fixture
def run_worker(engine, project):
    """Write a worker whose command is a Python script, run it, return the result."""

    def run(script: str, front: str = "", name: str = "w", **kwargs) -> RunResult:
        command = json.dumps(["python3", "-c", textwrap.dedent(script)])
        project.worker(name, f"command: {command}\n{textwrap.dedent(front).strip()}")
        loaded = load_project(project.root)
        prepared = prepare(loaded, load_worker(loaded, name), **kwargs)
        return execute(ContainerBackend(engine), prepared, audit=open_audit(loaded), staging=None)

    return run


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
    """Run the real command line in a subprocess."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


def containers_of(engine, pid: int) -> list:
    return [
        o
        for o in engine.list_managed()
        if o.kind == "container" and o.labels.get(labels.OWNER_PID) == str(pid)
    ]


# -- a swarm (test_swarm.py, test_swarm_nodes.py) ------------------------------------------


def script_worker(project, script: str, front: str = "sandbox: {}", name: str = "w") -> None:
    """A worker whose command is a Python script (dedented)."""
    command = json.dumps(["python3", "-c", textwrap.dedent(script)])
    project.worker(name, f"command: {command}\n{front}")


def batch_summary(stdout: str) -> dict:
    """The last ``summary`` line of ``orchestrator batch --json``."""
    return [json.loads(line) for line in stdout.splitlines() if '"summary"' in line][-1]


def batch_of_docs(project, folder, count: int, *args: str, timeout: float = 300) -> dict:
    """``orchestrator batch w --json`` over ``count`` new inputs (``dNN.txt``, "doc N") in
    ``folder``; asserts it exited 0 and returns its summary."""
    folder.mkdir()
    for n in range(count):
        (folder / f"d{n:02d}.txt").write_text(f"doc {n}")
    done = cli(
        "batch", "w", "--inputs", str(folder), *args, "--json",
        "--project", str(project.root), timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return batch_summary(done.stdout)


def swarm_docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False)


def _swarm_networks() -> set[str]:
    """The networks a swarm brings: its own (scope swarm) and the node's gateway bridge.
    (Other tests on this engine make and remove local networks meanwhile.)"""
    rows = swarm_docker("network", "ls", "--format", "{{.Name}} {{.Scope}}").stdout.splitlines()
    return {
        name
        for name, _, scope in (row.partition(" ") for row in rows)
        if scope == "swarm" or name == "docker_gwbridge"
    }


def swarm_ours(swarm, pid: int) -> list:
    return [o for o in swarm.list_managed() if o.labels.get(labels.OWNER_PID) == str(pid)]


def swarm_gone(swarm, pid: int, within: float = 15) -> list:
    """What is still there after ``within`` s: a removed overlay network leaves this node's
    listing a moment after the manager has removed it."""
    deadline = time.monotonic() + within
    while (left := swarm_ours(swarm, pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _advertise_address() -> str:
    """The engine's default bridge address (docker0's: its gateway, else the first address
    of its subnet, as the engine assigns it): an address of this host that other nodes
    running in containers here can reach, unlike loopback; else loopback."""
    found = swarm_docker("network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}")
    try:
        configs = json.loads(found.stdout or "null") or []
    except ValueError:
        configs = []
    for config in configs:
        if config.get("Gateway"):
            return str(config["Gateway"])
        if config.get("Subnet") and ":" not in config["Subnet"]:
            return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    return "127.0.0.1"


@pytest.fixture(scope="session")
def swarm(engine):
    """This engine as a swarm manager: when it is in no swarm, ``docker swarm init`` on the
    default bridge's gateway address, and at the end ``docker swarm leave --force`` and the
    ``docker_gwbridge`` its services caused removed (the swarm's networks are compared
    before and after). An engine already in a swarm is used and left as it is."""
    from orchestrator.docker.swarm import SwarmEngine

    state = swarm_docker("info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()
    made = state == "inactive"
    before = _swarm_networks()
    if made:
        done = swarm_docker("swarm", "init", "--advertise-addr", _advertise_address())
        if done.returncode != 0:
            unavailable(f"cannot make a single-node swarm: {done.stderr.strip()}")
    elif state != "active":
        unavailable(f"the engine's swarm state is {state!r}")
    eng = SwarmEngine()
    if not eng.is_manager():
        unavailable("the engine is in a swarm but not a manager")
    yield eng
    ours = swarm_gone(eng, os.getpid())
    for obj in ours:
        eng.remove(obj.kind, obj.id)
    if made:
        swarm_docker("swarm", "leave", "--force")
        if "docker_gwbridge" not in before:
            for _ in range(50):
                if swarm_docker("network", "rm", "docker_gwbridge").returncode == 0:
                    break
                if "docker_gwbridge" not in _swarm_networks():
                    break
                time.sleep(0.2)
        assert _swarm_networks() == before, "the swarm session left networks behind"
    assert not ours, f"tests left swarm objects behind: {ours}"


#: The test web server's image (images/testweb): answers with its name, port and host.
TESTWEB_IMAGE = "orchestrator/testweb:latest"


@contextmanager
def web_service(engine, role: str) -> Iterator[str]:
    """A test web server on a network of its own, answering as ``web`` and ``other``; the
    network's name. Removed after, with the allowlist proxy that joined it for ``web``."""
    from orchestrator.docker import egress as eg
    from orchestrator.docker import egress_gc as eg_gc
    from orchestrator.docker.images import BASE_REPOSITORY, build_image, host_suite

    require_gvisor(engine)
    base = f"{BASE_REPOSITORY}:{host_suite()}"
    eg.build_proxy_image(engine, base)
    build_image(engine, "testweb", TESTWEB_IMAGE, base, lambda _: None)
    net = f"svc-{role}-{uuid.uuid4().hex[:8]}"
    engine.api.create_network(net, driver="bridge")
    web = None
    try:
        web = engine.api.create_container(
            image=TESTWEB_IMAGE,
            name=f"orchestrator-test-{role}web-{os.getpid()}",
            environment={"TESTWEB_NAME": "service"},
            labels=engine.labels_for({f"{labels.PREFIX}.test": role}),
            host_config=engine.api.create_host_config(
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
                network_mode=net,
            ),
            networking_config={"EndpointsConfig": {net: {"Aliases": ["web", "other"]}}},
        )["Id"]
        engine.start(web)
        deadline = time.monotonic() + 20
        while b"listening" not in engine.api.logs(web):
            assert time.monotonic() < deadline, engine.api.logs(web).decode()
            time.sleep(0.05)
        yield net
    finally:
        if web is not None:
            engine.remove(web)
        try:
            eg_gc.remove_egress(engine, eg.egress_key(eg.validate_allowlist([f"web.{net}"]), [net]))
        finally:
            engine.api.remove_network(net)
