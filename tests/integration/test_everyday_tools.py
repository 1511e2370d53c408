"""Everyday tools in an untrusted worker, under runc and gVisor: over a read-only zone and
an ``untrusted_output`` zone, each operation's output is checked, and what it wrote is
checked on the host (the doctor's probe, :mod:`orchestrator.doctor.everyday`, does the
work; the verdicts here are the test's own)."""

from __future__ import annotations

import shutil

import pytest

from orchestrator.doctor import everyday
from orchestrator.doctor.tools import parse, worker_file
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker


def test_everyday_tools_work_over_zones(engine, project, isolation):
    project.zone("data", "ro", files=everyday.FILES)
    out = project.zone("out", "rw", extra="untrusted_output: true")
    tools = project.zone("tools", "ro")
    host_git = shutil.which("git")
    if host_git:  # the worker image has no git; the host's runs in it (same release)
        shutil.copy(host_git, tools / "git")
    path = project.root / "workers" / "everyday.worker"
    path.write_text(worker_file(isolation))

    done = cli("run", "everyday", "--project", str(project.root), "--json")
    assert done.returncode == 0, done.stderr
    result = done.json()
    assert f"isolation {isolation}" in done.stderr
    rows = parse(result["stdout"])
    assert rows is not None, result
    verdicts = {name: verdict for name, verdict, _ in rows}
    output = {name: said for name, _, said in rows}
    assert list(verdicts) == list(everyday.OPERATIONS)
    expected_skips = set() if host_git else {"git status"}
    assert {n for n, v in verdicts.items() if v != "ok"} == expected_skips, verdicts

    # What each tool printed, judged here.
    listing = output["ls -l"]
    assert all(name in listing for name in ("notes.txt", "names.txt", "a.log", "sub"))
    assert listing.startswith("total ")
    assert output["stat"].strip() == f"{len(everyday.FILES['notes.txt'])} regular file"
    assert sorted(output["find"].split()) == sorted(f"/data/{rel}" for rel in everyday.FILES)
    assert output["sort"] == "apple\nfig\npear\n"
    assert output["shell glob"].split() == ["a.log", "b.log"]
    folders = ["./", "./sub/", "./sub/deep/"]
    assert sorted(output["tar c/x"].split()) == sorted(folders + [f"./{r}" for r in everyday.FILES])
    assert int(output["du"].split()[0]) >= sum(len(t) for t in everyday.FILES.values())
    assert output["os.scandir"].split() == ["a.log", "b.log", "names.txt", "notes.txt", "sub"]
    if host_git:
        assert output["git status"].strip() == "?? untracked.txt"

    # What the tools wrote into the rw zone, read on the host.
    assert (out / "moved.txt").read_text() == everyday.FILES["notes.txt"]
    assert not (out / "copy").exists()  # cp -a, then mv out of it, then rm -r
    assert (out / "a" / "b" / "c").is_dir()
    for rel, text in everyday.FILES.items():
        assert (out / "untarred" / rel).read_text() == text  # tar c then x
        assert (out / "tree" / rel).read_text() == text  # shutil.copytree
    if host_git:
        assert (out / "repo" / ".git" / "HEAD").is_file()
        assert (out / "repo" / "untracked.txt").read_text() == "new\n"
