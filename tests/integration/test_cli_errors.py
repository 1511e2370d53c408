"""Failures of the orchestrator itself through the real command line, with ``--json``."""

from __future__ import annotations

import pytest

from tests.integration.conftest import cli

pytestmark = pytest.mark.docker


def test_run_json_on_a_missing_image_prints_the_error_as_json(engine, project):
    project.worker("w", 'image: "orchestrator/no-such-image:latest"\ncommand: ["true"]')
    done = cli("run", "w", "--json", "--project", str(project.root))
    assert done.returncode == 125, done.stderr
    found = done.json()
    assert found["exit_code"] == 125
    assert found["error"]["kind"] == "ImageMissing"
    assert "orchestrator/no-such-image:latest" in found["error"]["message"]
    assert "orchestrator: error: image 'orchestrator/no-such-image:latest'" in done.stderr


def test_run_json_on_a_bad_declaration_lists_every_problem(engine, project):
    project.worker("w", 'command: ["true"]\nresources: {timeout: -5}\nsurprise: 1')
    done = cli("run", "w", "--json", "--project", str(project.root))
    assert done.returncode == 125, done.stderr
    error = done.json()["error"]
    assert error["kind"] == "ConfigError"
    assert len(error["problems"]) >= 2
    assert all("w.worker" in problem for problem in error["problems"])
    assert done.stdout.count("\n") == 1
