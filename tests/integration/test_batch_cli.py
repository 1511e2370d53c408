"""`orchestrator batch` through the real command line, against the real engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from orchestrator import labels
from tests.integration.conftest import batch_of_docs, batch_summary, cli

SCRIPT = r"""
import os, sys, time
name = sorted(os.listdir("/inputs"))[0]
text = open(os.path.join("/inputs", name), encoding="utf-8").read().strip()
if text == "fail":
    sys.exit(3)
if text == "sleep":
    time.sleep(60)
if text == "oom":
    hog = []
    while True:
        hog.append(bytearray(8 << 20))
if text == "slow":
    time.sleep(1)
open("/staged/result.txt", "w").write("seen " + text)
"""


@pytest.fixture
def batch_project(engine, project):
    command = json.dumps(["python3", "-c", SCRIPT])
    project.worker("w", f"command: {command}\nsandbox: {{}}\nresources: {{memory: 64m}}")
    return project


def _results(project, batch_id):
    path = project.root / ".sandbox" / "batches" / batch_id / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_dozen_inputs_with_failures_a_timeout_and_an_oom(batch_project, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(24):
        text = {3: "fail", 7: "fail", 11: "sleep", 13: "oom"}.get(n, f"doc {n}")
        (folder / f"d{n:02d}.txt").write_text(text)
    done = cli(
        "batch",
        "w",
        "--inputs",
        str(folder),
        "--concurrency",
        "6",
        "--timeout",
        "3",
        "--json",
        "--project",
        str(batch_project.root),
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    summary = batch_summary(done.stdout)
    assert (summary["succeeded"], summary["failed"], summary["timeout"], summary["oom"]) == (
        20,
        2,
        1,
        1,
    )
    by_key = {r["key"]: r for r in _results(batch_project, summary["batch_id"])}
    assert by_key["0004-d03.txt"]["exit_code"] == 3
    assert by_key["0012-d11.txt"]["status"] == "timeout"
    assert by_key["0014-d13.txt"]["status"] == "oom"
    assert by_key["0001-d00.txt"]["files"][0]["path"] == "result.txt"
    shown = cli("staged", "show", summary["change_id"], "--project", str(batch_project.root))
    assert "0001-d00.txt/result.txt" in shown.stdout + shown.stderr
    assert "worker      w (trust untrusted)" in shown.stdout  # a batch's: no one run or session
    sessions = batch_project.root / ".sandbox" / "sessions"
    assert not sessions.exists() or not any(sessions.iterdir())


def test_every_oom_under_load_is_reported_as_oom(batch_project, tmp_path):
    # Six gVisor sandboxes at their memory limit at once: the engine often records their
    # exit before their OOM, which must still be read as an OOM, not a lost container.
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(12):
        (folder / f"d{n:02d}.txt").write_text("oom" if n % 2 == 0 else f"doc {n}")
    done = cli(
        "batch", "w", "--inputs", str(folder), "--concurrency", "6", "--timeout", "30",
        "--json", "--project", str(batch_project.root), timeout=300,
    )  # fmt: skip
    summary = batch_summary(done.stdout)
    results = _results(batch_project, summary["batch_id"])
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["oom"] * 6 + ["succeeded"] * 6, results


def test_exit_codes_and_odd_names(batch_project, tmp_path):
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("new\nline.txt", "-rf", "..dots", "\u202etxt.exe"):
        (odd / name).write_text("fine")
    done = cli(
        "batch",
        "w",
        "--inputs",
        str(odd),
        "--json",
        "--project",
        str(batch_project.root),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = batch_summary(done.stdout)
    assert summary["succeeded"] == 4
    records = _results(batch_project, summary["batch_id"])
    assert {r["input"] for r in records} == {str(odd / n) for n in os.listdir(odd)}
    bad = cli(
        "batch", "w", "--inputs", str(tmp_path / "nothing*"), "--project", str(batch_project.root)
    )
    assert bad.returncode == 125 and "matches nothing" in bad.stderr


def sigkilled_batch(project, tmp_path) -> tuple[subprocess.Popen, str]:
    """A batch of 12 slow inputs, SIGKILLed after 3 have finished; the process, the batch id."""
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(12):
        (folder / f"s{n:02d}").write_text("slow")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "batch",
            "w",
            "--inputs",
            str(folder),
            "--concurrency",
            "2",
            "--json",
            "--project",
            str(project.root),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    batch_id, finished = None, 0
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        batch_id = batch_id or event.get("batch_id")
        finished += event["event"] == "finished"
        if finished >= 3:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert batch_id
    assert 3 <= len(_results(project, batch_id)) < 12
    return proc, batch_id


@pytest.mark.serial
def test_sigkill_then_resume_completes_and_leaves_nothing(batch_project, tmp_path, engine):
    proc, batch_id = sigkilled_batch(batch_project, tmp_path)
    runs = batch_project.root / ".sandbox" / "runs"
    killed = sorted(os.listdir(runs))  # the killed runs' folders, with their inputs' copies
    assert killed and all((runs / name / "inputs").is_dir() for name in killed)
    done = cli(
        "batch",
        "w",
        "--resume",
        batch_id,
        "--json",
        "--project",
        str(batch_project.root),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = batch_summary(done.stdout)
    assert summary["skipped"] >= 3 and summary["skipped"] + summary["succeeded"] == 12
    gc = cli("gc", "--project", str(batch_project.root))
    assert gc.returncode == 0, gc.stderr
    assert not runs.exists() or os.listdir(runs) == []  # (as root, the access sweeps took them)
    time.sleep(0.5)
    left = [o for o in engine.list_managed() if o.labels.get(labels.OWNER_PID) == str(proc.pid)]
    assert left == []


@pytest.mark.serial
def test_gc_removes_the_run_folders_of_a_sigkilled_batch(batch_project, tmp_path, engine):
    if os.geteuid() == 0:  # the project's owner runs the workers: nothing to open up for
        for folder, _dirs, files in os.walk(batch_project.root):  # them (no access records)
            for name in (".", *files):
                os.chown(os.path.join(folder, name), 1000, 1000, follow_symlinks=False)
    proc, _batch_id = sigkilled_batch(batch_project, tmp_path)
    runs = batch_project.root / ".sandbox" / "runs"
    killed = sorted(os.listdir(runs))
    assert killed and all((runs / name / "inputs").is_dir() for name in killed)
    assert not any((runs / name / "access.json").exists() for name in killed)
    owners = [json.loads((runs / name / "owner.json").read_text()) for name in killed]
    assert {o[labels.OWNER_PID] for o in owners} == {str(proc.pid)}
    assert [o[labels.RUN_ID] for o in owners] == killed
    (runs / "unknown").mkdir()  # no owner recorded: left, and said so
    gc = cli("gc", "--project", str(batch_project.root), "--json")
    assert gc.returncode == 0, gc.stderr
    assert sorted(gc.json()["run_folders_removed"]) == killed
    assert gc.json()["run_folders_left"] == [{"name": "unknown", "reason": "no owner recorded"}]
    assert os.listdir(runs) == ["unknown"]
    audit = batch_project.root / ".sandbox" / "audit.jsonl"
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    removed = [e["run_id"] for e in entries if e["operation"] == "gc.run_folder_removed"]
    assert sorted(removed) == killed
    again = cli("gc", "--project", str(batch_project.root))
    assert "left run folder unknown: no owner recorded" in again.stderr


def test_trust_env_and_args_reach_every_run(engine, project, tmp_path):
    script = (
        "import os, sys; open('/staged/seen.txt', 'w').write("
        "os.environ['ORCHESTRATOR_TRUST'] + ' ' + os.environ['MODE'] + ' ' + ' '.join(sys.argv[1:]))"
    )
    command = json.dumps(["python3", "-c", script])
    project.worker("w", f"command: {command}\ntrust: session\nsandbox: {{}}")
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(3):
        (folder / f"d{n}.txt").write_text(str(n))
    done = cli(
        "batch", "w", "--inputs", str(folder), "--trust", "untrusted", "--env", "MODE=fast",
        "--json", "--project", str(project.root), "--", "--flag", "x",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = batch_summary(done.stdout)
    change_id = summary["change_id"]
    shown = cli("staged", "show", change_id, "--json", "--project", str(project.root))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.count("untrusted fast --flag x") == 3, text


def test_resume_stages_the_new_output_of_an_input_that_changed(batch_project, tmp_path):
    folder = tmp_path / "in"
    first = batch_of_docs(batch_project, folder, 3)
    assert first["change_id"] and first["change_files"] == 4
    (folder / "d01.txt").write_text("ccccccc\n")
    done = cli(
        "batch", "w", "--resume", first["batch_id"], "--json",
        "--project", str(batch_project.root), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = batch_summary(done.stdout)
    assert (summary["succeeded"], summary["skipped"]) == (1, 2)
    assert summary["change_id"] not in (None, first["change_id"])
    assert summary["change_files"] == 2, summary  # the new result and the manifest
    shown = cli("staged", "show", summary["change_id"], "--project", str(batch_project.root))
    assert "0002-d01.txt/result.txt" in shown.stdout, shown.stdout + shown.stderr
    assert "seen ccccccc" in shown.stdout and "seen doc" not in shown.stdout


def test_resume_exits_1_and_shows_an_earlier_failure(batch_project, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for n, text in enumerate(("doc", "fail", "doc")):
        (folder / f"d{n}.txt").write_text(text)
    first = cli(
        "batch", "w", "--inputs", str(folder), "--json",
        "--project", str(batch_project.root), timeout=120,
    )  # fmt: skip
    assert first.returncode == 1, first.stderr
    batch_id = batch_summary(first.stdout)["batch_id"]
    again = cli("batch", "w", "--resume", batch_id, "--project", str(batch_project.root))
    assert again.returncode == 1, again.stderr
    assert "0 to run, 3 already done (1 of them not succeeded)" in again.stderr
    assert "already failed" in again.stderr and "already succeeded" in again.stderr
    as_json = cli(
        "batch", "w", "--resume", batch_id, "--json", "--project", str(batch_project.root)
    )
    summary = batch_summary(as_json.stdout)
    assert as_json.returncode == 1 and summary["exit_code"] == 1
    assert (summary["already"]["failed"], summary["already"]["succeeded"]) == (1, 2)


def test_ctrl_c_records_the_running_inputs_as_cancelled(batch_project, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(3):
        (folder / f"s{n}.txt").write_text("sleep")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "orchestrator", "batch", "w", "--inputs", str(folder),
            "--concurrency", "2", "--json", "--project", str(batch_project.root),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    running: set[str] = set()
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "started":
            running.add(event["key"])
        if len(running) == 2:
            break
    time.sleep(1)  # the workers are running
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    records = _results(batch_project, batch_summary(out)["batch_id"])
    # The two running inputs are cancelled, never failed; the third may have been handed
    # out as the batch stopped (then it is cancelled too), or never started.
    assert running <= {r["key"] for r in records}, (running, records)
    for record in records:
        assert (record["status"], record["error"]) == ("cancelled", "cancelled by SIGINT")


def test_resume_accepts_the_same_inputs_and_names_a_difference(batch_project, tmp_path):
    folder = tmp_path / "in"
    first = batch_of_docs(batch_project, folder, 3)
    project = str(batch_project.root)
    (folder / "d01.txt").write_text("changed\n")  # a changed content is the same input
    same = cli(
        "batch", "w", "--inputs", str(folder), "--resume", first["batch_id"], "--json",
        "--project", project, timeout=120,
    )  # fmt: skip
    assert same.returncode == 0, same.stderr
    summary = batch_summary(same.stdout)
    assert (summary["batch_id"], summary["succeeded"], summary["skipped"]) == (
        first["batch_id"], 1, 2,
    )  # fmt: skip
    (folder / "d99.txt").write_text("new")
    os.unlink(folder / "d00.txt")
    other = cli(
        "batch", "w", "--inputs", str(folder), "--resume", first["batch_id"],
        "--project", project,
    )  # fmt: skip
    assert other.returncode == 125, other.stderr
    assert f"--resume {first['batch_id']}: --inputs also names {folder / 'd99.txt'}" in (
        other.stderr
    )
    assert f"the batch also has {folder / 'd00.txt'}" in other.stderr
    results = batch_project.root / ".sandbox" / "batches" / first["batch_id"] / "results.jsonl"
    assert len(results.read_text().splitlines()) == 4  # the refused resume ran nothing
