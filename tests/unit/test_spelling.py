"""A misspelt name gets the name it was probably meant to be: unknown fields (at any depth,
in the project file, a worker file and a harness's settings), zones, workers and
credentials, through the real console entry point (``plan`` needs no engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import load_model
from orchestrator.errors import ConfigError
from orchestrator.integrations.inspect.config import OrchestratorSandboxConfig
from orchestrator.vocabulary import did_you_mean
from tests.conftest import ProjectDir


def plan(project: ProjectDir, worker: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", worker, "--project", str(project.root)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )


def refused(project: ProjectDir, worker: str = "w") -> str:
    done = plan(project, worker)
    assert done.returncode == 125, done
    assert "Traceback" not in done.stderr
    return done.stderr


def test_the_hint_is_the_closest_known_word_or_nothing() -> None:
    assert did_you_mean("resouces", ["resources", "network"]) == "did you mean 'resources'?"
    assert did_you_mean("zzz", ["resources", "network"]) == ""
    assert did_you_mean("x", []) == ""


@pytest.mark.parametrize(
    ("front", "field", "meant"),
    [
        ("resouces: {memory: 64m}", "resouces", "resources"),
        ("resources: {memroy: 64m}", "resources.memroy", "memory"),
        ("sandbox: {zones: [{name: data, mdoe: ro}]}", "sandbox.zones.0.mdoe", "mode"),
        ("netwrok: none", "netwrok", "network"),
    ],
)
def test_an_unknown_worker_field_names_the_field_it_resembles(
    project: ProjectDir, front: str, field: str, meant: str
) -> None:
    project.zone("data")
    project.worker("w", f'command: ["true"]\n{front}')
    err = refused(project)
    assert f"{field}: unknown field; did you mean '{meant}'? (or remove it)" in err, err


def test_an_unknown_project_field_names_the_field_it_resembles(project: ProjectDir) -> None:
    (project.root / "data").mkdir()
    (project.root / "orchestrator.yaml").write_text(
        "zones:\n  data: {path: data, mode: ro, max_file_sise: 1m}\ndefualts: {}\n"
    )
    project.worker("w", 'command: ["true"]')
    err = refused(project)
    assert "zones.data.max_file_sise: unknown field; did you mean 'max_file_size'?" in err, err
    assert ":4: defualts: unknown field; did you mean 'defaults'?" not in err  # line 3
    assert ":3: defualts: unknown field; did you mean 'defaults'?" in err, err


def test_a_field_like_no_other_keeps_the_plain_advice(project: ProjectDir) -> None:
    project.worker("w", 'command: ["true"]\nxyzzy: 1')
    err = refused(project)
    assert "xyzzy: unknown field; remove it or check its spelling" in err, err
    assert "did you mean" not in err


def test_a_misspelt_zone_worker_and_credential(project: ProjectDir) -> None:
    project.zone("downloads")
    project.extra = "credentials:\n  github: {source: env, env: GH_TOKEN}\n"
    project.write_project()
    project.worker("w", 'command: ["true"]\ntrust: full\nsecrets: [githb]\n'
                   "sandbox: {zones: [{name: donwloads}]}")  # fmt: skip
    err = refused(project)
    assert "zone 'donwloads' is not declared" in err and "did you mean 'downloads'?" in err, err
    assert "'githb' is not in" in err and "did you mean 'github'?" in err, err

    project.worker("triage", 'command: ["true"]')
    err = refused(project, "triag")
    assert "no worker named 'triag'" in err and "did you mean 'triage'?" in err, err


def test_a_harness_settings_file_gets_the_same_hint(tmp_path: Path) -> None:
    settings = tmp_path / "orchestrator-sandbox.yaml"
    settings.write_text("project: .\nwokrer: w\n")
    with pytest.raises(ConfigError) as caught:
        load_model(settings, OrchestratorSandboxConfig)
    assert "wokrer: unknown field; did you mean 'worker'?" in str(caught.value)


def test_json_errors_carry_the_hint(project: ProjectDir) -> None:
    project.worker("w", 'command: ["true"]\nresouces: {}')
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "w", "--json", "--project",
         str(project.root)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 125
    (problem,) = json.loads(done.stdout)["error"]["problems"]
    assert problem.endswith("resouces: unknown field; did you mean 'resources'? (or remove it)")
