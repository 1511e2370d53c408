"""approval.write: ask — the worker edits a private copy; the zone changes only on approval."""

from __future__ import annotations

import json
import textwrap

import pytest

from orchestrator.config import load_project
from orchestrator.staging import ChangeStore
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

EDIT = textwrap.dedent(
    """
    import os
    open("/notes/keep.md", "a").write("appended by the worker\\n")
    open("/notes/new.md", "w").write("new note\\n")
    os.remove("/notes/old.md")
    print(sorted(os.listdir("/notes")))
    """
)


def setup(project, delete: str = "preApproved"):
    notes = project.zone("notes", "rw", files={"keep.md": "kept\n", "old.md": "old\n"})
    approval = f"{{write: ask, delete: {delete}}}"
    project.worker(
        "editor",
        f"command: {json.dumps(['python3', '-c', EDIT])}\ntrust: session\n"
        f"sandbox: {{zones: [{{name: notes, mode: rw, approval: {approval}}}]}}",
    )
    return notes


def run_editor(project) -> str:
    result = cli("run", "editor", "--project", str(project.root), "--json")
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert "['keep.md', 'new.md']" in data["stdout"]  # the worker saw its own edits
    (asked,) = data["asked"]
    assert (asked["zone"], asked["files"]) == ("notes", 3)
    return asked["change_id"]


def test_zone_is_untouched_until_the_change_set_is_applied(engine, project):
    notes = setup(project)
    change_id = run_editor(project)
    assert sorted(p.name for p in notes.iterdir()) == ["keep.md", "old.md"]
    assert (notes / "keep.md").read_text() == "kept\n"
    store = ChangeStore(load_project(project.root).sandbox_root / "changes")
    change = store.get(change_id)
    assert change.target.kind == "zone"
    assert {(f.path, f.operation) for f in change.files} == {
        ("keep.md", "update"), ("new.md", "create"), ("old.md", "delete")
    }  # fmt: skip
    assert not list((load_project(project.root).sandbox_root / "runs").glob("*/ask/*"))

    applied = cli("staged", "apply", change_id, "--yes", "--project", str(project.root))
    assert applied.returncode == 0, applied.stderr
    assert sorted(p.name for p in notes.iterdir()) == ["keep.md", "new.md"]
    assert (notes / "keep.md").read_text() == "kept\nappended by the worker\n"
    assert store.get(change_id).status == "applied"


def test_blocked_deletes_are_refused_at_apply_and_shown_before(engine, project):
    notes = setup(project, delete="blocked")
    change_id = run_editor(project)
    shown = cli("staged", "show", change_id, "--project", str(project.root))
    assert "deletes     1 file(s) in zone 'notes', whose approval blocks deletes" in shown.stdout
    as_json = cli("staged", "show", change_id, "--json", "--project", str(project.root))
    assert as_json.json()["deletes_blocked"] == ["old.md"]
    refused = cli("staged", "apply", change_id, "--yes", "--project", str(project.root))
    assert refused.returncode == 125
    assert "blocks deletes" in refused.stderr
    assert (notes / "old.md").exists()
    assert (notes / "keep.md").read_text() == "kept\n"


def test_a_zone_file_changed_since_the_run_is_a_conflict(engine, project):
    notes = setup(project)
    change_id = run_editor(project)
    (notes / "keep.md").write_text("edited by the user meanwhile\n")
    refused = cli("staged", "apply", change_id, "--yes", "--project", str(project.root))
    assert refused.returncode == 125
    assert "changed in zone 'notes' since the run" in refused.stderr
    assert (notes / "keep.md").read_text() == "edited by the user meanwhile\n"
    assert not (notes / "new.md").exists()


def test_edits_made_to_the_zone_during_the_run_are_never_undone(engine, project):
    import threading
    import time

    notes = project.zone("notes", "rw", files={"mine.md": "v1\n", "theirs.md": "v1\n"})
    script = "import time; open('/notes/mine.md', 'w').write('by the worker\\n'); time.sleep(4)"
    project.worker(
        "editor",
        f"command: {json.dumps(['python3', '-c', script])}\ntrust: session\n"
        "sandbox: {zones: [{name: notes, mode: rw, approval: {write: ask}}]}",
    )

    def user_edits():
        time.sleep(2)
        (notes / "theirs.md").write_text("v2 by the user\n")
        (notes / "added-by-user.md").write_text("new\n")

    editing = threading.Thread(target=user_edits)
    editing.start()
    result = cli("run", "editor", "--project", str(project.root), "--json")
    editing.join()
    (asked,) = result.json()["asked"]
    assert asked["files"] == 1  # only what the worker changed, measured against its snapshot
    applied = cli("staged", "apply", asked["change_id"], "--yes", "--project", str(project.root))
    assert applied.returncode == 0, applied.stderr
    assert (notes / "mine.md").read_text() == "by the worker\n"
    assert (notes / "theirs.md").read_text() == "v2 by the user\n"
    assert (notes / "added-by-user.md").exists()
