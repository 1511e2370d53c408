"""What is particular to Podman, tried against a real one (``pytest --engine=podman``).

The rest of the core subset (``make test-podman``) runs the ordinary integration tests
against the same service; these check what only Podman needs: that it is recognised, that
the project's seccomp profile (not Podman's default) is in force, that Podman's extra
writable tmpfs is closed, and the one-line refusals of what it cannot do (gVisor,
``network: full``, rootless on cgroup v1) with exit code 125 through the real command line.
"""

from __future__ import annotations

import json
import os
import platform
import textwrap

import pytest

from orchestrator.docker.podman import engine_kind
from tests.integration.conftest import cli, unavailable
from tests.podman_engine import RootlessPodman

pytestmark = pytest.mark.podman

#: ``get_mempolicy``: Podman's default seccomp profile allows it for everyone; the
#: project's (moby's) only with CAP_SYS_NICE, which a worker never has.
GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}

PROBE = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
mode = ctypes.c_int(0)
rc = libc.syscall({nr}, ctypes.byref(mode), None, 0, None, 0)
print("get_mempolicy", rc, errno.errorcode.get(ctypes.get_errno(), "-") if rc < 0 else "OK")
for path in ("/var/tmp/evil", "/run/evil"):
    try:
        open(path, "w").close()
        print(path, "written")
    except OSError as exc:
        print(path, errno.errorcode[exc.errno])
"""


def script_worker(project, name: str, script: str, front: str = "") -> None:
    command = json.dumps(["python3", "-c", textwrap.dedent(script)])
    project.worker(name, f"command: {command}\n{textwrap.dedent(front).strip()}")


def one_line_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("orchestrator: error")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_the_engine_is_recognised_as_rootful_podman(engine):
    kind = engine_kind(engine)
    assert kind.podman and not kind.rootless
    assert kind.missing_controllers == []
    assert kind.label.startswith("rootful Podman ")


@pytest.mark.parametrize("outbox", [False, True], ids=["main-process", "by-exec"])
def test_the_projects_seccomp_profile_is_in_force_and_var_tmp_is_read_only(engine, project, outbox):
    machine = platform.machine()
    if machine not in GET_MEMPOLICY:
        pytest.skip(f"no get_mempolicy number known for {machine}")
    front = "sandbox: {}" if outbox else ""
    script_worker(project, "probe", PROBE.format(nr=GET_MEMPOLICY[machine]), front)
    result = cli("run", "probe", "--project", str(project.root))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Podman's own default profile would answer OK: the profile handed over is ours.
    assert "get_mempolicy -1 EPERM" in lines, result.stdout
    # Podman mounts a writable tmpfs at /var/tmp of a read-only container; not here.
    assert "/var/tmp/evil EROFS" in lines, result.stdout
    assert "/run/evil EACCES" in lines, result.stdout  # root's, as under Docker


def test_a_gvisor_request_is_refused_in_one_line(engine, project):
    project.extra = "isolation: {untrusted: gvisor}\n"
    project.write_project()
    project.worker("w", 'command: ["true"]')
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 125, result.stderr
    line = one_line_error(result)
    assert "gVisor" in line and "Podman" in line and "isolation: {untrusted: runc}" in line
    assert not [o for o in engine.list_managed() if o.labels.get("io.orchestrator.worker")]


def test_network_full_is_refused_in_one_line(engine, project):
    project.extra = "untrusted_network: full\n"
    project.write_project()
    project.worker("w", 'command: ["true"]\nnetwork: full')
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 125, result.stderr
    line = one_line_error(result)
    assert "network: full" in line and "enable_icc" in line and "allowlist" in line


@pytest.fixture(scope="module")
def rootless():
    if os.getuid() != 0:
        unavailable("creating the rootless Podman test user needs root")
    service = RootlessPodman()
    try:
        yield service
    finally:
        service.close()


def test_rootless_podman_without_limit_controllers_is_refused_or_runs(rootless, project):
    """cgroup v1 (or v2 without delegated controllers): Podman would run the container
    without its memory and pids limits and only warn, so the run is refused before
    anything exists. Where the controllers are there, the run must work."""
    from orchestrator.docker import DockerEngine

    os.environ["DOCKER_HOST"], before = rootless.url, os.environ["DOCKER_HOST"]
    try:
        kind = engine_kind(DockerEngine())
    finally:
        os.environ["DOCKER_HOST"] = before
    assert kind.podman and kind.rootless
    project.worker("w", 'command: ["true"]\nresources: {memory: 64m, pids: 32}')
    result = cli("run", "w", "--project", str(project.root), env={"DOCKER_HOST": rootless.url})
    if not kind.missing_controllers:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 125, result.stderr
    line = one_line_error(result)
    assert "rootless Podman" in line and "cgroup v" in line, line
    assert "limits" in line and "Delegate=yes" in line, line
    # gc (listing by labels) works there all the same, and finds nothing left behind.
    collected = cli("gc", "--project", str(project.root), env={"DOCKER_HOST": rootless.url})
    assert collected.returncode == 0, collected.stderr


REACH_PROXY = """
import socket, struct
sock = socket.create_connection(("proxy", 3128), timeout=10)
print("proxy reached")
try:
    socket.create_connection(("192.0.2.1", 53), timeout=3)  # TEST-NET-1: never routed
    print("direct reached")
except OSError:
    print("direct refused")

def ask(server):
    name = b"".join(bytes([len(p)]) + p for p in b"exfil.example.invalid".split(b"."))
    query = struct.pack(">6H", 0x1234, 0x0100, 1, 0, 0, 0) + name + b"\\0" + struct.pack(">2H", 1, 1)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.settimeout(2)
    try:
        udp.sendto(query, (server, 53))
        udp.recvfrom(512)
        return "answered"
    except OSError:
        return "silent"

servers = [line.split()[1] for line in open("/etc/resolv.conf") if line.startswith("nameserver")]
print("dns", *sorted({ask(server) for server in servers} or {"silent"}))
"""


def test_an_allowlisted_run_reaches_only_its_hardened_proxy_and_no_dns(engine, project):
    from orchestrator.docker.egress import EGRESS_ROLE

    script_worker(project, "net", REACH_PROXY, 'network: {allow: ["example.test"]}')
    try:
        result = cli("run", "net", "--project", str(project.root))
        assert result.returncode == 0, result.stderr
        # No DNS server answers on the run's network: Podman's (aardvark-dns) would resolve
        # any name through the host's resolvers, a way out for data. See docs/engines.md.
        expected = ["proxy", "reached", "direct", "refused", "dns", "silent"]
        assert result.stdout.split() == expected, result.stdout
        proxies = engine.api.containers(filters={"label": f"{EGRESS_ROLE}=proxy"})
        assert proxies, "no egress proxy is running"
        for proxy in proxies:
            exec_id = engine.api.exec_create(proxy["Id"], ["cat", "/proc/self/status"])["Id"]
            status = engine.api.exec_start(exec_id).decode()
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            assert fields["CapEff"].strip() == "0000000000000000", status
            assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    finally:
        engine.collect_shared(0)  # the proxy and its outside network: nothing uses them now
