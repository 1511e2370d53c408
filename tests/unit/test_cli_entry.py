"""The real console entry point (``python -m orchestrator``): exit codes and ``--json`` errors.

click's test runner calls commands in standalone mode, where ``ctx.exit(1)`` raises; the
console entry point does not, so these run the command line as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.audit import AuditLog
from orchestrator.config import load_project


def orchestrator(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "workers").mkdir(parents=True)
    (root / "orchestrator.yaml").write_text("zones: {}\n")
    return root


@pytest.fixture
def log(project: Path) -> AuditLog:
    log = AuditLog(load_project(project).sandbox_root / "audit.jsonl")
    for n in range(4):
        log.record("plan.compiled", worker=f"w{n}", session_id="s1")
    return log


def test_verify_of_an_intact_chain_exits_0(project: Path, log: AuditLog) -> None:
    done = orchestrator("audit", "verify", "--project", project)
    assert (done.returncode, "chain intact" in done.stdout) == (0, True), done.stderr


@pytest.mark.parametrize("damage", ["edit", "delete"])
def test_verify_of_a_broken_chain_exits_1(project: Path, log: AuditLog, damage: str) -> None:
    lines = log.path.read_text().splitlines(keepends=True)
    if damage == "edit":
        lines[1] = lines[1].replace('"w1"', '"w9"')
    else:
        del lines[1]
    log.path.write_text("".join(lines))
    done = orchestrator("audit", "verify", "--project", project)
    assert "chain broken at line 2" in done.stdout
    assert done.returncode == 1, done.stdout + done.stderr


def test_success_exits_0_and_usage_errors_125(project: Path) -> None:
    assert orchestrator("--help").returncode == 0
    assert orchestrator("audit", "--project", project).returncode == 0
    done = orchestrator("plan")
    assert done.returncode == 125 and "Missing argument" in done.stderr and not done.stdout


def error_of(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The one JSON object a failing ``--json`` command prints on stdout."""
    found = json.loads(done.stdout)
    assert found["exit_code"] == done.returncode
    error: dict[str, object] = found["error"]
    return error


def test_plan_json_on_a_bad_worker_file_prints_the_error_as_json(project: Path) -> None:
    (project / "workers" / "bad.worker").write_text(
        "---\nimage: 5\nresources: {memory: lots}\nnosuch: 1\n---\n"
    )
    done = orchestrator("plan", "bad", "--json", "--project", project)
    assert done.returncode == 125
    error = error_of(done)
    assert error["kind"] == "ConfigError"
    problems = error["problems"]
    assert isinstance(problems, list) and len(problems) >= 2
    assert all("bad.worker" in p for p in problems)
    assert error["message"] == "\n".join(problems)
    assert "orchestrator: error:" in done.stderr  # the human lines stay on stderr


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["plan", "nosuch", "--json"], "ConfigError"),
        (["plan", "--json", "--timeout", "-1", "w"], "BadParameter"),
        (["run", "--json", "--bogus", "w"], "NoSuchOption"),
        (["audit", "--json", "--since", "not-a-time"], "BadParameter"),
        (["staged", "show", "nosuch", "--json"], None),
    ],
)
def test_every_json_command_reports_its_failure_as_json(
    project: Path, args: list[str], kind: str | None
) -> None:
    done = orchestrator(*args, cwd=project)
    assert done.returncode == 125, done.stderr
    error = error_of(done)
    assert error["message"] and error["kind"] == (kind or error["kind"])
    assert done.stdout.count("\n") == 1  # one object, one line (fits JSON-lines readers)


def test_without_json_nothing_is_printed_on_stdout(project: Path) -> None:
    done = orchestrator("plan", "nosuch", cwd=project)
    assert done.returncode == 125 and not done.stdout and "nosuch" in done.stderr


@pytest.mark.parametrize("command", ["run", "batch", "plan"])
@pytest.mark.parametrize("timeout", ["1e308", "nan", "inf", "0", "604801"])
def test_a_timeout_out_of_range_is_one_line_and_exit_125(
    project: Path, command: str, timeout: str
) -> None:
    extra = ["--inputs", str(project)] if command == "batch" else []
    done = orchestrator(command, "w", "--project", project, *extra, "--timeout", timeout)
    assert done.returncode == 125, done.stderr
    assert "Traceback" not in done.stderr and "ValidationError" not in done.stderr
    assert (
        f"Error: Invalid value for '--timeout': {float(timeout)} is not in the range 0<x<=604800."
        in done.stderr.splitlines()
    )


@pytest.mark.parametrize("duration", ["99999999999999d", "inf", "nan", "1e400"])
def test_a_session_duration_out_of_range_is_one_line_and_exit_125(
    project: Path, duration: str
) -> None:
    done = orchestrator("session", "start", "w", "--project", project, "--max-lifetime", duration)
    assert done.returncode == 125, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert error.startswith(f"Error: Invalid value for '--max-lifetime': '{duration}': ")
    assert error.endswith(
        "is not in the range 0<x<=3.1536e+07 seconds (a year); use 'never' for no limit"
    )


def test_an_owner_that_dies_before_it_is_ready_says_why(tmp_path: Path) -> None:
    from orchestrator.runtime.owners import wait_ready

    log_path = tmp_path / "owner.log"
    read_end, write_end = os.pipe()
    with open(log_path, "wb") as log_file:
        owner = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('orchestrator: error: no such worker "
             "\\x1b[31m', file=sys.stderr); sys.exit(125)"],
            stderr=log_file,
        )  # fmt: skip
    os.close(write_end)
    try:
        answer = wait_ready(read_end, owner, log_path)
    finally:
        os.close(read_end)
    assert answer == {
        "error": "the session's owner exited with code 125 before it was ready: "
        "no such worker \x1b[31m"
    }


def test_the_audit_listing_shows_what_each_operation_is_read_for(project: Path) -> None:
    # docs/inspect.md promises "every command the agent ran" and "what it tried to reach".
    log = AuditLog(load_project(project).sandbox_root / "audit.jsonl")
    session = {"worker": "w", "run_id": "r1", "session_id": "s1", "trust_level": "untrusted"}
    log.record("session.exec", **session,
               metadata={"argv": ["bash", "-c", "cat /code/README.md"], "exit_code": 0,
                         "timed_out": False, "duration_s": 0.1})  # fmt: skip
    log.record("egress.decision", **session, allowed=False, reason="not in the allowlist",
               metadata={"host": "evil.example", "port": 443, "method": "CONNECT"})  # fmt: skip
    log.record("sandbox.write", **session, zone="session", path="/session/notes.md")
    log.record("change.created", **session,
               metadata={"change_id": "3f9c0d1e77aa", "files": 2, "target": "repo"})  # fmt: skip

    def listed(*filters: str) -> list[str]:
        done = orchestrator("audit", *filters, "--project", project)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    (run,) = listed("--operation", "session.*")
    assert 'argv=["bash", "-c", "cat /code/README.md"] exit_code=0' in run, run
    (reach,) = listed("--operation", "egress.decision")
    assert "DENIED" in reach and "method=CONNECT host=evil.example port=443" in reach, reach
    (wrote,) = listed("--operation", "sandbox.write")
    assert "path=/session/notes.md" in wrote
    (change,) = listed("--operation", "change.*")
    assert "change_id=3f9c0d1e77aa files=2" in change, change


def test_snapshot_list_shows_each_snapshots_size_and_age(project: Path) -> None:
    # Issue 36: snapshots "are listed with their size and age".
    import json as json_module
    from datetime import UTC, datetime, timedelta

    sandbox = load_project(project).sandbox_root
    created = (datetime.now(UTC) - timedelta(hours=3)).isoformat(timespec="seconds")
    folder = sandbox / "snapshots" / "snap-0123456789ab"
    folder.mkdir(parents=True)
    for made in (sandbox, sandbox / "snapshots"):
        made.chmod(0o700)
    manifest = {"id": "snap-0123456789ab", "created": created, "session": "s1", "run_id": "r",
                "worker": "w", "trust": "session", "workspace": "default", "image": "i",
                "tag": "t", "base_image": "b", "root_capture": False, "image_user": False,
                "run_as": "", "bytes": 2048, "seconds": 0.5,
                "sandbox_root": str(sandbox)}  # fmt: skip
    (folder / "manifest.json").write_text(json_module.dumps(manifest))
    done = orchestrator("snapshot", "list", "--project", project)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"snap-0123456789ab  w  2048 bytes  {created} (3.0h ago)  session s1\n")
