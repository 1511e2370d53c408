"""The isolation runtime: gVisor for untrusted workers by default, runc only where the
project file says so, shown by ``plan``, recorded in the audit log, refused in one line
(exit 125) when the engine lacks it. Through the real command line."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project
from orchestrator.docker import runtimes
from tests.integration.conftest import cli, require_gvisor

#: Prints the kernel release the worker's system calls reach.
RELEASE = ["python3", "-c", "import os; print('release', os.uname().release)"]


def release_worker(project, name: str, front: str = "") -> None:
    project.worker(name, f"command: {json.dumps(RELEASE)}\n{front}")


def started(project, run_id: str):
    log = AuditLog(load_project(project.root).sandbox_root / "audit.jsonl")
    entries = log.query(AuditFilter(operation="run.started", run=run_id))
    assert len(entries) == 1, entries
    return entries[0].metadata


@pytest.mark.docker
def test_untrusted_runs_under_gvisor_shown_by_plan_and_audited(engine, project):
    require_gvisor(engine)
    release_worker(project, "w")
    shown = cli("plan", "w", "--project", str(project.root))
    assert shown.returncode == 0, shown.stderr
    assert "isolation   gvisor (runsc" in shown.stdout
    plan = cli("plan", "w", "--project", str(project.root), "--json").json()
    assert plan["isolation"] == "gvisor"

    done = cli("run", "w", "--project", str(project.root), "--json")
    assert done.returncode == 0, done.stderr
    assert "isolation gvisor" in done.stderr
    result = done.json()
    assert f"release {os.uname().release}\n" != result["stdout"]  # gVisor's kernel answered
    metadata = started(project, result["run_id"])
    assert (metadata["isolation"], metadata["runtime"]) == ("gvisor", runtimes.GVISOR_NONE)


@pytest.mark.docker
def test_the_project_file_opts_untrusted_workers_into_runc(engine, project):
    project.extra = "isolation: {untrusted: runc}\n"
    project.write_project()
    release_worker(project, "w")
    plan = cli("plan", "w", "--project", str(project.root), "--json").json()
    assert (plan["trust"], plan["isolation"]) == ("untrusted", "runc")
    done = cli("run", "w", "--project", str(project.root), "--json")
    assert done.returncode == 0, done.stderr
    result = done.json()
    assert result["stdout"] == f"release {os.uname().release}\n"  # the host's own kernel
    metadata = started(project, result["run_id"])
    assert (metadata["isolation"], metadata["runtime"]) == ("runc", "runc")


@pytest.mark.docker
def test_a_worker_may_ask_for_gvisor_on_a_network_never_for_runc_below_its_level(engine, project):
    require_gvisor(engine)
    release_worker(project, "strong", "trust: session\nisolation: gvisor\nnetwork: full")
    release_worker(project, "weak", "isolation: runc")
    root = str(project.root)
    from orchestrator.docker.netnames import full_network
    from orchestrator.docker.networks import release_network
    from orchestrator.plan import project_key

    try:
        done = cli("run", "strong", "--project", root, "--json")
    finally:
        # the project's, shared network
        release_network(engine, full_network(project_key(project.root)))
    assert done.returncode == 0, done.stderr
    result = done.json()
    assert result["stdout"] != f"release {os.uname().release}\n"
    metadata = started(project, result["run_id"])
    assert metadata["network"] == "full"
    assert (metadata["isolation"], metadata["runtime"]) == ("gvisor", runtimes.GVISOR_NETWORK)

    refused = cli("run", "weak", "--project", root)
    assert refused.returncode == 125
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, refused.stderr
    assert "isolation: 'runc' is weaker than" in lines[0]
    assert "isolation.untrusted: gvisor" in lines[0]
    # Lowering a trusted worker's level lowers nothing else: --trust untrusted gets gVisor.
    release_worker(project, "trusted", "trust: session")
    plan = cli("plan", "trusted", "--project", root, "--trust", "untrusted", "--json").json()
    assert plan["isolation"] == "gvisor"


#: An untrusted parent: one child that answers, then what the broker must refuse.
PARENT = """
import errno, os, socket, subprocess
def call(*argv):
    return subprocess.run(["orchestrator-call", *argv], capture_output=True, text=True)
done = call("kid", "--attach", "/data/a.txt")
print("kid", done.returncode, done.stdout.strip())
for child in ("greedy", "stranger"):
    done = call(child)
    print(child, done.returncode, done.stderr.strip())
print("attach", call("kid", "--attach", "/etc/passwd").stderr.strip())
with socket.socket(socket.AF_UNIX) as conn:  # the socket itself, with what is no request
    conn.connect(os.environ["ORCHESTRATOR_BROKER"])
    conn.sendall(b"not json\\n")
    print("raw", conn.makefile().readline().strip())
with socket.socket(socket.AF_UNIX) as conn:  # another host socket in its mounts
    try:
        conn.connect("/data/host.sock")
        print("host socket connected")
    except OSError as e:
        print("host socket", errno.errorcode[e.errno])
"""
KID = "import os; print(open('/data/a.txt').read(), 'from kid under', os.uname().release)"


@pytest.mark.docker
def test_an_untrusted_parent_calls_its_child_with_the_same_refusals_as_runc(
    engine, project, isolation
):
    data = project.zone("data", "rw", files={"a.txt": "x"}, extra="untrusted_output: true")
    for name, script, front in (
        ("main", PARENT, "children: [kid, greedy]\nsandbox: {zones: [{name: data}]}"),
        ("kid", KID, "sandbox: {zones: [{name: data}]}"),
        ("greedy", "pass", "sandbox: {zones: [{name: data, mode: rw}]}"),
        ("stranger", "pass", ""),
    ):
        project.worker(name, f"command: {json.dumps(['python3', '-c', script])}\n{front}")
    # A host socket in the parent's zone that no worker may use (mode 000; a worker is never
    # root): runsc's --host-uds=open lets the sandbox reach it, its kernel checks the mode.
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(data / "host.sock"))
        os.chmod(data / "host.sock", 0)
        server.listen(1)
        server.settimeout(0.1)
        done = cli("run", "main", "--project", str(project.root), "--json")
        with pytest.raises(TimeoutError):
            server.accept()  # nobody connected
    assert done.returncode == 0, done.stderr
    result = done.json()
    lines = result["stdout"].splitlines()
    assert lines[5] == "host socket EACCES", result["stdout"]
    host = os.uname().release
    kid = [line for line in lines if line.startswith("kid ")]
    assert kid == [f"kid 0 x from kid under {host if isolation == 'runc' else kid[0].split()[-1]}"]
    assert (kid[0].split()[-1] != host) is (isolation == "gvisor"), kid
    assert (
        "greedy 125 orchestrator-call: refused: child 'greedy' asks rw on 'data' but parent "
        "'main' has ro" in result["stdout"]
    ), lines
    assert (
        "stranger 125 orchestrator-call: refused: parent 'main' may not call 'stranger'" in lines[2]
    )
    assert lines[3] == (
        "attach orchestrator-call: refused: Cannot read '/etc/passwd': outside the sandbox: it "
        "is in no granted zone. Readable: /data, /session, /workers"
    )
    raw = json.loads(lines[4].removeprefix("raw "))
    assert raw == {
        "ok": False,
        "error": "bad request: request is not JSON (Expecting value at byte 0)",
    }

    log = AuditLog(load_project(project.root).sandbox_root / "audit.jsonl")
    parent = started(project, result["run_id"])
    (call,) = log.query(AuditFilter(operation="broker.call", run=result["run_id"]))
    child = started(project, call.metadata["child_run"])
    expected = {
        "runc": ("runc", "runc"),
        "gvisor": (runtimes.GVISOR_BROKER_NONE, runtimes.GVISOR_NONE),  # only the parent's
    }[isolation]
    assert (parent["runtime"], child["runtime"]) == expected
    refused = log.query(AuditFilter(operation="broker.refused", run=result["run_id"]))
    assert sorted(str(e.metadata["child"]) for e in refused) == [
        "None",
        "greedy",
        "kid",
        "stranger",
    ]
    assert all(e.reason and not e.allowed for e in refused)


class FakeDocker(BaseHTTPRequestHandler):
    """An engine that answers who it is and which runtimes it has (only runc), and
    records everything else it is asked, answering it with an error."""

    protocol_version = "HTTP/1.1"
    others: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rsplit("/", 1)[-1]
        if path == "version":
            self.answer(200, {"Version": "20.10.24", "ApiVersion": "1.41", "Components": []})
        elif path == "info":
            self.answer(200, {"Runtimes": {"runc": {"path": "runc"}}, "DefaultRuntime": "runc"})
        elif path == "_ping":
            self.answer(200, "OK")
        else:
            self.refuse()

    def do_POST(self) -> None:
        self.refuse()

    do_DELETE = do_PUT = do_POST

    def refuse(self) -> None:
        self.others.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.answer(500, {"message": "not in this fake"})

    def answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) client address
        request, _ = super().get_request()
        return request, ("fake", 0)


@pytest.fixture
def engine_without_gvisor(tmp_path: Path):
    """DOCKER_HOST for an engine without a gVisor runtime (a fake one: dockerd stays
    untouched); yields the requests it got besides version, info and ping."""
    path = tmp_path / "docker.sock"
    FakeDocker.others = []
    server = UnixServer(str(path), FakeDocker)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"unix://{path}", FakeDocker.others
    finally:
        server.shutdown()
        server.server_close()


def test_an_untrusted_run_without_the_runtime_exits_125_naming_the_setup(
    project, engine_without_gvisor
):
    host, others = engine_without_gvisor
    release_worker(project, "w")
    env = {"DOCKER_HOST": host}
    done = cli("run", "w", "--project", str(project.root), env=env)
    assert done.returncode == 125, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("orchestrator: error")]
    assert len(errors) == 1, done.stderr
    assert "no 'orchestrator-runsc' runtime" in errors[0]
    assert f"`{runtimes.setup_command()}`" in errors[0]
    assert "apt-get install runsc" in errors[0]
    assert "`isolation: {untrusted: runc}` in the project file" in errors[0]
    assert others == []  # refused before anything was created, or even listed
    # The refusal is audited.
    log = AuditLog(load_project(project.root).sandbox_root / "audit.jsonl")
    ended = log.query(AuditFilter(operation="run.ended"))
    assert len(ended) == 1 and not ended[0].allowed
    assert "orchestrator engine setup --gvisor" in (ended[0].reason or "")

    as_json = cli("run", "w", "--project", str(project.root), "--json", env=env)
    assert as_json.returncode == 125
    assert "engine setup --gvisor" in as_json.json()["error"]["message"]


@pytest.mark.docker
def test_engine_setup_is_idempotent_and_needs_root(engine):
    require_gvisor(engine)
    if os.geteuid() != 0:
        refused = cli("engine", "setup", "--gvisor")
        assert refused.returncode == 125
        assert "run it as root, `sudo " in refused.stderr
        return
    before = runtimes.DAEMON_JSON.read_bytes()
    done = cli("engine", "setup", "--gvisor", "--json")
    assert done.returncode == 0, done.stderr
    assert done.json()["runsc_version"].startswith("runsc version ")
    assert done.json() | {"runsc": None, "runsc_version": None} == {
        "apt_source_written": None,  # a working runsc: nothing installed, no source written
        "backup": None,
        "changed": False,
        "reloaded": False,
        "runsc": None,
        "runsc_installed": False,
        "runsc_version": None,
        "runtimes": list(runtimes.GVISOR_ARGS),
    }
    assert runtimes.DAEMON_JSON.read_bytes() == before  # not rewritten, not even touched
