"""The ``orchestrator audit`` command group, driven through click's test runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from orchestrator.audit import AuditLog
from orchestrator.cli.audit import audit, audit_log_path
from orchestrator.config import load_project
from orchestrator.errors import AuditError, ConfigError


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "orchestrator.yaml").write_text("zones: {}\n")
    return root


@pytest.fixture
def log(project: Path) -> AuditLog:
    log = AuditLog(load_project(project).sandbox_root / "audit.jsonl")
    log.record("plan.compiled", worker="reader", session_id="s1")
    log.record("run.started", worker="reader", run_id="r1", session_id="s1", zone="inbox")
    log.record(
        "policy.denied",
        allowed=False,
        reason="zone 'secrets' is not granted",
        worker="reader",
        run_id="r1",
        zone="secrets",
        trust_level="untrusted",
    )
    log.record("run.ended", worker="reader", run_id="r1", metadata={"exit_code": 0})
    log.record("run.started", worker="writer", run_id="r2", session_id="s2")
    return log


def invoke(*args: str | Path) -> Result:
    # A wide terminal, so table cells are not wrapped.
    return CliRunner().invoke(audit, [str(arg) for arg in args], env={"COLUMNS": "200"})


def json_lines(result: Result) -> list[dict[str, object]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_log_path_comes_from_the_project(project: Path) -> None:
    expected = load_project(project).sandbox_root / "audit.jsonl"
    assert audit_log_path(project) == expected
    assert expected.is_absolute()


def test_listing_to_a_pipe_prints_one_whole_line_per_entry(project: Path, log: AuditLog) -> None:
    # (On a terminal it is a table: tests/integration/test_terminal.py.)
    long_id = "r" * 120
    log.record("run.started", worker="w", run_id=long_id, allowed=False, reason="a\nforged")
    result = invoke("--project", project)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split("  ")[1] for line in lines] == [
        "plan.compiled", "run.started", "policy.denied", "run.ended", "run.started", "run.started"
    ]  # fmt: skip
    assert "DENIED" in lines[2] and "zone=secrets" in lines[2]
    assert f"run={long_id}" in lines[-1]  # never wrapped: greppable
    assert lines[-1].endswith("reason=a\\nforged")  # a worker's newline cannot start a line


def test_listing_as_json_lines(project: Path, log: AuditLog) -> None:
    result = invoke("--project", project, "--json")
    assert result.exit_code == 0, result.output
    records = json_lines(result)
    assert [record["operation"] for record in records] == [
        "plan.compiled",
        "run.started",
        "policy.denied",
        "run.ended",
        "run.started",
    ]
    assert records == [entry.to_dict() for entry in log.query()]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--run", "r1"], ["run.started", "policy.denied", "run.ended"]),
        (["--session", "s2"], ["run.started"]),
        (["--operation", "run.*"], ["run.started", "run.ended", "run.started"]),
        (["--operation", "run.ended"], ["run.ended"]),
        (["--zone", "secrets"], ["policy.denied"]),
        (["--trust", "untrusted"], ["policy.denied"]),
        (["--denied"], ["policy.denied"]),
        (["--run", "r1", "--zone", "inbox"], ["run.started"]),
        (
            ["--since", "1h"],
            ["plan.compiled", "run.started", "policy.denied", "run.ended", "run.started"],
        ),
        (["--until", "1h"], []),
        (["--since", "2000-01-01T00:00:00Z", "--until", "2000-01-02"], []),
    ],
)
def test_listing_filters(
    project: Path, log: AuditLog, options: list[str], expected: list[str]
) -> None:
    result = invoke("--project", project, "--json", *options)
    assert result.exit_code == 0, result.output
    assert [record["operation"] for record in json_lines(result)] == expected


def test_listing_limit_keeps_the_most_recent(project: Path, log: AuditLog) -> None:
    result = invoke("--project", project, "--json", "--limit", "2")
    assert [record["operation"] for record in json_lines(result)] == ["run.ended", "run.started"]
    assert "--limit 0 shows all" in result.stderr
    everything = invoke("--project", project, "--json", "--limit", "0")
    assert len(json_lines(everything)) == 5
    assert everything.stderr == ""


def test_listing_with_no_match(project: Path, log: AuditLog) -> None:
    result = invoke("--project", project, "--run", "nope")
    assert result.exit_code == 0
    assert "no matching entries" in result.stdout
    assert invoke("--project", project, "--run", "nope", "--json").stdout == ""


def test_default_project_is_the_current_folder(
    project: Path, log: AuditLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    assert len(json_lines(invoke("--json"))) == 5
    assert "5 entries" in invoke("verify").stdout


def test_violations(project: Path, log: AuditLog) -> None:
    log.record("policy.denied", allowed=False, reason="network not allowed", run_id="r2")
    result = invoke("violations", "--project", project, "--json")
    assert result.exit_code == 0, result.output
    assert [record["run_id"] for record in json_lines(result)] == ["r1", "r2"]
    one = invoke("violations", "--project", project, "--json", "--limit", "1")
    assert [record["reason"] for record in json_lines(one)] == ["network not allowed"]
    table = invoke("violations", "--project", project)
    assert "network not allowed" in table.stdout


def test_violations_when_there_are_none(project: Path) -> None:
    result = invoke("violations", "--project", project)
    assert result.exit_code == 0
    assert "no denials" in result.stdout


def test_export_to_stdout_and_to_a_file(project: Path, log: AuditLog, tmp_path: Path) -> None:
    result = invoke("export", "--project", project, "--run", "r1")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [record["operation"] for record in data] == ["run.started", "policy.denied", "run.ended"]

    target = tmp_path / "out.json"
    result = invoke("export", "--project", project, "--denied", "--output", target)
    assert result.exit_code == 0, result.output
    assert [record["operation"] for record in json.loads(target.read_text())] == ["policy.denied"]
    assert "exported 1 entries" in result.stderr
    everything = json.loads(invoke("export", "--project", project).stdout)
    assert everything == [entry.to_dict() for entry in log.query()]


def test_export_to_an_unwritable_place(project: Path, log: AuditLog, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    result = invoke("export", "--project", project, "--output", tmp_path / "taken" / "x" / "y")
    assert isinstance(result.exception, AuditError)
    assert "--output" in str(result.exception)


def test_verify_intact(project: Path, log: AuditLog) -> None:
    result = invoke("verify", "--project", project)
    assert result.exit_code == 0, result.output
    assert "5 entries, chain intact" in result.stdout
    assert str(log.path) in result.stdout


def test_verify_names_the_broken_line(project: Path, log: AuditLog) -> None:
    lines = log.path.read_bytes().splitlines(keepends=True)
    del lines[2]
    log.path.write_bytes(b"".join(lines))
    result = invoke("verify", "--project", project)
    assert result.exit_code == 1
    assert "chain broken at line 3" in result.stdout


def test_verify_lists_every_problem(project: Path, log: AuditLog) -> None:
    with log.path.open("ab") as handle:
        handle.write(b"not json\n")
    log.record("run.ended")
    lines = log.path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"reader", b"writer")
    log.path.write_bytes(b"".join(lines))
    result = invoke("verify", "--project", project)
    assert result.exit_code == 1
    assert "line 2" in result.stdout
    assert "also line 6" in result.stdout


def test_project_given_to_the_group_reaches_subcommands(project: Path, log: AuditLog) -> None:
    result = invoke("--project", project, "verify")
    assert result.exit_code == 0, result.output
    assert "5 entries" in result.stdout


def test_prune(project: Path, log: AuditLog) -> None:
    result = invoke("prune", "--project", project, "--older-than", "30d")
    assert result.exit_code == 0, result.output
    assert "pruned 0 entries, kept 5" in result.stdout
    result = invoke("prune", "--project", project, "--older-than", "0s")
    assert result.exit_code == 0, result.output
    assert "pruned 5 entries, kept 0" in result.stdout
    assert invoke("verify", "--project", project).exit_code == 0
    assert [entry.operation for entry in log.query()] == ["audit.pruned"]


def test_prune_needs_a_valid_duration(project: Path) -> None:
    missing = invoke("prune", "--project", project)
    assert missing.exit_code == 2
    assert "--older-than" in missing.output
    bad = invoke("prune", "--project", project, "--older-than", "soon")
    assert bad.exit_code == 2
    assert "not a duration" in bad.output


def test_a_bad_time_is_a_usage_error(project: Path) -> None:
    result = invoke("--project", project, "--since", "yesterday")
    assert result.exit_code == 2
    assert "neither an ISO 8601 time" in result.output


def test_a_folder_without_a_project_is_a_config_error(tmp_path: Path) -> None:
    result = invoke("verify", "--project", tmp_path)
    assert isinstance(result.exception, ConfigError)


def test_a_failed_export_leaves_no_file(project: Path, tmp_path: Path) -> None:
    (load_project(project).sandbox_root / "audit.jsonl").mkdir(parents=True)
    target = tmp_path / "out.json"
    result = invoke("export", "--project", project, "--output", target)
    assert isinstance(result.exception, AuditError)
    assert sorted(tmp_path.iterdir()) == [project]


def test_an_unreadable_log_is_an_audit_error(project: Path) -> None:
    path = load_project(project).sandbox_root / "audit.jsonl"
    path.mkdir(parents=True)
    commands: list[list[str | Path]] = [["--project", project], ["verify", "--project", project]]
    for args in commands:
        result = invoke(*args)
        assert isinstance(result.exception, AuditError)
        assert str(path) in str(result.exception)
