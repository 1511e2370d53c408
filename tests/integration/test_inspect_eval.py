"""``inspect eval`` end to end through the ``orchestrator`` sandbox, offline.

A small task whose solver has Inspect's ``bash()`` tool is driven by Inspect's
``mockllm/model`` with scripted tool calls (no model, no network beyond this machine):

- one sample runs a command; its output reaches the eval log;
- one sample is allowlisted to a local test service (a test web server on a network the
  project declares): it reaches it and is refused another name of the same server, and
  the audit log holds both decisions;
- afterwards nothing the eval made is left: no container, network or run folder.

A sample whose sandbox settings name a Dockerfile (``dockerfile:``, ``image_user: true``)
runs in the image the project's builder made of it, as the image's root, on its files.

Then a sample uses ``text_editor()`` and ``bash_session()`` (whose helper Inspect places in
the sandbox's writable ``/var/tmp``), with ``--no-sandbox-cleanup``: its sandbox outlives
the process until the provider's ``cli_cleanup`` (``inspect sandbox cleanup orchestrator
PROJECT``: the project's gc).

Inspect finds the provider through the package's ``inspect_ai`` entry point, as installed
by ``pip install -e '.[dev]'``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import anyio
import pytest

from orchestrator import labels
from orchestrator.audit import AuditFilter
from orchestrator.config import load_project
from orchestrator.integrations.inspect.provider import OrchestratorSandboxEnvironment
from orchestrator.runtime import open_audit
from tests.conftest import ProjectDir
from tests.integration.conftest import unavailable, web_service

pytestmark = pytest.mark.docker

INSPECT = [sys.executable, "-m", "inspect_ai"]

TASK = '''
import json

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, bash_session, text_editor
from inspect_ai.util import SandboxEnvironmentSpec


def script(messages, tools, tool_choice, config):
    """The scripted model: a sample's input is the tool calls to make, in order; then
    it answers with what the tools said."""
    calls = json.loads(next(m for m in messages if m.role == "user").text)
    said = [m.text for m in messages if m.role == "tool"]
    if len(said) < len(calls):
        name, arguments = calls[len(said)]
        output = ModelOutput.for_tool_call("mockllm/model", name, arguments)
    else:
        output = ModelOutput.from_content("mockllm/model", "done: " + " | ".join(said))
    # Usage given: mockllm would otherwise count tokens with an encoding it downloads.
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


def calls(*pairs):
    return json.dumps(list(pairs))


@task
def probe():
    return Task(
        dataset=[
            Sample(
                id="hello",
                input=calls(["bash", {"command": "echo hello from $(id -u)"}]),
                target="hello from",
            ),
            Sample(
                id="net",
                input=calls(["bash", {"command": FETCH}]),
                target="web 200",
                sandbox=SandboxEnvironmentSpec("orchestrator", "net.yaml"),
            ),
            Sample(
                id="tools",
                input=calls(
                    ["text_editor", {"command": "create", "path": "/tmp/note.txt",
                                     "file_text": "noted in the sandbox"}],
                    ["bash_session", {"action": "type_submit", "input": "cat /tmp/note.txt"}],
                ),
                target="noted in the sandbox",
                sandbox=SandboxEnvironmentSpec("orchestrator", "tools.yaml"),
            ),
            Sample(
                id="built",
                input=calls(["bash", {"command": BUILT}]),
                target="made by the build",
                sandbox=SandboxEnvironmentSpec("orchestrator", "built.yaml"),
            ),
        ],
        solver=[use_tools(bash(timeout=60), text_editor(), bash_session()), generate()],
        scorer=includes(),
        sandbox=("orchestrator", "plain.yaml"),
        model=get_model("mockllm/model", custom_outputs=script),
    )
'''

#: What the sample built from a Dockerfile runs: the image's files, as its (root) user.
BUILT = "cat /app/made.txt; echo uid $(id -u); echo fixed >> /app/made.txt && echo edited"

FETCH = """python3 -c '
import urllib.request, urllib.error
for name in ("web", "other"):
    try:
        reply = urllib.request.urlopen("http://%s.NET/" % name, timeout=30)
        print(name, reply.status, reply.read().decode().strip())
    except urllib.error.HTTPError as refused:
        print(name, refused.code)
'"""


@pytest.fixture(scope="module")
def inspect_env(tmp_path_factory):
    """The environment for ``inspect``: the provider must be found by its entry point, and
    Inspect's own files (traces, buffers) go to a folder of the test's, not the user's."""
    if not entry_points(group="inspect_ai", name="orchestrator"):
        unavailable(
            "the 'inspect_ai' entry point 'orchestrator' is not installed; "
            "run pip install -e '.[dev]' again"
        )
    data = tmp_path_factory.mktemp("inspect-data")
    return {
        **os.environ,
        "INSPECT_DISPLAY": "none",
        "INSPECT_LOG_LEVEL": "warning",
        "XDG_DATA_HOME": str(data),
        "XDG_CACHE_HOME": str(data),
    }


@pytest.fixture(scope="module")
def service(engine):
    """A test web server on a network of its own, answering as ``web`` and ``other``."""
    with web_service(engine, "inspect") as net:
        yield net


def _task_folder(root: Path, net: str) -> ProjectDir:
    project = ProjectDir(root)
    project.extra = f"network:\n  services:\n    - network: {net}\n"
    project.write_project()
    task = TASK.replace("FETCH", repr(FETCH.replace("NET", net))).replace("BUILT", repr(BUILT))
    (root / "task.py").write_text(task)
    (root / "plain.yaml").write_text(
        "project: .\npool: 1\nresources: {memory: 256m, timeout: 60}\n"
    )
    (root / "tools.yaml").write_text("project: .\nresources: {memory: 512m, timeout: 60}\n")
    (root / "net.yaml").write_text(f"project: .\nnetwork: {{allow: [web.{net}]}}\n")
    (root / "built.yaml").write_text("project: .\ndockerfile: env/Dockerfile\nimage_user: true\n")
    (root / "env").mkdir()
    (root / "env" / "Dockerfile").write_text(
        "FROM orchestrator/worker:latest\nUSER root\n"
        "RUN mkdir /app && echo 'made by the build' > /app/made.txt\nWORKDIR /app\n"
    )
    return project


def _eval(root: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [*INSPECT, "eval", "task.py", "--log-dir", "logs", "--log-format", "json", *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output
    return process, output


def _left_by(engine, pid: int) -> list:
    return [
        o
        for o in engine.list_managed()
        if o.labels.get(labels.OWNER_PID) == str(pid) and o.labels.get(labels.SHARED) != "true"
    ]


def test_an_eval_runs_its_tools_in_the_sandbox_and_leaves_nothing(
    engine, service, inspect_env, tmp_path
):
    project = _task_folder(tmp_path / "task", service)
    process, output = _eval(
        project.root, inspect_env, "--model", "mockllm/model", "--sample-id", "hello,net"
    )
    (log,) = (project.root / "logs").glob("*.json")
    data = json.loads(log.read_text())
    assert data["status"] == "success", (output, data.get("error"))
    said = {
        sample["id"]: [m["content"] for m in sample["messages"] if m["role"] == "tool"]
        for sample in data["samples"]
    }
    uid = project.identity[0]
    assert said["hello"] == [f"hello from {uid}\n"]
    (fetched,) = said["net"]
    assert "web 200 testweb service" in fetched, fetched
    assert "other 403" in fetched, fetched
    assert all(s["scores"]["includes"]["value"] == "C" for s in data["samples"])

    audit = open_audit(load_project(project.root))
    decisions = {
        (e.metadata["host"], e.allowed)
        for e in audit.query(AuditFilter(operation="egress.decision"))
    }
    assert (f"web.{service}", True) in decisions
    assert (f"other.{service}", False) in decisions
    execs = audit.query(AuditFilter(operation="session.exec"))
    assert len({e.session_id for e in execs}) == 2  # one sandbox per sample

    assert _left_by(engine, process.pid) == []
    runs = project.root / ".sandbox" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_sample_s_sandbox_is_built_from_its_dockerfile_and_runs_as_written(
    engine, service, inspect_env, tmp_path
):
    """``dockerfile:`` in a sandbox's settings: the project's builder makes the image (each
    ``RUN`` under gVisor, audited), and with ``image_user`` the sample's commands run as the
    image's root on its files."""
    project = _task_folder(tmp_path / "task", service)
    process, output = _eval(
        project.root, inspect_env, "--model", "mockllm/model", "--sample-id", "built"
    )
    (log,) = (project.root / "logs").glob("*.json")
    data = json.loads(log.read_text())
    assert data["status"] == "success", (output, data.get("error"))
    (sample,) = data["samples"]
    (said,) = [m["content"] for m in sample["messages"] if m["role"] == "tool"]
    assert said == "made by the build\nuid 0\nedited\n", said
    audit = open_audit(load_project(project.root))
    (ended,) = audit.query(AuditFilter(operation="build.ended"))
    (started,) = audit.query(AuditFilter(operation="run.started"))
    assert started.metadata["image"] == ended.metadata["image"]
    assert started.metadata["isolation"] == "gvisor"
    assert _left_by(engine, process.pid) == []


@pytest.mark.serial
def test_inspect_s_tool_helper_runs_and_a_kept_sandbox_lasts_until_the_project_gc(
    engine, service, inspect_env, tmp_path, capsys
):
    project = _task_folder(tmp_path / "task", service)
    process, output = _eval(
        project.root, inspect_env, "--model", "mockllm/model", "--sample-id", "tools",
        "--no-sandbox-cleanup",
    )  # fmt: skip
    (log,) = (project.root / "logs").glob("*.json")
    (sample,) = json.loads(log.read_text())["samples"]
    said = [m["content"] for m in sample["messages"] if m["role"] == "tool"]
    # bash_session and text_editor: Inspect's helper runs from the writable /var/tmp
    assert said[0] == "File created successfully at: /tmp/note.txt", said
    assert "noted in the sandbox" in said[1], said
    assert "kept 1 sandbox(es)" in output, output
    kept = _left_by(engine, process.pid)
    assert [o.kind for o in kept] == ["container"], kept
    # What `inspect sandbox cleanup orchestrator PROJECT` calls: the project's gc
    anyio.run(OrchestratorSandboxEnvironment.cli_cleanup, str(project.root))
    assert "orchestrator: gc:" in capsys.readouterr().out
    # (Any run's start also collects what dead owners left: on a shared engine another
    # process may remove it first.)
    assert _left_by(engine, process.pid) == []
