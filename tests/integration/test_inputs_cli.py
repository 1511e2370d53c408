"""Per-run inputs through the real command line: `run --input ... --env K=V -- ARGS`."""

from __future__ import annotations

import json
import os
import textwrap

from tests.integration.conftest import cli

#: Reports what the worker sees as one JSON line on stdout.
SEES = textwrap.dedent(
    """
    import errno, json, os, sys
    seen = {"argv": sys.argv[1:], "K": os.environ.get("K"), "files": {}}
    for folder, dirs, files in os.walk("/inputs"):
        for name in files:
            path = os.path.join(folder, name)
            seen["files"][path] = open(path).read()
    try:
        open("/inputs/a.pdf", "a").write("changed")
        seen["write"] = "ok"
    except OSError as exc:
        seen["write"] = errno.errorcode[exc.errno]
    try:
        os.mkdir("/inputs/new")
        seen["mkdir"] = "ok"
    except OSError as exc:
        seen["mkdir"] = errno.errorcode[exc.errno]
    print(json.dumps(seen))
    """
)


def worker(project, front: str = "") -> None:
    command = json.dumps(["python3", "-c", SEES])
    project.worker("w", f"command: {command}\n{front}")


def audit_entries(project, operation: str) -> list[dict]:
    lines = (project.root / ".sandbox" / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["operation"] == operation]


def test_inputs_env_and_args_reach_the_worker_read_only(engine, project, tmp_path):
    worker(project)
    pdf = tmp_path / "a.pdf"
    pdf.write_text("pdf body")
    pdf.chmod(0o666)  # writable by anyone: copied (never linked), without its write bits
    folder = tmp_path / "dir"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "note.txt").write_text("note")
    result = cli(
        "run", "w", "--project", str(project.root), "--input", str(pdf),
        "--input", f"{folder}/", "--env", "K=V", "--", "--flag", "x",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["argv"] == ["--flag", "x"]
    assert seen["K"] == "V"
    assert seen["files"] == {"/inputs/a.pdf": "pdf body", "/inputs/dir/sub/note.txt": "note"}
    assert seen["write"] in ("EROFS", "EACCES") and seen["mkdir"] == "EROFS"  # a read-only mount
    assert pdf.read_text() == "pdf body" and pdf.stat().st_nlink == 1
    (started,) = audit_entries(project, "run.started")
    listed = {i["name"]: i for i in started["metadata"]["inputs"]}
    assert set(listed) == {"a.pdf", "dir"}
    assert listed["a.pdf"]["size"] == 8 and len(listed["a.pdf"]["sha256"]) == 64
    assert not (project.root / ".sandbox" / "runs" / started["run_id"]).exists()


def test_without_arguments_the_worker_is_the_main_process_and_still_sees_inputs(
    engine, project, tmp_path
):
    worker(project)
    (tmp_path / "a.pdf").write_text("one")
    result = cli(
        "run", "w", "--project", str(project.root), "--input", str(tmp_path / "a.pdf"),
        "--env", "K=main",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert (seen["K"], seen["argv"], seen["mkdir"]) == ("main", [], "EROFS")
    assert seen["files"] == {"/inputs/a.pdf": "one"}


def test_hostile_names_get_safe_names_under_inputs(engine, project, tmp_path):
    worker(project)
    names = ["-rf", "two\nlines.pdf", "bidi\u202egnp.pdf"]
    for name in names:
        (tmp_path / name).write_text(name)
    inner = tmp_path / "up" / "in"
    inner.mkdir(parents=True)
    (tmp_path / "up" / "f.txt").write_text("up")
    args = [a for name in names for a in ("--input", str(tmp_path / name))]
    result = cli("run", "w", "--project", str(project.root), *args, "--input", f"{inner}/..")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["files"] == {
        "/inputs/_-rf": "-rf",
        "/inputs/two_lines.pdf": "two\nlines.pdf",
        "/inputs/bidi_gnp.pdf": "bidi\u202egnp.pdf",
        "/inputs/up/f.txt": "up",
    }
    (started,) = audit_entries(project, "run.started")
    sources = {i["name"]: i["source"] for i in started["metadata"]["inputs"]}
    assert sources["two_lines.pdf"] == str(tmp_path / "two\nlines.pdf")


def test_refusals_exit_125_with_one_line_before_any_container(engine, project, tmp_path):
    worker(project, "inputs: {suffixes: [.pdf], max_count: 2}")
    (tmp_path / "real.pdf").write_text("x")
    (tmp_path / "link.pdf").symlink_to(tmp_path / "real.pdf")
    os.mkfifo(tmp_path / "fifo.pdf")
    inside = project.root / ".sandbox" / "planted.pdf"
    inside.parent.mkdir(parents=True, exist_ok=True)
    inside.write_text("x")
    (tmp_path / "notes.txt").write_text("x")
    cases = {
        str(tmp_path / "link.pdf"): "is a symbolic link",
        str(tmp_path / "fifo.pdf"): "is a FIFO",
        str(inside): "is inside the orchestrator's sandbox root",
        str(tmp_path / "notes.txt"): "accepts only .pdf files (inputs.suffixes)",
    }
    for path, message in cases.items():
        result = cli("run", "w", "--project", str(project.root), "--input", path)
        assert result.returncode == 125, (path, result.stderr)
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    pdf = str(tmp_path / "real.pdf")
    too_many = cli("run", "w", "--project", str(project.root), *["--input", pdf] * 3)
    assert too_many.returncode == 125
    assert "inputs.max_count is 2, 3 inputs given; give at most 2" in too_many.stderr
    assert audit_entries(project, "run.started") == []


def test_a_word_before_the_double_dash_is_refused_not_handed_to_the_worker(project, tmp_path):
    # `--input a b` (or an unquoted glob) must not run on `a` alone with `b` as an argument.
    worker(project)
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("a")
    second.write_text("b")
    root = str(project.root)
    for command in (
        ["run", "w", "--input", str(first), str(second), "--project", root],
        ["plan", "w", "--input", str(first), str(second), "--project", root],
        ["batch", "w", "--inputs", str(first), str(second), "--project", root],
        ["run", "w", "--input", str(first), str(second), "--json", "--project", root, "--", "x"],
    ):
        done = cli(*command)
        assert done.returncode == 125, (command, done.stdout, done.stderr)
        assert f"unexpected argument {str(second)!r}" in done.stderr + done.stdout, done
        assert "after --" in done.stderr + done.stdout
    assert not (project.root / ".sandbox" / "batches").exists()  # nothing was started
    planned = cli("plan", "w", "--input", str(first), "--json", "--project", root, "--", "b")
    assert planned.returncode == 0, planned.stderr
    assert planned.json()["args"] == ["b"]


def test_arguments_and_env_that_are_not_utf8_are_refused_not_altered(project):
    worker(project)
    root = str(project.root)
    raw = os.fsdecode(b"x\xff")  # what the command line holds: not text
    for extra, where in ((["--", raw], "argument 1"), (["--env", f"K={raw}"], "--env K")):
        done = cli("plan", "w", "--project", root, *extra)
        assert done.returncode == 125, done.stderr
        assert f"error: {where} is not valid UTF-8" in done.stderr
    assert cli("plan", "w", "--project", root, "--", "été").returncode == 0
