"""The runner object: the documented examples run as written, and every run it makes is
audited and has its outbox staged."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import orchestrator
from orchestrator import Orchestrator
from orchestrator.errors import ConfigError
from tests.tracked import copy_tracked

REPO = Path(__file__).resolve().parents[2]


def examples_copy(tmp_path: Path) -> Path:
    """A folder holding examples/triage as a fresh clone has it (not the output or audit
    log a run left in the checkout), as the examples expect."""
    copy_tracked("examples/triage", tmp_path / "examples" / "triage")
    return tmp_path


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def audit_entries(root: Path) -> list[dict]:
    path = root / ".sandbox" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_package_docstring_example_runs_as_written(engine, tmp_path):
    code = textwrap.dedent(orchestrator.__doc__.split("::", 1)[1])
    done = run_python(code, examples_copy(tmp_path))
    assert done.returncode == 0, done.stderr
    project = tmp_path / "examples" / "triage"
    operations = [entry["operation"] for entry in audit_entries(project)]
    assert operations.count("run.started") == 2  # the run, then the session
    assert operations.count("run.ended") == 2
    assert "session.exec" in operations


def test_the_readme_agent_loop_runs_as_written(engine, tmp_path):
    readme = (REPO / "README.md").read_text()
    code = re.search(r"## Python API.*?```python\n(.*?)```", readme, re.S).group(1)
    done = run_python(code, examples_copy(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "['input', 'output', 'session', 'staged', 'tools', 'workers']"
    assert "Cannot write '/input/notes.txt': /input is read-only." in done.stdout
    staged = [line.split()[-1] for line in lines if line.startswith("review with:")]
    assert len(staged) == 1
    listing = subprocess.run(
        [sys.executable, "-m", "orchestrator", "staged", "list", "--json"],
        cwd=tmp_path / "examples" / "triage",
        capture_output=True,
        text=True,
        check=False,
    )
    assert listing.returncode == 0, listing.stderr
    ids = {change["id"] for change in json.loads(listing.stdout)}
    assert staged[0] in ids and len(ids) == 2  # stage() and the session's /staged


def test_run_is_audited_and_stages_its_outbox(engine, project):
    project.worker(
        "w",
        """
        command: ["/bin/sh", "-c", "echo report > /staged/report.md; echo done"]
        sandbox: {}
        """,
    )
    orch = Orchestrator(project.root, engine=engine)
    seen: list[bytes] = []
    result = orch.run("w", on_output=lambda _stream, chunk: seen.append(chunk))
    assert result.exit_code == 0 and result.container_removed
    assert b"".join(seen) == b"done\n"
    assert result.outbox.change_id is not None and result.outbox.files == 1
    entries = audit_entries(project.root)
    started = [e for e in entries if e["operation"] == "run.started"]
    ended = [e for e in entries if e["operation"] == "run.ended"]
    assert [e["run_id"] for e in started] == [e["run_id"] for e in ended] == [result.run_id]


def test_a_refused_declaration_is_audited_before_it_is_raised(project):
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: nope}]}')
    orch = Orchestrator(project.root)
    with pytest.raises(ConfigError, match="zone 'nope' is not declared"):
        orch.prepare("w")
    (denied,) = [e for e in audit_entries(project.root) if e["operation"] == "policy.denied"]
    assert denied["allowed"] is False and "nope" in denied["reason"]


def test_public_names_are_all_importable():
    for name in orchestrator.__all__:
        assert getattr(orchestrator, name) is not None, name
    assert "execute" not in orchestrator.__all__  # runs go through Orchestrator
