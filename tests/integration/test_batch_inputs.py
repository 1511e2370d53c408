"""A batch's inputs as an attacker leaves them, through the real command line and engine.

- A downloads folder holding ``zz-evil -> <victim>/.ssh`` (or a linked ``Documents``):
  ``batch --inputs 'DL/*/*'`` and ``'DL/**/*.txt'`` are refused, naming the link, before any
  container exists; the victim's key is never read (its access time stays put).
- An input replaced while the batch runs: what ``results.jsonl``, the manifest and the
  ``run.inputs`` audit entry record is the hash of the bytes the worker was given (pooled
  runs, the CLI's default, and cold runs alike); a resume after changing it back re-runs it.
- A 3 GB sparse input is copied sparse: its copy has few blocks on disk.
- A 1,500-level folder: one line (a JSON error object under ``--json``), exit 125.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from tests.conftest import deep_tree
from tests.integration.conftest import batch_summary, cli

SCRIPT = r"""
import hashlib, os, sys, time
name = sorted(os.listdir("/inputs"))[0]
path = os.path.join("/inputs", name)
if os.stat(path).st_size > 1 << 30:  # the sparse input: said, never read
    time.sleep(4)
    open("/staged/seen.txt", "w").write("big %d" % os.stat(path).st_size)
    sys.exit(0)
body = open(path, "rb").read()
if body.startswith(b"slow"):
    time.sleep(5)
open("/staged/seen.txt", "w").write(hashlib.sha256(body).hexdigest())
"""


@pytest.fixture
def batch_project(engine, project):
    command = json.dumps(["python3", "-c", SCRIPT])
    project.worker("w", f"command: {command}\nsandbox: {{}}\nresources: {{memory: 64m}}")
    return project


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def audit(project, operation: str) -> list[dict]:
    log = project.root / ".sandbox" / "audit.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [e for e in map(json.loads, lines) if e["operation"] == operation]


def results(project, batch_id: str) -> dict[str, dict]:
    path = project.root / ".sandbox" / "batches" / batch_id / "results.jsonl"
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines())}


def manifest(project, change_id: str) -> dict[str, dict]:
    orch = Orchestrator(project.root)
    change = orch.staging.store.get(change_id)
    (entry,) = [f for f in change.files if f.path == "BATCH-MANIFEST.json"]
    with orch.staging.store.open_blob(change.id, entry.sha256) as blob:
        data = json.loads(blob.read())
    return {i["key"]: i for i in data["inputs"]}


def seen(project, change_id: str) -> dict[str, str]:
    """What each input's worker wrote to /staged/seen.txt, by key."""
    store = Orchestrator(project.root).staging.store
    said = {}
    for f in store.get(change_id).files:
        if f.path.endswith("/seen.txt"):
            with store.open_blob(change_id, f.sha256) as blob:
                said[f.path.split("/")[0]] = blob.read().decode()
    return said


@pytest.fixture
def victim(tmp_path_factory):
    """Another user's private key (root's 0600 file here): its access time is set well
    before its modification time, so that any read moves it (relatime)."""
    home = tmp_path_factory.mktemp("victim")
    ssh = home / ".ssh"
    docs = home / "Documents"
    ssh.mkdir(mode=0o700)
    docs.mkdir()
    for path in (ssh / "id_rsa", docs / "notes.txt"):
        path.write_text("-----BEGIN OPENSSH PRIVATE KEY----- canary\n")
        path.chmod(0o600)
        os.utime(path, (1_000_000, time.time()))
    return home


@pytest.mark.parametrize(
    ("link", "target", "pattern"),
    [("zz-evil", ".ssh", "*/*"), ("Documents", "Documents", "**/*.txt")],
)
def test_a_link_in_a_downloads_folder_refuses_the_batch_and_nothing_is_read(
    batch_project, tmp_path, victim, link, target, pattern
):
    downloads = tmp_path / "dl"
    (downloads / "paper").mkdir(parents=True)
    (downloads / "paper" / "a.txt").write_text("a real download")
    os.symlink(victim / target, downloads / link)
    for inputs in (f"{downloads}/{pattern}", f"{downloads}/{link}/", str(downloads)):
        done = cli(
            "batch", "w", "--inputs", inputs, "--json", "--project", str(batch_project.root),
        )  # fmt: skip
        assert done.returncode == 125, (inputs, done.stdout, done.stderr)
        error = json.loads(done.stdout.strip().splitlines()[-1])
        assert error["exit_code"] == 125
        assert (
            f"{downloads / link} is a symbolic link (to {victim / target})"
            in error["error"]["message"]
        )
        assert "links are never followed" in error["error"]["message"]
        assert "Traceback" not in done.stderr
    for secret in (victim / ".ssh" / "id_rsa", victim / "Documents" / "notes.txt"):
        assert secret.stat().st_atime == 1_000_000  # never opened for reading
    assert audit(batch_project, "run.started") == []  # no run, no container
    assert not (batch_project.root / ".sandbox" / "batches").exists()


def _batch(project, *inputs: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "batch", "w", "--concurrency", "1", "--json",
         "--project", str(project.root), *(a for i in inputs for a in ("--inputs", str(i)))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _wait_started(process: subprocess.Popen[str], key: str) -> list[str]:
    """The --json lines up to the ``started`` event of ``key``."""
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        event = json.loads(line)
        if event.get("event") == "started" and event.get("key") == key:
            return lines
    raise AssertionError(f"{key} never started: {lines}, {process.stderr}")


def test_the_recorded_hash_is_of_the_bytes_placed_when_inputs_change_during_the_batch(
    batch_project, tmp_path
):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a").write_bytes(b"slow: the batch's first input")
    (folder / "b").write_bytes(b"b as listed")
    (folder / "c").write_bytes(b"c as listed")
    process = _batch(batch_project, folder / "a", folder / "b", folder / "c")
    _wait_started(process, "0001-a")
    # While a runs: b is replaced (a new file renamed over it), c is rewritten in place.
    (folder / "b.new").write_bytes(b"b swapped in")
    os.replace(folder / "b.new", folder / "b")
    (folder / "c").write_bytes(b"c rewritten")
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    summary = batch_summary(out)
    recorded = results(batch_project, summary["batch_id"])
    listed = manifest(batch_project, summary["change_id"])
    worker_saw = seen(batch_project, summary["change_id"])
    placed = {e["run_id"]: e["metadata"]["inputs"] for e in audit(batch_project, "run.inputs")}
    for key, body in [("0002-b", b"b swapped in"), ("0003-c", b"c rewritten")]:
        assert recorded[key]["sha256"] == sha(body) == worker_saw[key], key
        assert listed[key]["sha256"] == sha(body)
        (entry,) = placed[recorded[key]["run_id"]]  # pooled runs record what they got
        assert entry["sha256"] == sha(body) and entry["source"] == str(folder / key[5:])
    # Changed back: the bytes the runs saw are not these, so a resume runs them again.
    (folder / "b").write_bytes(b"b as listed")
    (folder / "c").write_bytes(b"c as listed")
    again = cli(
        "batch", "w", "--resume", summary["batch_id"], "--json",
        "--project", str(batch_project.root), timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    rerun = batch_summary(again.stdout)
    assert (rerun["ran"], rerun["skipped"]) == (2, 1)
    recorded = results(batch_project, summary["batch_id"])
    assert recorded["0002-b"]["sha256"] == sha(b"b as listed")


def test_cold_batch_runs_record_the_placed_hash_too(batch_project, tmp_path):
    (tmp_path / "x").write_bytes(b"cold input")
    orch = Orchestrator(batch_project.root)
    result = orch.batch("w", [tmp_path / "x"], use_pool=False)
    (record,) = result.records
    assert record["status"] == "succeeded", record
    assert record["sha256"] == sha(b"cold input")
    (entry,) = [e for e in audit(batch_project, "run.inputs") if e["run_id"] == record["run_id"]]
    assert entry["metadata"]["inputs"][0]["sha256"] == sha(b"cold input")
    (started,) = [e for e in audit(batch_project, "run.started") if e["run_id"] == record["run_id"]]
    assert started["metadata"]["inputs"][0]["sha256"] == sha(b"cold input")


def test_a_sparse_input_is_copied_sparse(batch_project, tmp_path):
    big = tmp_path / "big.img"
    size = 3 << 30
    with big.open("wb") as out:
        out.write(b"head")
        out.seek(size - 4)
        out.write(b"tail")
    big.chmod(0o600)  # root's, unreadable by the worker: copied (chowned), never linked
    process = _batch(batch_project, big)
    _wait_started(process, "0001-big.img")
    blocks: list[int] = []
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        for copy in (batch_project.root / ".sandbox" / "runs").glob("*/inputs/big.img"):
            try:
                info = copy.stat()
            except FileNotFoundError:
                continue
            if info.st_size == size:
                blocks.append(info.st_blocks)
        time.sleep(0.1)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert blocks, "the placed copy was never seen"
    assert max(blocks) * 512 < 1 << 20  # a few blocks, not 3 GB
    summary = batch_summary(out)
    (record,) = results(batch_project, summary["batch_id"]).values()
    digest = hashlib.sha256(b"head")
    zeros = bytes(1 << 20)
    left = size - 8
    while left:
        step = min(left, len(zeros))
        digest.update(zeros[:step])
        left -= step
    digest.update(b"tail")
    assert record["sha256"] == digest.hexdigest()
    assert seen(batch_project, summary["change_id"]) == {"0001-big.img": f"big {size}"}


def test_a_folder_1500_levels_deep_is_one_line_and_exit_125(batch_project, tmp_path):
    with deep_tree(tmp_path / "deep", 1500) as deep:
        for inputs in (str(deep), f"{deep}/**/*.txt"):
            done = cli(
                "batch", "w", "--inputs", inputs, "--json", "--project", str(batch_project.root)
            )
            assert done.returncode == 125, done.stderr
            error = json.loads(done.stdout.strip().splitlines()[-1])
            assert "more than 100 levels deep" in error["error"]["message"], error
            assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
