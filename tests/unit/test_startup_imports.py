"""What a plain ``orchestrator run`` loads before its first engine request: nothing another
command needs, nor what only some runs need (docs/performance.md, "Plain start-up")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.cli.main import ELSEWHERE
from orchestrator.cli.server import CLI_MODULES
from orchestrator.exits import Exit

#: Loaded only by the runs or commands that use them.
NOT_AT_START = ("asyncio", "cryptography", "ctypes", "tenacity")

SCRIPT = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["orchestrator", *sys.argv[2:]]
from orchestrator.launcher import main
main()
"""


def test_a_plain_run_imports_no_other_command_and_no_optional_part(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "workers").mkdir(parents=True)
    (project / "orchestrator.yaml").write_text("zones: {}\n")
    (project / "workers" / "noop.worker").write_text('---\ncommand: ["true"]\n---\n')
    loaded = tmp_path / "modules.json"
    env = {
        **os.environ,
        "ORCHESTRATOR_NO_SERVER": "1",
        # Nobody listens here: the run stops at its first engine request.
        "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}",
    }
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(loaded), "run", "noop", "--project", str(project)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == Exit.ERROR, result.stderr
    assert "Docker engine unreachable" in result.stderr
    modules = set(json.loads(loaded.read_text()))
    assert "orchestrator.runner" in modules and "docker" in modules  # it got that far
    others = {f"orchestrator.cli.{name}" for name in CLI_MODULES}
    assert not others & modules
    assert not {m for m in modules if m.split(".")[0] in NOT_AT_START}


def test_every_command_kept_out_of_the_start_is_preloaded_by_the_server() -> None:
    import importlib

    for name, load in ELSEWHERE.items():
        module = load().callback.__module__  # type: ignore[union-attr]
        if name != "serve":  # the server's own module
            assert module.removeprefix("orchestrator.cli.") in CLI_MODULES, (name, module)
    assert all(importlib.import_module(f"orchestrator.cli.{name}") for name in CLI_MODULES)
