"""Names a worker controls, against a real session: a name that is not UTF-8, a name over
255 bytes and a folder removed mid-walk are used or refused like any other path, and every
operation on them is in the audit log, which stays valid UTF-8 and verifies."""

from __future__ import annotations

import json
import threading
import time

import pytest

from orchestrator import Orchestrator
from orchestrator.audit import AuditFilter
from orchestrator.sandbox import SandboxError, SandboxNotFound, TextContent
from orchestrator.tools import Toolset
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

#: What ``os.fsdecode`` makes of the name ``bad\xff.txt`` the worker creates.
BAD = "/work/bad\udcff.txt"
#: How the audit log and tool answers show it.
SHOWN = "/work/bad\\xff.txt"


@pytest.fixture
def session(engine, project):
    project.zone("input", "ro", files={"a.txt": "one\n"})
    project.zone("work", "rw")
    project.worker("w", "trust: session\nsandbox: {zones: [{name: input}, {name: work, mode: rw}]}")
    orch = Orchestrator(project.root, engine=engine)
    opened = orch.open_session("w")
    try:
        yield opened
    finally:
        opened.close()


def entries(session, operation: str) -> list:
    audit = session.files.audit
    return [e for e in audit.query(AuditFilter(session=session.id)) if e.operation == operation]


def test_a_name_that_is_not_utf8_is_read_stat_and_deleted_and_audited(session, project):
    made = session.exec(["python3", "-c", "open(b'/work/bad\\xff.txt','w').write('x')"])
    assert made.exit_code == 0, made.stderr
    assert [e.path for e in session.list("/work").entries] == [BAD]
    read = session.read(BAD)
    assert isinstance(read, TextContent) and read.text == "x"
    assert session.stat(BAD).size == 1
    assert session.write(BAD, "yz", append=True).size == 3
    # Tools answer with the name escaped, so any JSON encoder can write the answer.
    tools = Toolset(session)
    listed = tools.call("list", {"path": "/work"})
    assert listed["ok"] and listed["result"]["entries"][0]["path"] == SHOWN
    json.dumps(listed, ensure_ascii=False).encode("utf-8")
    answer = tools.call("read", {"path": BAD})
    assert answer["ok"] and answer["result"]["text"] == "xyz"
    assert answer["result"]["path"] == SHOWN
    with pytest.raises(SandboxError, match="not valid UTF-8"):
        session.stage([BAD], "a name tar cannot be given")
    assert session.delete(BAD).removed == 1
    assert not (project.root / "work" / "bad\udcff.txt").exists()
    for operation in ("sandbox.read", "sandbox.stat", "sandbox.write", "sandbox.delete"):
        found = entries(session, operation)
        assert found and all(e.path == SHOWN and e.allowed for e in found), operation
    with pytest.raises(SandboxNotFound) as refused:
        session.read(BAD)
    assert SHOWN in entries(session, "sandbox.read")[-1].reason
    assert "does not exist" in str(refused.value)
    audit = session.files.audit
    audit.path.read_bytes().decode("utf-8")  # every line is valid UTF-8
    assert audit.verify().ok


def test_overlong_names_are_audited_refusals(session):
    long = "/work/" + "a" * 300
    deep = f"{long}/b.txt"
    for call, verb in (
        (lambda: session.write(long, "x"), "write"),
        (lambda: session.write(deep, "x"), "write"),
        (lambda: session.write(long, "x", append=True), "write"),
        (lambda: session.read(long), "read"),
        (lambda: session.stat(long), "stat"),
        (lambda: session.delete(long), "delete"),
        (lambda: session.list(long), "list"),
    ):
        with pytest.raises(SandboxError) as info:
            call()
        assert str(info.value).startswith(f"Cannot {verb} '/work/aaa"), str(info.value)
        assert "too long" in str(info.value)
        last = entries(session, f"sandbox.{verb}")[-1]
        assert not last.allowed and "too long" in last.reason
    answer = Toolset(session).call("write", {"path": deep, "content": "x"})
    assert answer["ok"] is False and "too long" in answer["error"]
    with pytest.raises(SandboxError, match="too long"):
        session.stage([long], "a long name")


def test_a_folder_removed_mid_walk_is_a_refusal_never_an_oserror(session):
    # The worker creates and removes the folders the host writes through, as fast as it can.
    churn = "while :; do mkdir -p /work/r/a 2>/dev/null; rm -rf /work/r; done"
    worker = threading.Thread(target=session.exec, args=(churn,), kwargs={"timeout": 4})
    worker.start()
    try:
        time.sleep(0.5)
        outcomes: set[str] = set()
        messages: list[str] = []
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            try:
                session.write("/work/r/a/b/c.txt", "x")
                outcomes.add("written")
            except SandboxError as exc:  # never a bare OSError
                messages.append(str(exc))
                outcomes.add("refused")
    finally:
        worker.join()
    assert "refused" in outcomes
    assert all(m.startswith("Cannot write '/work/r/a/b/c.txt': ") for m in messages), messages
    refusals = [e for e in entries(session, "sandbox.write") if not e.allowed]
    assert refusals and all(e.reason.startswith("Cannot write") for e in refusals)


def test_typos_in_python_calls_name_the_argument(session):
    for call, named in (
        (lambda: session.read("/input/a.txt", limit="5"), "limit"),
        (lambda: session.read("/input/a.txt", offset=1.5), "offset"),
        (lambda: session.read(5), "path"),
        (lambda: session.read(None), "path"),
        (lambda: session.stat(b"/input/a.txt"), "path"),
        (lambda: session.write("/work/x.txt", 5), "content"),
    ):
        with pytest.raises(TypeError, match=named):
            call()
    assert not session.exists("/work/x.txt")


def test_the_cli_copies_to_and_runs_with_names_that_are_not_utf8(engine, project, tmp_path):
    project.zone("work", "rw")
    project.worker("w", "trust: session\nsandbox: {zones: [{name: work, mode: rw}]}")
    root = str(project.root)
    started = cli("session", "start", "w", "--project", root, "--json")
    assert started.returncode == 0, started.stderr
    sid = json.loads(started.stdout)["id"]
    try:
        local = tmp_path / "small.txt"
        local.write_text("small")
        done = cli("session", "cp", str(local), f"{sid}:/work/yy\udcff.txt", "--project", root)
        assert done.returncode == 0, done.stderr
        assert (project.root / "work" / "yy\udcff.txt").read_text() == "small"
        long = f"{sid}:/work/{'a' * 300}"
        done = cli("session", "cp", str(local), long, "--project", root)
        assert done.returncode == 125
        assert "Cannot write '/work/aaa" in done.stderr and "too long" in done.stderr
    finally:
        assert cli("session", "stop", sid, "--project", root).returncode == 0
    written = [
        e for e in map(json.loads, audit_lines(project)) if e["operation"] == "sandbox.write"
    ]
    assert [e["path"] for e in written if e["allowed"]] == ["/work/yy\\xff.txt"]

    project.worker("r", 'command: ["sh", "-c", "ls /inputs"]\ntrust: session')
    source = tmp_path / "b\udcff\udcfe"
    source.write_text("in")
    done = cli("run", "r", "--project", root, "--input", str(source))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert cli("audit", "verify", "--project", root).returncode == 0


def audit_lines(project) -> list[str]:
    return (project.root / ".sandbox" / "audit.jsonl").read_bytes().decode("utf-8").splitlines()
