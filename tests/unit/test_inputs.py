"""Per-run inputs: the worker's inputs: section, the plan's /inputs mount, the checks on
input paths (like a zone's), names, and placing (hardlink or no-follow copy, sha256)."""

from __future__ import annotations

import hashlib
import os
import socket

import pytest

from orchestrator.cli.main import main
from orchestrator.config import load_project, load_worker
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.prepare import prepare
from orchestrator.prepare.inputs import safe_name
from orchestrator.runtime.host_folders import make_host_folders
from orchestrator.runtime.inputs import place_inputs


def prepared_for(project, **options):
    loaded = load_project(project.root)
    return prepare(loaded, load_worker(loaded, "w"), **options)


def refusal(project, *inputs, **options) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        prepared_for(project, inputs=list(inputs), **options)
    return excinfo.value.problems


def test_inputs_section_is_strict_and_zone_name_inputs_is_reserved(project):
    project.worker("w", "inputs: {suffixes: [pdf]}")
    loaded = load_project(project.root)
    with pytest.raises(ConfigError, match="suffix 'pdf' must look like '.pdf'"):
        load_worker(loaded, "w")
    project.worker("w", "inputs: {max_files: 3}")
    with pytest.raises(ConfigError, match="max_files"):
        load_worker(loaded, "w")
    project.zone("inputs", "ro")
    with pytest.raises(ConfigError, match="would hide the run's inputs at /inputs"):
        load_project(project.root)


def test_no_inputs_no_mount_and_inputs_mount_read_only_from_the_run_folder(project, tmp_path):
    project.worker("w", "command: [cat]")
    assert prepared_for(project).spec.mounts == []  # no declaration: still no mounts at all
    (tmp_path / "a.pdf").write_text("x")
    prepared = prepared_for(project, inputs=[tmp_path / "a.pdf"])
    (mount,) = prepared.spec.mounts
    assert (mount.target, mount.read_only) == ("/inputs", True)
    assert mount.source == str(prepared.paths.run_dir / "inputs")
    assert prepared.spec.inputs == "/inputs"
    assert [(i.name, i.kind, i.size) for i in prepared.inputs] == [("a.pdf", "file", 1)]
    # A slot for inputs placed later (a run opened ahead of need), and a worker that
    # declares inputs: the folder is there, empty until filled.
    assert prepared_for(project, input_slot=True).spec.inputs == "/inputs"
    project.worker("w", "command: [cat]\ninputs: {max_count: 2}")
    assert prepared_for(project).spec.inputs == "/inputs"


def test_env_and_args_are_in_the_plan(project):
    project.worker("w", "command: [echo, hi]\nenv: {A: one}")
    spec = prepared_for(project, env={"K": "V", "A": "two"}, args=["--flag", "x"]).spec
    assert spec.env["K"] == "V" and spec.env["A"] == "two"
    assert spec.command == ["echo", "hi"] and spec.args == ["--flag", "x"]
    # The image's command is only known to the engine: the worker runs by exec.
    assert spec.supervisor_user is not None
    problems = refusal(project, env={"HOME": "/x", "1BAD": "y"})
    assert problems == [
        "--env HOME: set by the orchestrator itself; use another name",
        "--env 1BAD: not a valid environment variable name",
    ]


def test_refusals_name_each_input_on_one_line(project, tmp_path):
    project.worker("w", "command: [cat]")
    (tmp_path / "real.pdf").write_text("x")
    (tmp_path / "link.pdf").symlink_to(tmp_path / "real.pdf")
    os.mkfifo(tmp_path / "fifo.pdf")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    inside = project.root / ".sandbox" / "runs" / "x.pdf"
    inside.parent.mkdir(parents=True)
    inside.write_text("x")
    problems = refusal(
        project,
        tmp_path / "link.pdf",
        tmp_path / "fifo.pdf",
        tmp_path / "sock",
        tmp_path / "missing.pdf",
        inside,
        project.root,
        "/dev/null",
    )
    sock.close()
    assert len(problems) == 7 and all("\n" not in p for p in problems)
    assert "link.pdf: is a symbolic link; give the file or folder itself" in problems[0]
    assert "fifo.pdf: is a FIFO; only regular files and folders" in problems[1]
    assert "sock: is a socket" in problems[2]
    assert "missing.pdf: does not exist" in problems[3]
    assert "is inside the orchestrator's sandbox root" in problems[4]
    assert "holds the orchestrator's sandbox root" in problems[5]
    assert "/dev/null: is a device file" in problems[6]


def test_links_and_special_files_inside_a_folder_are_refused(project, tmp_path):
    project.worker("w", "command: [cat]")
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "ok.txt").write_text("x")
    (folder / "sub" / "passwd").symlink_to("/etc/passwd")
    (problem,) = refusal(project, folder)
    assert "holds a symbolic link at sub/passwd; links inside inputs are refused" in problem
    (folder / "sub" / "passwd").unlink()
    os.mkfifo(folder / "pipe")
    (problem,) = refusal(project, folder)
    assert "holds a FIFO at pipe" in problem


def test_what_the_worker_accepts(project, tmp_path):
    project.worker("w", "command: [cat]\ninputs: {suffixes: [.pdf], max_count: 1, max_size: 1k}")
    (tmp_path / "a.PDF").write_text("x")
    (tmp_path / "b.txt").write_text("x")
    (tmp_path / "big.pdf").write_bytes(b"x" * 2048)
    assert [i.name for i in prepared_for(project, inputs=[tmp_path / "a.PDF"]).inputs] == ["a.PDF"]
    (problem,) = refusal(project, tmp_path / "b.txt")
    assert "b.txt:" in problem and "accepts only .pdf files (inputs.suffixes)" in problem
    (problem,) = refusal(project, tmp_path / "big.pdf")
    assert "2 KiB is over" in problem and "inputs.max_size of 1 KiB" in problem
    problems = refusal(project, tmp_path / "a.PDF", tmp_path / "big.pdf")
    assert "inputs.max_count is 1, 2 inputs given; give at most 1" in problems[0]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.pdf", "a.pdf"),
        ("-rf", "_-rf"),
        ("two\nlines.txt", "two_lines.txt"),
        ("evil\u202etxt.exe", "evil_txt.exe"),
        ("tab\there", "tab_here"),
        ("été résumé.pdf", "été résumé.pdf"),
        ("..x", "_..x"),
        (".hidden.pdf", "_.hidden.pdf"),  # a glob such as /inputs/* would miss it
    ],
)
def test_safe_names(name, expected):
    assert safe_name(name) == expected


def test_dotdot_and_hostile_names_land_under_inputs(project, tmp_path):
    project.worker("w", "command: [cat]")
    folder = tmp_path / "outer" / "inner"
    folder.mkdir(parents=True)
    (folder / "f.txt").write_text("x")
    hostile = tmp_path / "-x\n\u202e.txt"
    hostile.write_text("y")
    prepared = prepared_for(project, inputs=[folder / "..", hostile])
    assert [i.name for i in prepared.inputs] == ["outer", "_-x__.txt"]
    assert [i.source for i in prepared.inputs] == [tmp_path / "outer", hostile]


def test_plan_lists_inputs_and_args(project, tmp_path, capsys):
    project.worker("w", "command: [cat]")
    (tmp_path / "a.pdf").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "plan",
                "w",
                "--project",
                str(project.root),
                "--input",
                str(tmp_path / "a.pdf"),
                "--env",
                "K=V",
                "--",
                "--flag",
                "x",
            ]
        )
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "/inputs/a.pdf ro  " + str(tmp_path / "a.pdf") + " (file, 1 bytes)" in out
    assert 'command     cat + arguments ["--flag", "x"]' in out
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "w", "--project", str(project.root), "--env", "novalue"])
    assert exit_info.value.code == 125
    assert "'novalue' is not K=V" in capsys.readouterr().err


def test_place_inputs_links_or_copies_and_hashes(project, tmp_path):
    project.worker("w", "command: [cat]")
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.txt").write_bytes(b"alpha")
    (data / "b.txt").write_bytes(b"beta")
    single = tmp_path / "one.bin"
    single.write_bytes(b"\x00\x01" * 1000)
    prepared = prepared_for(project, inputs=[single, data])
    make_host_folders(prepared)
    placed = place_inputs(prepared, prepared.inputs)
    folder = prepared.paths.inputs_dir
    assert (folder / "one.bin").read_bytes() == single.read_bytes()
    assert (folder / "data" / "sub" / "a.txt").read_bytes() == b"alpha"
    first, second = placed
    assert (first.name, first.kind, first.size) == ("one.bin", "file", 2000)
    assert first.sha256 == hashlib.sha256(single.read_bytes()).hexdigest()
    listing = b"".join(
        f"{rel}\0{hashlib.sha256(body).hexdigest()}\n".encode()
        for rel, body in sorted([("b.txt", b"beta"), ("sub/a.txt", b"alpha")])
    )
    assert (second.kind, second.size) == ("folder", 9)
    assert second.sha256 == hashlib.sha256(listing).hexdigest()
    # A link planted after the check is refused when placing, never followed.
    (data / "b.txt").unlink()
    (data / "b.txt").symlink_to("/etc/passwd")
    prepared = prepared_for(project, inputs=[single])
    make_host_folders(prepared)
    with pytest.raises(ConfigError, match="holds a symbolic link at b.txt"):
        place_inputs(prepared, [data])


def test_place_inputs_needs_an_inputs_folder(project, tmp_path):
    project.worker("w", "command: [cat]")
    (tmp_path / "a").write_text("x")
    prepared = prepared_for(project)
    with pytest.raises(OrchestratorError, match="has no /inputs folder"):
        place_inputs(prepared, [tmp_path / "a"])
    prepared = prepared_for(project, input_slot=True)
    with pytest.raises(OrchestratorError, match="open the run before placing its inputs"):
        place_inputs(prepared, [tmp_path / "a"])
    make_host_folders(prepared)
    assert [i.name for i in place_inputs(prepared, [tmp_path / "a"])] == ["a"]


def test_only_files_nobody_else_can_change_are_linked_and_copies_keep_holes(project, tmp_path):
    project.worker("w", "command: [cat]")
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    mine.chmod(0o644)
    shared = tmp_path / "shared.txt"
    shared.write_text("shared")
    shared.chmod(0o666)  # anyone could change its bytes under the worker: copied
    sparse = tmp_path / "sparse.img"
    with sparse.open("wb") as out:
        out.write(b"head")
        out.seek(256 << 20)
        out.write(b"tail")
    sparse.chmod(0o600)  # unreadable by the worker's uid: copied
    prepared = prepared_for(project, inputs=[mine, shared, sparse])
    make_host_folders(prepared)
    placed = {i.name: i for i in place_inputs(prepared, prepared.inputs)}
    folder = prepared.paths.inputs_dir
    assert (folder / "mine.txt").stat().st_ino == mine.stat().st_ino  # linked
    assert (folder / "shared.txt").stat().st_ino != shared.stat().st_ino  # copied
    copy = folder / "sparse.img"
    assert copy.stat().st_size == sparse.stat().st_size
    assert copy.stat().st_blocks * 512 < 1 << 20  # a few blocks, not 256 MiB
    assert placed["sparse.img"].sha256 == hashlib.sha256(sparse.read_bytes()).hexdigest()
    assert placed["shared.txt"].sha256 == hashlib.sha256(b"shared").hexdigest()
