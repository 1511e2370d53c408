"""The isolation runtime: gVisor for untrusted workers by default, runc only where the
project file says so, shown by ``plan``, recorded in the audit log, refused in one line
(exit 125) when the engine lacks it. Through the real command line."""

from __future__ import annotations

import json
import os
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
        "runtimes": [runtimes.GVISOR_NONE, runtimes.GVISOR_NETWORK],
    }
    assert runtimes.DAEMON_JSON.read_bytes() == before  # not rewritten, not even touched
