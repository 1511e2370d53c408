"""``orchestrator staged`` through click's CliRunner on a tmp project."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.cli.staged import open_store, staged
from orchestrator.staging import (
    ChangeMeta,
    ChangeNotFound,
    ChangeTarget,
    InvalidChangeId,
    TransitionError,
    collect_tar,
)
from tests.unit.test_staging_support import END, LIMITS, header, member


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.md").write_text("old report\n")
    (tmp_path / "orchestrator.yaml").write_text(
        "zones:\n  out: {path: out, mode: rw, suffixes: [.md]}\n"
    )
    return tmp_path


def add(project: Path, files: dict[bytes, bytes], *, zone: bool = True, message: str = "") -> str:
    _, store = open_store(project)
    raw = b"".join(member(name, data) for name, data in files.items())
    raw += header(b"evil\x1b[2J", kind=b"2", linkname=b"/etc/shadow")
    target = ChangeTarget.zone("out") if zone else ChangeTarget.repo()
    meta = ChangeMeta(worker="triage", trust="untrusted", target=target, message=message)
    with collect_tar(io.BytesIO(raw + END), limits=LIMITS, tmp_dir=project) as found:
        return store.create(found, meta).id


def run(project: Path, *args: str) -> Result:
    return CliRunner().invoke(staged, [*args, "--project", str(project)], catch_exceptions=True)


def audit_ops(project: Path) -> list[str]:
    log = AuditLog(project / ".sandbox" / "audit.jsonl")
    return [entry.operation for entry in log.query(AuditFilter())]


def test_list_empty_and_filled(project: Path) -> None:
    result = run(project, "list")
    assert result.exit_code == 0 and "no change sets" in result.output
    first = add(project, {b"report.md": b"new report\n"}, message="first\x1b[31m line\nsecond")
    second = add(project, {b"other.md": b"x"}, zone=False)
    run(project, "discard", second)
    result = run(project, "list")
    assert result.exit_code == 0
    assert first in result.output and second in result.output
    assert "first\\x1b[31m line" in result.output and "\x1b" not in result.output
    pending = json.loads(run(project, "list", "--status", "pending", "--json").output)
    assert [c["id"] for c in pending] == [first]
    assert pending[0]["target"] == {"kind": "zone", "name": "out"} and pending[0]["rejected"] == 1


def test_show_prints_everything_escaped_and_records_scans(project: Path) -> None:
    change = add(
        project, {b"report.md": b"new report \x1b]2;pwned\x07\n", b"tool.sh": b"#!/bin/sh\n"}
    )
    result = run(project, "show", change[:6])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "\x1b" not in out and "\x07" not in out
    assert f"change set  {change}  (pending)" in out
    assert "evil\\x1b[2J: symbolic link to '/etc/shadow'" in out
    assert "suffix FAILED" in out and "tool.sh: suffix is not in this target's allowlist" in out
    assert "-old report" in out and "+new report \\x1b]2;pwned\\x07" in out
    _, store = open_store(project)
    assert store.get(change).scans is not None
    assert audit_ops(project) == ["change.reviewed"]


def test_show_json(project: Path) -> None:
    first = add(project, {b"report.md": b"one\n"})
    second = add(project, {b"report.md": b"two\n"})
    data = json.loads(run(project, "show", first, "--json").output)
    assert data["id"] == first and data["status"] == "pending"
    assert data["conflicts"] == [{"id": second, "paths": ["report.md"]}]
    assert data["blocking"] == [] and "+one" in data["diff"]
    assert data["rejected"][0]["path"] == "evil\\x1b[2J"


def test_show_never_colours_unless_on_a_terminal(project: Path) -> None:
    change = add(project, {b"report.md": b"changed\n"})
    assert "\x1b[" not in run(project, "show", change).output
    assert "\x1b[" not in run(project, "show", change, "--no-color").output


def test_discard_and_reject(project: Path) -> None:
    first = add(project, {b"a.md": b"a"})
    second = add(project, {b"b.md": b"b"})
    result = run(project, "discard", first)
    assert result.exit_code == 0 and f"change set {first} discarded" in result.output
    result = run(project, "reject", second)
    assert result.exit_code == 2 and "--reason" in result.output
    assert run(project, "reject", second, "--reason", "wrong numbers").exit_code == 0
    _, store = open_store(project)
    assert store.get(first).status == "discarded"
    rejected = store.get(second)
    assert rejected.status == "rejected" and rejected.history[-1].reason == "wrong numbers"
    assert audit_ops(project) == ["change.discarded", "change.rejected"]
    result = run(project, "discard", second)
    assert isinstance(result.exception, TransitionError)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "..", "zz", "abc/def"])
def test_bad_ids_are_refused_before_any_file_access(project: Path, bad: str) -> None:
    add(project, {b"a.md": b"a"})
    for command in (["show", bad], ["discard", bad], ["reject", bad, "--reason", "x"]):
        result = run(project, *command)
        assert isinstance(result.exception, InvalidChangeId), command
    assert isinstance(run(project, "show", "ffffffffffff").exception, ChangeNotFound)


def test_errors_are_one_line_with_exit_125_through_main(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.cli import main as main_module

    monkeypatch.setattr(main_module.cli, "commands", {**main_module.cli.commands, "staged": staged})
    with pytest.raises(SystemExit) as exit_info:
        main_module.main(["staged", "show", "../x", "--project", str(project)])
    assert exit_info.value.code == 125
