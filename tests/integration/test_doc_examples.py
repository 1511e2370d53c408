"""The docs' worked examples, run exactly as the docs show them (the commands are taken
from the Markdown, see :mod:`tests.integration.doc_console`), in a copy of the files git
tracks: README's triage example and its journey from ``run`` to ``clear`` on a git
project."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.docker.egress import EGRESS_KEY
from orchestrator.docker.egress_gc import remove_egress
from tests.integration.conftest import require_gvisor
from tests.integration.doc_console import console_block, console_env, run_steps
from tests.tracked import copy_tracked

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the examples git tracks (what a fresh clone holds), and a home folder."""
    copy_tracked("examples/triage", tmp_path / "checkout" / "examples" / "triage")
    (tmp_path / "home").mkdir()
    return tmp_path / "checkout"


def test_the_readme_triage_example_runs_as_shown(engine, checkout: Path) -> None:
    require_gvisor(engine)  # the header it shows: untrusted workers run under gVisor
    steps = console_block(README, "## Worked example")

    outputs = run_steps(steps, checkout, console_env(checkout.parent / "home"))

    (plan,) = [printed for command, printed in outputs.items() if command.endswith("no Docker")]
    assert any("/input" in line for line in plan)
    assert (checkout / "examples" / "triage" / "output" / "report.md").is_file()


def test_the_readme_journey_from_run_to_clear(engine, checkout: Path) -> None:
    require_gvisor(engine)
    steps = console_block(README, "### From a run to a commit")
    home = checkout.parent / "home"

    run_steps(steps, checkout, console_env(home))

    project = home / "triage"
    committed = subprocess.run(
        ["git", "-C", str(project), "show", "--stat", "--format=%B", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "report.json" in committed and "report.md" in committed
    assert "Worker: triage" in committed and "Trust: untrusted" in committed, committed
    report = (project / "report.md").read_text()
    assert "statement.pdf" in report  # the worker's report, now in the repo
    assert not (project / "output" / "report.md").exists()  # through the outbox, not the zone


def test_the_summarise_offline_recipe_runs_as_written(engine, tmp_path: Path) -> None:
    require_gvisor(engine)
    copy_tracked("examples/summarise", tmp_path / "checkout" / "examples" / "summarise")
    (tmp_path / "home").mkdir()
    steps = console_block(ROOT / "examples" / "summarise" / "README.md", "## Run it offline")
    try:
        outputs = run_steps(steps, tmp_path / "checkout", console_env(tmp_path / "home"))
    finally:  # the fake API, its network and the egress proxy that joined it
        subprocess.run(["docker", "rm", "-f", "summarise-offline-llm"], capture_output=True)
        for proxy in engine.api.containers(all=True, filters={"network": ["summarise-offline"]}):
            if key := (proxy.get("Labels") or {}).get(EGRESS_KEY):
                remove_egress(engine, key)
        subprocess.run(["docker", "network", "rm", "summarise-offline"], capture_output=True)

    (audited,) = [out for command, out in outputs.items() if "egress.credential" in command]
    substituted = [line for line in audited if "event=substituted" in line]
    assert len(substituted) == 2 and all("status=200" in line for line in substituted)
    project = tmp_path / "home" / "summarise-offline"
    key = (project / "offline" / "real").read_text()
    assert key not in (project / ".sandbox" / "audit.jsonl").read_text()
