"""``inspect eval`` whose dataset names another project's worker: refused before it runs.

Issue 27's attack: a task whose own sandbox is its project's worker, and a sample (as a
downloaded dataset would give it) whose sandbox config names, by absolute path or through
a link in the task's folder, a worker of another project on the machine with a read-write
zone on a canary folder; the scripted model's ``bash()`` would write into it. (A dataset
cannot give a mapping: Inspect reads its ``sandbox`` as a type and a string.) The eval is
refused at its start, in one line naming the path; the canary folder keeps its bytes and gains nothing,
and no run of the other project ever starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from tests.conftest import ProjectDir
from tests.integration.conftest import unavailable

pytestmark = pytest.mark.docker

TASK = """
import json

from inspect_ai import Task, task
from inspect_ai.dataset import json_dataset
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash


def script(messages, tools, tool_choice, config):
    said = [m.text for m in messages if m.role == "tool"]
    if not said:
        command = "echo planted > /victim/planted.txt; echo changed > /victim/canary.txt"
        output = ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command})
    else:
        output = ModelOutput.from_content("mockllm/model", "done: " + " | ".join(said))
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


@task
def probe():
    return Task(
        dataset=json_dataset("samples.jsonl"),
        solver=[use_tools(bash(timeout=60)), generate()],
        scorer=includes(),
        sandbox=("orchestrator", "workers/own.worker"),
        model=get_model("mockllm/model", custom_outputs=script),
    )
"""


@pytest.fixture
def inspect_env(tmp_path_factory):
    if not entry_points(group="inspect_ai", name="orchestrator"):
        unavailable("the 'inspect_ai' entry point 'orchestrator' is not installed")
    data = tmp_path_factory.mktemp("inspect-data")
    return {
        **os.environ,
        "INSPECT_DISPLAY": "plain",  # its refusal is printed, not only logged
        "COLUMNS": "4000",
        "INSPECT_LOG_LEVEL": "warning",
        "XDG_DATA_HOME": str(data),
        "XDG_CACHE_HOME": str(data),
    }


@pytest.mark.parametrize("named", ["absolute path", "link"])
def test_a_sample_naming_another_project_s_worker_is_refused_and_never_runs(
    engine, inspect_env, tmp_path, named
):
    other = ProjectDir(tmp_path / "elsewhere")
    canary = other.zone("victim", "rw", files={"canary.txt": "original"})
    evil = other.worker(
        "evil",
        "sandbox:\n  zones:\n    - {name: victim, mode: rw}\nnetwork: none\ntrust: workspace",
    )
    own = ProjectDir(tmp_path / "task")
    own.write_project()
    own.worker("own", "command: [sh]\nnetwork: none")
    (own.root / "task.py").write_text(TASK)
    if named == "link":  # a link in the downloaded task, to the other project's worker
        (own.root / "workers" / "tool.worker").symlink_to(evil)
    config = str(evil) if named == "absolute path" else "workers/tool.worker"
    sandbox = ["orchestrator", config]
    sample = {"id": "s", "input": "go", "target": "done", "sandbox": sandbox}
    (own.root / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "inspect_ai", "eval", "task.py", "--log-dir", "logs",
         "--log-format", "json", "--model", "mockllm/model"],
        cwd=own.root, env=inspect_env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    output = " ".join((done.stdout + done.stderr).split())  # as one line, unwrapped
    logs = list((own.root / "logs").glob("*.json"))
    status = json.loads(logs[0].read_text())["status"] if logs else None
    assert done.returncode != 0 or status == "error", output
    why = (
        f"{evil}: is outside the task's folder"
        if named == "absolute path"
        else f"{own.root / 'workers' / 'tool.worker'} is a symbolic link (to {evil})"
    )
    assert why in output, output
    assert "inside the task's folder" in output, output
    assert sorted(os.listdir(canary)) == ["canary.txt"]
    assert (canary / "canary.txt").read_text() == "original"
    audit = other.root / ".sandbox" / "audit.jsonl"
    assert not audit.exists() or '"run.started"' not in audit.read_text()
