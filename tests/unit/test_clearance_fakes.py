"""A tiny change-set store and repository helpers for the clearance tests.

The store writes the staging layout (``<root>/<id>/manifest.json`` + ``blobs/<sha256>``)
and implements exactly the Protocols clearance needs, with their types (a mode read back is
an ``int``, as the staging package gives it): mypy checks the assignments at the end of the
fakes against the Protocols. The other clearance test modules (and the child processes of
the crash tests) import from here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from orchestrator.clearance.store import (
    ChangeFile,
    ChangeSet,
    ChangeStore,
    ChangeTarget,
    ScanFinding,
    Scanners,
)

if TYPE_CHECKING:
    from orchestrator.staging import ChangeStore as StagingStore


@dataclass(frozen=True)
class FakeFile:
    path: str
    operation: str
    size: int
    sha256: str | None
    mode: int | None
    base_sha256: str | None = None


@dataclass(frozen=True)
class FakeTarget:
    kind: str
    name: str | None = None


@dataclass(frozen=True)
class FakeChangeSet:
    id: str
    worker: str
    run_id: str | None
    session_id: str
    trust: str
    target: FakeTarget
    message: str
    created_at: str
    status: str
    files: list[FakeFile]
    history: list[dict] = field(default_factory=list)


class FakeStore:
    """The manifest/blob layout of ``<sandbox root>/changes``, with compare-and-set status."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def stage(
        self,
        files: dict[str, bytes | None],
        *,
        message: str = "Add the report",
        worker: str = "writer",
        run_id: str = "run1",
        trust: str = "workspace",
        target: dict | None = None,
        modes: dict[str, str] | None = None,
        operations: dict[str, str] | None = None,
        bases: dict[str, bytes] | None = None,
        status: str = "pending",
        change_id: str | None = None,
    ) -> str:
        change_id = change_id or uuid.uuid4().hex[:12]
        folder = self.root / change_id
        (folder / "blobs").mkdir(parents=True)
        entries = []
        for path, content in files.items():
            operation = (operations or {}).get(path) or ("delete" if content is None else "create")
            base = (bases or {}).get(path)
            base_sha256 = None if base is None else hashlib.sha256(base).hexdigest()
            if content is None:
                entries.append(
                    {
                        "path": path,
                        "operation": "delete",
                        "size": 0,
                        "sha256": None,
                        "mode": None,
                        "base_sha256": base_sha256,
                    }
                )
                continue
            digest = hashlib.sha256(content).hexdigest()
            (folder / "blobs" / digest).write_bytes(content)
            entries.append(
                {
                    "path": path,
                    "operation": operation,
                    "size": len(content),
                    "sha256": digest,
                    "mode": (modes or {}).get(path, "0644"),
                    "base_sha256": base_sha256,
                }
            )
        manifest = {
            "id": change_id,
            "worker": worker,
            "run_id": run_id,
            "session_id": "s1",
            "trust": trust,
            "target": target or {"kind": "repo"},
            "message": message,
            "created_at": "2026-11-22T00:00:00Z",
            "status": status,
            "files": entries,
            "rejected": [],
            "scans": [],
            "history": [],
        }
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
        return change_id

    def manifest(self, change_id: str) -> dict:
        return json.loads((self.root / change_id / "manifest.json").read_text())

    def get(self, change_id: str) -> FakeChangeSet:
        """Read a manifest back as staging does: the ``"0644"`` text becomes an ``int``."""
        try:
            data = self.manifest(change_id)
        except FileNotFoundError:
            raise LookupError(f"no change set {change_id}") from None
        files = [
            FakeFile(**{**entry, "mode": None if entry["mode"] is None else int(entry["mode"], 8)})
            for entry in data["files"]
        ]
        skip = ("files", "rejected", "scans", "target")
        keep = {k: v for k, v in data.items() if k not in skip}
        return FakeChangeSet(files=files, target=FakeTarget(**data["target"]), **keep)

    def set_status(
        self, change_id: str, new: str, *, reason: str, expect: str | None = None
    ) -> None:
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.manifest(change_id)
            if expect is not None and data["status"] != expect:
                raise ValueError(f"change set {change_id} is {data['status']}, not {expect}")
            data["history"].append({"from": data["status"], "to": new, "reason": reason})
            data["status"] = new
            path = self.root / change_id / "manifest.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=2))
            os.replace(tmp, path)

    def verify_blobs(self, change_id: str) -> list[str]:
        problems = []
        for entry in self.manifest(change_id)["files"]:
            if entry["sha256"] is None:
                continue
            blob = self.blob_path(change_id, entry["sha256"])
            if (
                not blob.is_file()
                or hashlib.sha256(blob.read_bytes()).hexdigest() != entry["sha256"]
            ):
                problems.append(
                    f"{entry['path']}: blob {entry['sha256'][:12]} is missing or changed"
                )
        return problems

    def blob_path(self, change_id: str, sha256: str) -> Path:
        return self.root / change_id / "blobs" / sha256


class FakeScanners:
    """Findings per path; a finding containing 'BLOCK' blocks."""

    def __init__(self, findings: dict[str, str] | None = None) -> None:
        self.findings = findings or {}

    def run(self, changeset: ChangeSet, store: ChangeStore) -> list[ScanFinding]:
        return [
            f"{f.path}: {self.findings[f.path]}" for f in changeset.files if f.path in self.findings
        ]

    def blocking(self, results: Sequence[ScanFinding]) -> list[ScanFinding]:
        return [r for r in results if "BLOCK" in str(r)]


#: Checked by mypy (``test_the_fakes_type_check_against_the_protocols``): each fake must
#: satisfy the Protocol clearance is typed against.
_AS_FILE: ChangeFile = FakeFile("a", "create", 1, None, 0o644)
_AS_TARGET: ChangeTarget = FakeTarget("repo")
_AS_CHANGESET: ChangeSet = FakeChangeSet(
    "i", "w", None, "s", "workspace", FakeTarget("repo"), "m", "t", "pending", []
)
_AS_STORE: ChangeStore = FakeStore.__new__(FakeStore)
_AS_SCANNERS: Scanners = FakeScanners()


def stage_real(
    store_root: Path | StagingStore,
    work: Path,
    *,
    new: dict[str, bytes | None],
    base: dict[str, bytes] | None = None,
    modes: dict[str, int] | None = None,
    worker: str = "writer",
    trust: str = "workspace",
    run_id: str | None = "run1",
    message: str = "Add the report",
    zone: str | None = None,
) -> str:
    """Stage a repo change set (a ``zone``'s when given) with the real staging package:
    ``new`` maps paths to their new content (None: deleted), ``base`` holds what they were
    computed against."""
    from orchestrator.config.models import OutboxLimits
    from orchestrator.staging import ChangeMeta, ChangeStore, ChangeTarget, collect_dir

    tag = uuid.uuid4().hex[:8]
    base_dir, out_dir = work / f"base-{tag}", work / f"outbox-{tag}"
    for folder, files in ((base_dir, base or {}), (out_dir, {**(base or {}), **new})):
        folder.mkdir(parents=True)
        for rel, content in files.items():
            if content is None:
                continue
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod((modes or {}).get(rel, 0o644))
    store = store_root if isinstance(store_root, ChangeStore) else ChangeStore(store_root)
    meta = ChangeMeta(
        worker=worker,
        trust=trust,
        target=ChangeTarget.repo() if zone is None else ChangeTarget.zone(zone),
        run_id=run_id,
        session_id="s1",
        message=message,
    )
    with (
        store.scratch() as scratch,
        collect_dir(out_dir, base=base_dir, limits=OutboxLimits(), tmp_dir=scratch) as collected,
    ):
        assert not collected.rejected, collected.rejected
        return store.create(collected, meta).id


def git(repo: Path, *args: str, check: bool = True, env: dict | None = None) -> str:
    done = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout.rstrip("\n") if args and args[0] == "status" else done.stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A repository on branch main with one commit holding ``files``."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Test User")
    git(path, "config", "user.email", "test@example.invalid")
    for rel, content in (files or {"README.md": "hello\n"}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(content)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def isolate_git(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """No user or system git configuration, no prompts, no askpass from the environment."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "gitconfig").write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")
    for name in (
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
    ):
        monkeypatch.delenv(name, raising=False)


# -- the fake itself ---------------------------------------------------------------


def test_the_fake_store_satisfies_the_protocol(tmp_path):
    store = FakeStore(tmp_path / "changes")
    assert isinstance(store, ChangeStore)
    change_id = store.stage({"a.txt": b"a", "gone.txt": None})
    changeset = store.get(change_id)
    assert [f.operation for f in changeset.files] == ["create", "delete"]
    assert store.verify_blobs(change_id) == []
    store.set_status(change_id, "approved", reason="ok", expect="pending")
    with pytest.raises(ValueError, match="approved, not pending"):
        store.set_status(change_id, "committed", reason="x", expect="pending")
    assert store.get(change_id).status == "approved"


def test_the_fake_store_notices_a_changed_blob(tmp_path):
    store = FakeStore(tmp_path / "changes")
    change_id = store.stage({"a.txt": b"a"})
    entry = store.manifest(change_id)["files"][0]
    store.blob_path(change_id, entry["sha256"]).write_bytes(b"b")
    assert store.verify_blobs(change_id)


def test_the_fakes_type_check_against_the_protocols(tmp_path):
    from mypy import api as mypy_api

    out, err, status = mypy_api.run(
        ["--no-incremental", "--cache-dir", str(tmp_path), "--follow-imports=silent",
         "--allow-untyped-defs", "--allow-any-generics", "--no-warn-return-any", "-m", __name__]
    )  # fmt: skip
    assert status == 0, out + err


def test_a_mode_read_back_is_an_int(tmp_path):
    store = FakeStore(tmp_path / "changes")
    change_id = store.stage({"run.sh": b"#!/bin/sh\n", "gone": None}, modes={"run.sh": "0755"})
    assert [f.mode for f in store.get(change_id).files] == [0o755, None]


def test_clearance_takes_a_mode_as_an_int_only():
    from orchestrator.clearance.store import file_changes

    def changeset(mode: int) -> FakeChangeSet:
        entry = FakeFile("run.sh", "create", 1, "0" * 64, mode)
        target = FakeTarget("repo")
        return FakeChangeSet("i", "w", None, "s", "workspace", target, "m", "t", "pending", [entry])

    assert [c.mode for c in file_changes(changeset(0o100755))] == [0o755]
    with pytest.raises(ValueError, match="is not 0644 or 0755"):
        file_changes(changeset("0644"))  # type: ignore[arg-type]  # the manifest text form
