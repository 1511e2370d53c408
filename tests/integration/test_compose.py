"""compose/compose.yaml for real: the orchestrator in its own container, on the host's engine.

The orchestrator image is built through the real command line
(``orchestrator images build --with-orchestrator``), then ``docker-compose`` runs it on a
copy of the triage example exactly as docs/ci.md says: from the project folder, mounted at
the same path. Also tried: exit codes through compose (the worker's, and 125), a project
mounted at another path (refused before any worker container exists), and a worker looking
for the engine's socket from inside (it is not there). Each test uses its own compose
project name and ends with ``docker-compose down``; nothing of it may be left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from orchestrator import labels
from orchestrator.docker.images import ORCHESTRATOR_IMAGE
from tests.tracked import copy_tracked

from .conftest import unavailable

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "compose.yaml"
PROJECT_LABEL = "com.docker.compose.project"


def compose_command() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if (
        shutil.which("docker")
        and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        return ["docker", "compose"]
    unavailable("neither docker-compose nor the docker compose plugin is installed")


@pytest.fixture(scope="module")
def orchestrator_image(engine) -> str:
    """Built (again: the layers are cached) through the real command line, so that the
    image holds the code under test."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "images", "build", "--with-orchestrator"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert engine.image_exists(ORCHESTRATOR_IMAGE)
    return ORCHESTRATOR_IMAGE


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


class Compose:
    """``docker-compose -p NAME -f compose/compose.yaml ...`` run from ``cwd``, as a shell
    in that folder would (compose reads the folder from $PWD)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.name = f"orchestrator-test-{uuid.uuid4().hex[:8]}"
        self.base = [*compose_command(), "-p", self.name, "-f", str(COMPOSE_FILE)]

    def __call__(self, *args: str, timeout: float = 300) -> Done:
        done = subprocess.run(
            [*self.base, *args],
            cwd=self.cwd,
            env={**os.environ, "PWD": str(self.cwd)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Done(done.returncode, done.stdout, done.stderr)

    def run(self, *args: str, options: tuple[str, ...] = ()) -> Done:
        return self("run", "--rm", "-T", *options, "orchestrator", *args)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout holding the triage example as a fresh clone has it (the repo's own
    stays clean, and what a run left in it is not copied)."""
    root = tmp_path / "checkout"
    copy_tracked("examples/triage", root / "examples" / "triage")
    return root


@pytest.fixture
def compose(engine, orchestrator_image, checkout) -> Iterator[Compose]:
    runner = Compose(checkout)
    try:
        yield runner
    finally:
        down = runner("down", "--remove-orphans", timeout=120)
        assert down.returncode == 0, down.stderr
        api = engine.api
        left = api.containers(all=True, filters={"label": f"{PROJECT_LABEL}={runner.name}"})
        networks = [n["Name"] for n in api.networks() if n["Name"].startswith(runner.name)]
        assert left == [] and networks == [], (left, networks)


def run_containers(engine, run_id: str) -> list:
    return [o for o in engine.list_managed() if o.labels.get(labels.RUN_ID) == run_id]


def test_the_compose_file_is_valid_and_maps_the_project_to_the_same_path(checkout):
    done = Compose(checkout)("config")
    assert done.returncode == 0, done.stderr
    service = yaml.safe_load(done.stdout)["services"]["orchestrator"]
    assert service["working_dir"] == str(checkout)
    volumes = [str(v) for v in service["volumes"]]
    assert f"{checkout}:{checkout}:rw" in volumes
    assert "/var/run/docker.sock:/var/run/docker.sock:rw" in volumes
    assert service["network_mode"] == "none" and service["pid"] == "host"


def test_the_triage_example_runs_through_compose(compose, checkout, engine):
    done = compose.run("run", "triage", "--project", "examples/triage", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["exit_code"] == 0 and result["container_removed"] is True
    assert result["worker"] == "triage"
    report = (checkout / "examples" / "triage" / "output" / "report.md").read_text()
    assert "statement.pdf" in report and "pdf-javascript" in report
    assert json.loads((checkout / "examples/triage/output/report.json").read_text())["summary"]
    assert run_containers(engine, result["run_id"]) == []

    # The run is in the project's own audit log, on the host, like any other run.
    audit = compose.run(
        "audit", "--run", result["run_id"], "--json", "--project", "examples/triage"
    )
    assert audit.returncode == 0, audit.stderr
    operations = [json.loads(line)["operation"] for line in audit.stdout.splitlines()]
    assert "run.started" in operations and "run.ended" in operations


def test_exit_codes_come_through_compose(compose, checkout):
    workers = checkout / "examples" / "triage" / "workers"
    (workers / "three.worker").write_text(
        '---\nname: three\ncommand: ["python3", "-c", "import sys; sys.exit(3)"]\n---\n'
    )
    assert compose.run("run", "three", "--project", "examples/triage").returncode == 3

    missing = compose.run("run", "nosuchworker", "--project", "examples/triage")
    assert missing.returncode == 125
    assert "nosuchworker" in missing.stderr


def test_a_project_mounted_at_another_path_is_refused_before_any_container(
    compose, checkout, engine
):
    # The mistake the rule is about: the checkout at /elsewhere inside, so the engine would
    # look for /elsewhere/... on the host.
    done = compose.run(
        "run",
        "triage",
        "--project",
        "examples/triage",
        "--json",
        options=("-v", f"{checkout}:/elsewhere", "-w", "/elsewhere"),
    )
    assert done.returncode == 125, done.stderr
    error = json.loads(done.stdout)["error"]["message"]
    assert "\n" not in error
    assert error.startswith("mount source /elsewhere/examples/triage/")
    assert "on the engine's host: the orchestrator's container" in error
    assert '-v "$PWD:$PWD" -w "$PWD"' in error and "docs/ci.md" in error
    assert not (checkout / "examples" / "triage" / "output" / "report.md").exists()
    # The refusal is the run's recorded end, and no container of that run exists.
    entries = [
        json.loads(line)
        for line in (checkout / "examples/triage/.sandbox/audit.jsonl").read_text().splitlines()
    ]
    (ended,) = [e for e in entries if e["operation"] == "run.ended"]
    assert ended["metadata"]["exit_code"] == 125 and ended["metadata"]["status"] == "error"
    assert run_containers(engine, ended["run_id"]) == []


PROBE = textwrap.dedent(
    """
    import json, os, socket, stat
    # A socket of its own first: the search below must find it (and nothing else).
    own = socket.socket(socket.AF_UNIX)
    own.bind("/tmp/probe.sock")
    found = []
    for top in ("/", "/run", "/var/run", "/tmp", "/input"):
        for folder, dirs, files in os.walk(top):
            if folder.startswith(("/proc", "/sys", "/dev")):
                dirs[:] = []
                continue
            for name in files + dirs:
                path = os.path.join(folder, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        found.append(path)
                except OSError:
                    pass
    reached = {}
    for path in ("/var/run/docker.sock", "/run/docker.sock"):
        client = socket.socket(socket.AF_UNIX)
        try:
            client.connect(path)
            reached[path] = "connected"
        except OSError as exc:
            reached[path] = exc.strerror
        finally:
            client.close()
    print(json.dumps({"sockets": sorted(set(found)), "reached": reached}))
    """
)


def test_a_worker_started_through_compose_cannot_find_the_engine_socket(compose, checkout):
    project = checkout / "examples" / "triage"
    (project / "tools" / "probe.py").write_text(PROBE)
    (project / "workers" / "probe.worker").write_text(
        textwrap.dedent(
            """\
            ---
            name: probe
            command: ["python3", "/tools/probe.py"]
            sandbox:
              zones:
                - {name: input, mode: ro}
                - {name: tools, mode: ro}
            ---
            """
        )
    )
    done = compose.run("run", "probe", "--project", "examples/triage")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["sockets"] == ["/tmp/probe.sock"], seen
    assert set(seen["reached"].values()) == {"No such file or directory"}, seen
