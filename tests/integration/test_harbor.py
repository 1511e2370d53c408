"""``harbor run`` end to end through the ``orchestrator`` environment, offline.

Harbor's own CLI (from ``.venv-harbor``, made by ``make harbor-venv``: Harbor needs Python
3.12 or newer) runs tasks with its built-in ``oracle`` agent, which runs the task's own
solution (no model):

- ``harbor_tasks/hello``: the solution writes a file (and reads a zone given as Harbor's
  mount), the task's test checks it and writes reward 1; the job's results hold that
  reward, under runc and gVisor;
- an allowlist task reaches a local test service (a test web server on a network the
  project declares) and is refused another name of the same server: the audit log holds
  both decisions;
- a task whose allowlist the egress proxy cannot enforce (a single-label name) is refused
  at start, before any container exists: one line in that trial's result;
- a task whose Dockerfile installs a package with ``apt-get`` from a local repository
  (a test service on the project's build allowlist) and ``ADD``s a file by URL is built
  and solved;
- afterwards nothing the runs made is left: no container, network or run folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator import labels
from orchestrator.audit import AuditFilter
from orchestrator.config import load_project
from orchestrator.egress import PROXY_IMAGE
from orchestrator.runtime import open_audit
from tests.conftest import ProjectDir
from tests.integration.conftest import ISOLATIONS, require_gvisor, unavailable, web_service
from tests.integration.pkgservice import PORT, package_service
from tests.integration.pkgservice import project_text as pkg_project

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).resolve().parent / "harbor_tasks"
ENVIRONMENT = "orchestrator.integrations.harbor.environment:OrchestratorEnvironment"

FETCH = """#!/bin/bash
python3 -c '
import urllib.request, urllib.error
for name in ("web", "other"):
    try:
        reply = urllib.request.urlopen("http://%s.NET/" % name, timeout=30)
        print(name, reply.status, reply.read().decode().strip())
    except urllib.error.HTTPError as refused:
        print(name, refused.code)
' > /tmp/fetched.txt
cat /tmp/fetched.txt
"""

CHECK = """#!/bin/bash
if grep -q "^web 200 testweb" /tmp/fetched.txt && grep -q "^other 403" /tmp/fetched.txt; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
"""


@pytest.fixture(scope="module")
def harbor() -> Path:
    """Harbor's CLI, from the venv ``make harbor-venv`` makes (never skipped under CI)."""
    found = Path(os.environ.get("ORCHESTRATOR_HARBOR", ROOT / ".venv-harbor" / "bin" / "harbor"))
    if not found.is_file():
        unavailable(f"no Harbor CLI at {found}: run `make harbor-venv` (needs Python >= 3.12)")
    return found


@pytest.fixture(scope="module")
def service(engine):
    """A test web server on a network of its own, answering as ``web`` and ``other``."""
    with web_service(engine, "harbor") as net:
        yield net


def _run(
    harbor: Path, task: Path, project: ProjectDir, jobs: Path, *options: str
) -> tuple[int, dict[str, Any], dict[str, Any], str]:
    """``harbor run`` of ``task`` with the oracle agent in ``project`` (and ``options``):
    its pid, the job's result, the one trial's result and the CLI's output."""
    # Offline: no telemetry, no model price list fetched (neither is reachable here).
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("PYTHONPATH", None)  # Harbor's venv has the project installed (editable)
    command = [
        str(harbor), "run", "-p", str(task), "-a", "oracle", "--env", ENVIRONMENT,
        "--ek", f"project={project.root}", "-o", str(jobs), "-n", "1", "-y", "-q", *options,
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=project.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output
    (job,) = jobs.glob("*/result.json")
    (trial,) = jobs.glob("*/*/result.json")
    return process.pid, json.loads(job.read_text()), json.loads(trial.read_text()), output


def _assert_nothing_left(engine, pid: int, project: ProjectDir) -> None:
    left = [
        o
        for o in engine.list_managed()
        if o.labels.get(labels.OWNER_PID) == str(pid) and o.labels.get(labels.SHARED) != "true"
    ]
    assert left == []
    runs = project.root / ".sandbox" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_oracle_solves_a_task_in_the_environment(engine, harbor, isolation, tmp_path):
    if isolation == "gvisor":
        require_gvisor(engine)
    project = ProjectDir(tmp_path / "project")
    project.isolation = isolation
    code = project.zone("code", "ro", files={"word.txt": "from the zone"})
    project.write_project()
    task = tmp_path / "hello"
    shutil.copytree(TASKS / "hello", task)
    mount = {"type": "bind", "source": str(code), "target": "/code", "read_only": True}

    pid, job, trial, output = _run(
        harbor, task, project, tmp_path / "jobs", "--mounts-json", json.dumps([mount])
    )

    assert trial["exception_info"] is None, (trial["exception_info"], output)
    assert trial["verifier_result"]["rewards"] == {"reward": 1.0}
    assert job["stats"]["n_errored_trials"] == 0
    oracle = next((tmp_path / "jobs").glob("*/*/agent/oracle.txt")).read_text()
    # Under gVisor the task runs as written (image_user): as the image's own user.
    image_uid = engine.image_defaults("orchestrator/worker:latest").user.partition(":")[0]
    uid = image_uid if isolation == "gvisor" else project.identity[0]
    assert f"solved as {uid} in /tmp" in oracle
    assert "zone: from the zone" in oracle  # Harbor's mount is the zone, read-only

    audit = open_audit(load_project(project.root))
    (started,) = audit.query(AuditFilter(operation="run.started"))
    assert started.metadata["isolation"] == isolation
    assert started.metadata["network"] == "none"  # the task's no-network
    assert started.metadata["limits"]["memory"] == 256 << 20  # its memory_mb
    assert "/code" in [m["target"] for m in started.metadata["mounts"]]
    commands = [
        " ".join(e.metadata["argv"]) for e in audit.query(AuditFilter(operation="session.exec"))
    ]
    assert any("/solution/solve.sh" in c for c in commands)
    assert any("/tests/test.sh" in c for c in commands)
    assert len(audit.query(AuditFilter(operation="run.ended"))) == 1
    _assert_nothing_left(engine, pid, project)


def _allowlist_task(root: Path, hosts: list[str]) -> Path:
    task = root / "fetch"
    shutil.copytree(TASKS / "hello", task)
    toml = (task / "task.toml").read_text()
    toml = toml.replace(
        'network_mode = "no-network"',
        f'network_mode = "allowlist"\nallowed_hosts = {json.dumps(hosts)}',
    )
    (task / "task.toml").write_text(toml)
    return task


def test_an_allowlisted_task_reaches_its_host_and_nothing_else(engine, harbor, service, tmp_path):
    project = ProjectDir(tmp_path / "project")
    project.extra = f"network:\n  services:\n    - network: {service}\n"
    project.write_project()
    task = _allowlist_task(tmp_path, [f"web.{service}"])
    (task / "solution" / "solve.sh").write_text(FETCH.replace("NET", service))
    (task / "tests" / "test.sh").write_text(CHECK)

    pid, _, trial, output = _run(harbor, task, project, tmp_path / "jobs")

    oracle = next((tmp_path / "jobs").glob("*/*/agent/oracle.txt")).read_text()
    assert trial["exception_info"] is None, (trial["exception_info"], output)
    assert "web 200 testweb service" in oracle, oracle
    assert "other 403" in oracle, oracle
    assert trial["verifier_result"]["rewards"] == {"reward": 1.0}
    audit = open_audit(load_project(project.root))
    (started,) = audit.query(AuditFilter(operation="run.started"))
    assert started.metadata["isolation"] == "gvisor"  # the project's default for untrusted
    decisions = {
        (e.metadata["host"], e.allowed)
        for e in audit.query(AuditFilter(operation="egress.decision"))
    }
    assert (f"web.{service}", True) in decisions
    assert (f"other.{service}", False) in decisions
    _assert_nothing_left(engine, pid, project)


def test_an_allowlist_it_cannot_enforce_refuses_the_trial_in_one_line(engine, harbor, tmp_path):
    project = ProjectDir(tmp_path / "project")
    project.write_project()
    task = _allowlist_task(tmp_path, ["localhost"])  # a name Harbor takes, the proxy cannot

    pid, job, trial, output = _run(harbor, task, project, tmp_path / "jobs")

    info = trial["exception_info"]
    assert info is not None and job["stats"]["n_errored_trials"] == 1, output
    message = info["exception_message"].strip()
    assert message.startswith("orchestrator environment: allowed_hosts ['localhost']:"), message
    assert "the task is refused" in message and "\n" not in message
    assert trial["agent_execution"] is None  # refused at start: the oracle never ran
    audit = open_audit(load_project(project.root))
    assert audit.query(AuditFilter(operation="run.started")) == []
    _assert_nothing_left(engine, pid, project)


UPLOADS = """
import asyncio, sys
from pathlib import Path
from orchestrator.integrations.harbor.environment import OrchestratorEnvironment

env = object.__new__(OrchestratorEnvironment)  # no session: the upload is refused first
env.environment_dir = Path(sys.argv[1]) / "environment"
for method, source in (("upload_file", sys.argv[2]), ("upload_dir", sys.argv[3])):
    try:
        asyncio.run(getattr(env, method)(source, "/tmp/x"))
        print(method, "uploaded")
    except OSError as exc:
        print(method, "refused:", exc)
"""


def test_uploads_never_follow_a_link_out_of_the_task(harbor, tmp_path):
    # Harbor's job planner itself refuses a task whose solution/ or tests/ is a link; the
    # environment's own uploads (a file, a folder, named by Harbor or an agent) refuse
    # any link on the way inside the task's folder, before anything is read or sent.
    victim = tmp_path / "victim" / ".ssh"
    victim.mkdir(parents=True)
    key = victim / "id_rsa"
    key.write_text("PRIVATE KEY\n")
    os.utime(key, (1_000_000, key.stat().st_mtime))  # any read moves it (relatime)
    task = tmp_path / "hello"
    shutil.copytree(TASKS / "hello", task)
    (task / "tests" / "key").symlink_to(key)
    (task / "data").symlink_to(victim)
    python = harbor.parent / "python"
    done = subprocess.run(
        [str(python), "-c", UPLOADS, str(task), str(task / "tests" / "key"), str(task / "data")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert said["upload_file"] == (
        f"refused: {task / 'tests' / 'key'}: {task / 'tests' / 'key'} is a symbolic link (to "
        f"{key}) in the task's folder; links there are never followed out of it: replace it "
        "with the file itself"
    )
    assert said["upload_dir"].startswith(f"refused: {task / 'data'}: {task / 'data'} is a ")
    assert key.stat().st_atime == 1_000_000  # never read


def test_the_docs_project_without_a_workers_folder_runs_the_task(engine, harbor, tmp_path):
    # docs/harbor.md's worked example: an orchestrator.yaml with one zone, nothing else.
    root = tmp_path / "project"
    (root / "code").mkdir(parents=True)
    (root / "code" / "word.txt").write_text("from the zone")
    (root / "orchestrator.yaml").write_text("zones:\n  code: {path: code, mode: ro}\n")
    task = tmp_path / "hello"
    shutil.copytree(TASKS / "hello", task)
    mount = {"type": "bind", "source": str(root / "code"), "target": "/code", "read_only": True}

    pid, _, trial, output = _run(
        harbor, task, _Bare(root), tmp_path / "jobs", "--mounts-json", json.dumps([mount])
    )

    assert trial["exception_info"] is None, (trial["exception_info"], output)
    assert trial["verifier_result"]["rewards"] == {"reward": 1.0}
    assert not (root / "workers").exists()
    _assert_nothing_left(engine, pid, _Bare(root))


def test_a_trial_that_cannot_start_says_why_in_one_line_first(engine, harbor, tmp_path):
    project = ProjectDir(tmp_path / "project")
    project.write_project()
    task = tmp_path / "hello"
    shutil.copytree(TASKS / "hello", task)
    (task / "environment" / "Dockerfile").write_text("FROM example.invalid/not-here:1\n")

    pid, job, trial, output = _run(harbor, task, project, tmp_path / "jobs")

    info = trial["exception_info"]
    assert info is not None and job["stats"]["n_errored_trials"] == 1, output
    message = info["exception_message"].strip()
    assert message.startswith(
        "orchestrator environment: image 'example.invalid/not-here:1' is not on this machine"
    ), message
    assert "docker build -t example.invalid/not-here:1" in message and "\n" not in message
    assert output.splitlines()[0] == message  # said first, before Harbor's tracebacks
    assert "Error: orchestrator environment: not started" not in output  # later calls too
    _assert_nothing_left(engine, pid, project)


def test_a_task_naming_an_image_off_the_project_s_list_is_refused_in_one_line(
    engine, harbor, tmp_path
):
    """A Dockerfile that only says ``FROM`` is run as that image, unbuilt: the image must
    be one the project's builds may name (``build.images``), never the egress proxy's."""
    project = ProjectDir(tmp_path / "project")
    project.write_project()
    task = tmp_path / "hello"
    shutil.copytree(TASKS / "hello", task)
    (task / "environment" / "Dockerfile").write_text(f"FROM {PROXY_IMAGE}\n")

    pid, job, trial, output = _run(harbor, task, project, tmp_path / "jobs")

    info = trial["exception_info"]
    assert info is not None and job["stats"]["n_errored_trials"] == 1, output
    message = info["exception_message"].strip()
    assert message.startswith(
        f"orchestrator environment: image '{PROXY_IMAGE}' is not one this project's builds may name"
    ), message
    assert "build.images" in message and "\n" not in message
    _assert_nothing_left(engine, pid, project)


class _Bare:
    """A project folder written by hand (``_run`` and the leak check need its root)."""

    def __init__(self, root: Path) -> None:
        self.root = root


def test_a_misspelt_option_is_refused_with_the_option_it_resembles(engine, harbor, tmp_path):
    project = ProjectDir(tmp_path / "project")
    project.write_project()
    task = tmp_path / "hello"
    shutil.copytree(TASKS / "hello", task)

    pid, _, trial, _ = _run(harbor, task, project, tmp_path / "jobs", "--ek", "isolaton=runc")

    message = trial["exception_info"]["exception_message"].strip()
    assert message.startswith("orchestrator environment: --ek isolaton: not an option"), message
    assert "did you mean 'isolation'?" in message and "\n" not in message
    assert trial["agent_execution"] is None  # refused at start
    _assert_nothing_left(engine, pid, project)


def test_the_oracle_solves_a_task_built_from_its_dockerfile_as_root(engine, harbor, tmp_path):
    """A task as tasks are written: its Dockerfile (root RUN steps, COPY of files and
    folders, WORKDIR, ENV, USER, a stage copied from) is built by the project's builder,
    and its solution changes the image's files in place as root, writes under /etc and
    adds a user. The second trial's build comes from the cache."""
    require_gvisor(engine)
    project = ProjectDir(tmp_path / "project")
    project.write_project()  # untrusted workers under gVisor: the task runs as written
    task = tmp_path / "root-build"
    shutil.copytree(TASKS / "root-build", task)
    # The layer cache is the engine's: a context of this test's own makes the first trial
    # build (from its COPY on) whatever an earlier build of the task left cached.
    (task / "environment" / "files" / "marker.txt").write_text(f"{uuid.uuid4().hex}\n")

    pid, _, trial, output = _run(harbor, task, project, tmp_path / "jobs")

    assert trial["exception_info"] is None, (trial["exception_info"], output)
    assert trial["verifier_result"]["rewards"] == {"reward": 1.0}, output
    oracle = next((tmp_path / "jobs").glob("*/*/agent/oracle.txt")).read_text()
    assert "solved as 0 in /app" in oracle
    audit = open_audit(load_project(project.root))
    (ended,) = audit.query(AuditFilter(operation="build.ended"))
    (started,) = audit.query(AuditFilter(operation="run.started"))
    assert started.metadata["isolation"] == "gvisor"
    assert started.metadata["image"] == ended.metadata["image"]
    built = [e.metadata for e in audit.query(AuditFilter(operation="build.step"))]
    assert any(step.get("outcome") == "built" for step in built), built
    _assert_nothing_left(engine, pid, project)

    # Again: the same task's image comes from the cache, step by step.
    pid, _, trial, output = _run(harbor, task, project, tmp_path / "again")
    assert trial["verifier_result"]["rewards"] == {"reward": 1.0}, output
    steps = [e.metadata for e in audit.query(AuditFilter(operation="build.step"))][len(built) :]
    layers = [step for step in steps if step.get("outcome") in ("built", "cached")]
    assert layers and all(step["outcome"] == "cached" for step in layers), steps
    _assert_nothing_left(engine, pid, project)


def test_the_oracle_solves_a_task_whose_dockerfile_installs_from_a_local_repository(
    engine, harbor, tmp_path
):
    """``harbor_tasks/apt-build``: its Dockerfile's ``RUN`` installs a package with
    ``apt-get`` from a local repository (a test service on the project's build allowlist,
    reached through the egress proxy) and ``ADD``s a file from it by URL; the oracle uses
    both, as root, with reward 1. The trial itself has no network."""
    require_gvisor(engine)
    with package_service(engine, "harbor") as net:
        project = ProjectDir(tmp_path / "project")
        project.extra = pkg_project(net)
        project.write_project()
        task = tmp_path / "apt-build"
        shutil.copytree(TASKS / "apt-build", task)
        dockerfile = task / "environment" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text().replace("PKGS_HOST", f"pkgs.{net}:{PORT}"))

        pid, _, trial, output = _run(harbor, task, project, tmp_path / "jobs")

        assert trial["exception_info"] is None, (trial["exception_info"], output)
        assert trial["verifier_result"]["rewards"] == {"reward": 1.0}, output
        audit = open_audit(load_project(project.root))
        egress = {
            (e.metadata["line"], e.metadata["host"], e.allowed)
            for e in audit.query(AuditFilter(operation="build.egress"))
        }
        assert (6, f"pkgs.{net}", True) in egress  # apt-get, through the proxy
        assert (11, f"pkgs.{net}", True) in egress  # ADD <url>
        assert not [e for e in egress if not e[2]], egress
        (started,) = audit.query(AuditFilter(operation="run.started"))
        assert started.metadata["network"] == "none"  # the task's no-network
        _assert_nothing_left(engine, pid, project)
