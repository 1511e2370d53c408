"""What a newcomer's first runs trip over, through the real console entry point: a project
without a workers folder, and an image that is not on this machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.audit import AuditFilter
from orchestrator.config import load_project
from orchestrator.runtime import open_audit
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

PROBE = (
    "import os, errno\n"
    "print('entries', os.listdir('/workers'))\n"
    "try:\n"
    "    open('/workers/planted.worker', 'w')\n"
    "except OSError as exc:\n"
    "    print('write', errno.errorcode[exc.errno])\n"
)


def _project(root: Path, front: str) -> Path:
    """A project with no workers folder, and its worker file given by path."""
    root.mkdir()
    (root / "orchestrator.yaml").write_text("zones: {}\nisolation: {untrusted: runc}\n")
    worker = root / "agent.worker"
    worker.write_text(f"---\nname: agent\n{front}\n---\n")
    return worker


def test_a_project_without_a_workers_folder_runs_with_an_empty_read_only_one(
    engine, tmp_path: Path
) -> None:
    command = json.dumps(["python3", "-c", PROBE])
    worker = _project(tmp_path / "p", f"sandbox: {{}}\ncommand: {command}")

    done = cli("run", str(worker), "--project", str(tmp_path / "p"))

    assert done.returncode == 0, done.stderr
    assert "entries []" in done.stdout  # an empty folder, not the host's (absent) one
    assert "write EROFS" in done.stdout  # and nothing can be planted in it
    assert not (tmp_path / "p" / "workers").exists()  # nothing made on the host
    plan = cli("plan", str(worker), "--project", str(tmp_path / "p"), "--json").json()
    assert "/workers" not in [mount["target"] for mount in plan["mounts"]]
    (mask,) = [folder for folder in plan["tmpfs"] if folder["target"] == "/workers"]
    assert mask["mask"] is True


@pytest.mark.parametrize(
    ("image", "fix"),
    [
        ("example.invalid/not-here:1", "`orchestrator build DIR -t example.invalid/not-here:1`"),
        ("orchestrator/proxy:nope", "`orchestrator images build`"),
    ],
)
def test_a_missing_image_is_named_with_its_fix_before_anything_runs(
    engine, tmp_path: Path, image: str, fix: str
) -> None:
    worker = _project(tmp_path / "p", f'image: "{image}"\ncommand: ["true"]')

    done = cli("run", str(worker), "--project", str(tmp_path / "p"))

    assert done.returncode == 125, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"orchestrator: error: image '{image}' is not on this machine"), (
        lines
    )
    assert fix in lines[0]
    if fix.startswith("`orchestrator build"):
        assert f"docker build -t {image} DIR" in lines[0]
    assert not any(": run " in line for line in lines)  # no run header: nothing ran
    audit = open_audit(load_project(tmp_path / "p"))
    assert audit.query(AuditFilter(operation="run.started")) == []
    shutil.rmtree(tmp_path / "p")
