"""Sessions against the real engine, through the Python API: the container a session opens,
every host-side operation and refusal, a container racing the host, exec, the lifecycle
(close, idle timeout, maximum lifetime, Ctrl-C, SIGKILL then gc) and child workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator import Orchestrator, labels
from orchestrator.audit import AuditFilter
from orchestrator.docker import runtimes
from orchestrator.errors import OrchestratorError, PolicyError
from orchestrator.runtime.session import Session, SessionClosed
from orchestrator.sandbox import (
    BinaryContent,
    ImageContent,
    SandboxError,
    SandboxNotFound,
    TextContent,
)
from orchestrator.tools import Toolset
from tests.conftest import ProjectDir
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

PNG = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + bytes(20)
#: The worker's own command: it must never run in a session.
NEVER = 'command: ["sh", "-c", "touch /work/COMMAND-RAN; sleep 1000"]'
ZONES = (
    "sandbox: {zones: [{name: input}, {name: output, mode: rw}, {name: work, mode: rw}, "
    "{name: notes, mode: rw, approval: {write: ask}}]}"
)
#: Every process of the container as "pid pgid cmdline" (the image has no `ps`).
PROCESSES = (
    "for d in /proc/[0-9]*; do [ -r $d/cmdline ] || continue; "
    'echo "${d#/proc/} $(cut -d" " -f5 $d/stat 2>/dev/null) $(tr "\\0" " " < $d/cmdline)"; done'
)


@dataclass
class Box:
    session: Session
    orch: Orchestrator
    project: ProjectDir
    outside: Path

    @property
    def root(self) -> Path:
        return self.project.root


def sandbox_project(project: ProjectDir, trust: str = "session", extra: str = "") -> None:
    lines = "".join(f"line {n}\n" for n in range(1, 501))
    project.zone("input", "ro", files={"a.txt": "one\ntwo\nthree\n", "long.txt": lines})
    (project.root / "input" / "pic.png").write_bytes(PNG)
    (project.root / "input" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    project.zone("output", "rw", extra="suffixes: ['.md'], max_file_size: 1k")
    project.zone("work", "rw", files={"kept.txt": "original"})
    project.zone("notes", "rw", files={"n.txt": "v1"})
    project.worker("w", f"{NEVER}\ntrust: {trust}\n{ZONES}{extra}")


def container_of(engine, session: Session):
    found = [
        o
        for o in engine.list_managed()
        if o.kind == "container" and o.labels.get(labels.RUN_ID) == session.run_id
    ]
    return found[0] if found else None


@pytest.fixture
def box(engine, project, tmp_path):
    sandbox_project(project)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("HOST-SECRET")
    orch = Orchestrator(project.root, engine=engine)
    session = orch.open_session("w")
    try:
        yield Box(session, orch, project, outside)
    finally:
        session.close()
    assert container_of(engine, session) is None


def refused(call, message: str, error: type[Exception] = PolicyError) -> str:
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value), str(info.value)
    return str(info.value)


# -- open -----------------------------------------------------------------------------------


def test_the_container_is_the_plan_a_run_would_get_and_idles(engine, box):
    session = box.session
    spec = box.orch.prepare("w").spec  # what `run` would create for this worker
    found = container_of(engine, session)
    assert found is not None
    info = engine.api.inspect_container(found.name)
    host = info["HostConfig"]
    # the container's own process only keeps it alive, as a user of its own (as in a run
    # with an outbox); commands run as the worker's uid
    assert spec.supervisor_user is not None
    assert info["Config"]["User"] == spec.supervisor_user != spec.user
    assert session.exec('echo "$(id -u):$(id -g)"').stdout.strip() == spec.user
    assert spec.network.mode == "none" and host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert spec.capabilities == [] and host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["Privileged"] is False
    options = host["SecurityOpt"]
    assert "no-new-privileges" in " ".join(options)
    assert any(o.startswith("seccomp=") and len(o) > 100 for o in options), options
    assert host["PidsLimit"] == runtimes.host_pids_limit(host["Runtime"], spec.limits.pids)
    assert host["Memory"] == host["MemorySwap"] == spec.limits.memory
    assert sorted((u["Name"], u["Soft"], u["Hard"]) for u in host["Ulimits"] or []) == sorted(
        (u.name, u.soft, u.hard) for u in spec.ulimits
    )
    mounts = {m["Destination"]: m["RW"] for m in info["Mounts"] if m["Type"] == "bind"}
    assert mounts == {m.target: not m.read_only for m in spec.mounts}
    assert mounts["/input"] is False and mounts["/work"] is True and mounts["/output"] is True
    # The worker's own command is not run: nothing of it is alive, and it left no trace.
    processes = session.exec(PROCESSES).stdout
    assert "COMMAND-RAN" not in processes and "sleep 1000" not in processes
    assert not (box.root / "work" / "COMMAND-RAN").exists()
    assert [e.name for e in session.list("/").entries] == [
        "input",
        "notes",
        "output",
        "session",
        "staged",
        "work",
        "workers",
        "workspace",
    ]
    assert all(e.kind == "folder" for e in session.list("/").entries)


# -- operations and refusals -----------------------------------------------------------------


def test_read_text_windows_images_and_binary(box):
    s = box.session
    text = s.read("/input/a.txt")
    assert isinstance(text, TextContent)
    assert (text.text, text.total_lines, text.truncated, text.truncated_by) == (
        "one\ntwo\nthree\n",
        3,
        False,
        None,
    )
    window = s.read("/input/long.txt", offset=10, limit=2)
    assert isinstance(window, TextContent)
    assert window.text == "line 10\nline 11\n" and window.start_line == 10
    assert window.total_lines == 500 and window.truncated and window.truncated_by == "lines"
    capped = s.read("/input/long.txt")
    assert isinstance(capped, TextContent) and capped.start_line == 1
    assert capped.line_count == min(500, s.files.caps.lines)
    image = s.read("/input/pic.png")
    assert isinstance(image, ImageContent) and (image.mime, image.data) == ("image/png", PNG)
    binary = s.read("/input/blob.bin")
    assert isinstance(binary, BinaryContent) and binary.size == 1024 and "binary" in binary.note
    # A line longer than the byte cap is cut by bytes.
    s.write("/work/wide.txt", "x" * (s.files.caps.text_bytes + 10))
    wide = s.read("/work/wide.txt")
    assert isinstance(wide, TextContent) and wide.truncated and wide.truncated_by == "bytes"
    refused(lambda: s.read("/input/none.txt"), "does not exist", SandboxNotFound)
    refused(lambda: s.read("/input"), "it is a folder", SandboxError)


def test_writes_reach_the_container_and_back(box):
    s = box.session
    written = s.write("/work/new/deep/a.txt", "hello\n")
    assert (written.created, written.size, written.review) == (True, 6, False)
    assert s.write("/work/new/deep/a.txt", "more\n", append=True).size == 11
    inside = s.exec("cat /work/new/deep/a.txt; stat -c '%u' /work/new/deep/a.txt")
    assert inside.stdout.splitlines()[:2] == ["hello", "more"]
    assert inside.stdout.splitlines()[2] != "0"  # the worker owns it, it can change it
    assert s.exec("echo from-inside > /work/in.txt").exit_code == 0
    assert s.read("/work/in.txt").text == "from-inside\n"  # type: ignore[union-attr]
    assert s.exists("/work/in.txt") and not s.exists("/work/none")
    info = s.stat("/work/new/deep/a.txt")
    assert (info.kind, info.size, info.zone) == ("file", 11, "/work")
    assert s.stat("/work/new").kind == "folder"
    names = [(e.name, e.kind) for e in s.list("/work").entries]
    assert ("new", "folder") in names and ("in.txt", "file") in names
    resolved = s.resolve("/work/new/deep/a.txt")
    assert (resolved.zone, resolved.relative, resolved.exists) == ("/work", "new/deep/a.txt", True)
    assert resolved.host_path == str(box.root / "work" / "new" / "deep" / "a.txt")
    assert s.can_read("/input/a.txt") and not s.can_write("/input/a.txt")
    assert s.can_write("/work/x.txt") and not s.can_read("/etc/passwd")
    assert not s.can_write("/output/x.txt") and s.can_write("/output/x.md")
    assert not s.can_write("/output/x.md", size=4096)
    deleted = s.delete("/work/new")
    assert (deleted.kind, deleted.removed) == ("folder", 3)
    assert s.exec("test -e /work/new").exit_code == 1


def test_refusals_guide_to_the_fix(box):
    s = box.session
    message = refused(lambda: s.write("/input/x", "x"), "Cannot write '/input/x'")
    assert "/input is read-only" in message and "Writable:" in message and "/work" in message
    message = refused(lambda: s.read("/etc/passwd"), "Cannot read '/etc/passwd'")
    assert "outside the sandbox" in message and "Readable:" in message and "/input" in message
    refused(lambda: s.delete("/input/a.txt"), "/input is read-only")
    refused(lambda: s.write("/output/r.txt", "x"), ".md")  # the allowed suffixes are named
    message = refused(lambda: s.write("/output/r.md", "x" * 2000), "2000")
    assert "1024" in message
    refused(lambda: s.write("/work/../etc/x", "x"), "Cannot write")
    refused(lambda: s.read("/staged/x"), "write-only outbox")
    refused(lambda: s.delete("/work"), "root of /work", SandboxError)
    assert (box.root / "output").exists() and not list((box.root / "output").iterdir())
    context = s.security_context()
    assert context["trust"] == "session"
    assert context["network"]  # network disabled is said in the context
    zones = {z["path"]: z for z in context["zones"]}
    assert zones["/input"]["write"] is False and zones["/work"]["write"] is True
    assert zones["/notes"]["approval"]["write"] == "ask"
    assert zones["/output"]["suffixes"] == [".md"] and zones["/output"]["max_file_size"] == 1024
    assert context["session"]["id"] == s.id
    assert "none" in json.dumps(context["network"]).lower()


def test_an_ask_zone_write_becomes_a_change_set_at_close(engine, project):
    sandbox_project(project)
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as session:
        written = session.write("/notes/n.txt", "v2")
        assert written.review is True
        assert session.read("/notes/n.txt").text == "v2"  # type: ignore[union-attr]
        assert session.exec("cat /notes/n.txt").stdout == "v2"
    result = session.close()
    assert (project.root / "notes" / "n.txt").read_text() == "v1"  # untouched until applied
    (asked,) = result.asked
    summary = asked.summary() if hasattr(asked, "summary") else asked
    assert summary["zone"] == "notes" and summary["files"] == 1
    applied = cli("staged", "apply", summary["change_id"], "--yes", "--project", str(project.root))
    assert applied.returncode == 0, applied.stderr
    assert (project.root / "notes" / "n.txt").read_text() == "v2"


def test_staged_writes_and_stage_make_change_sets(box):
    s = box.session
    assert s.write("/staged/report.md", "# report\n").review is True
    assert s.write("/staged/report.md", "more\n", append=True).size == len("# report\nmore\n")
    s.write("/work/out/result.txt", "result\n")
    change_id = s.stage(["/work/out/result.txt"], "the result")
    refused(lambda: s.stage([], "x"), "Nothing to stage", SandboxError)
    refused(lambda: s.stage(["/work/none.txt"], "x"), "does not exist", SandboxError)
    refused(lambda: s.stage(["/etc/passwd"], "x"), "outside the sandbox", OrchestratorError)
    listing = cli("staged", "list", "--project", str(box.root), "--json")
    assert listing.returncode == 0, listing.stderr
    assert change_id in listing.stdout and "the result" in listing.stdout
    result = s.close()
    assert result.outbox is not None  # /staged became a change set at close
    listing = cli("staged", "list", "--project", str(box.root), "--json")
    outbox_id = getattr(result.outbox, "change_id", None)
    assert outbox_id and outbox_id in listing.stdout
    shown = cli("staged", "show", outbox_id, "--project", str(box.root))
    assert "report.md" in shown.stdout, shown.stderr


def test_stage_never_reads_a_worker_chosen_name_as_a_tar_option(box):
    s = box.session
    s.exec("echo keep > /work/report.txt; echo x > /work/--remove-files; echo y > /work/-C")
    change_id = s.stage(["/work/report.txt", "/work/--remove-files", "/work/-C"], "report")
    assert (box.root / "work" / "report.txt").read_text() == "keep\n"
    assert (box.root / "work" / "--remove-files").read_text() == "x\n"
    shown = cli("staged", "show", change_id, "--project", str(box.root))
    assert shown.returncode == 0, shown.stderr
    assert "report.txt" in shown.stdout and "--remove-files" in shown.stdout, shown.stdout
    refused(lambda: s.stage(["/"], "x"), "Cannot stage '/': name a file", SandboxError)


def test_untrusted_adds_staged_files_but_never_overwrites(engine, project):
    project.zone("input", "ro", files={"a.txt": "a"})
    project.worker("w", f"{NEVER}\ntrust: untrusted\nsandbox: {{zones: [{{name: input}}]}}")
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as session:
        assert session.write("/staged/one.md", "first").created
        refused(lambda: session.write("/staged/one.md", "second"), "never overwritten")
        refused(lambda: session.write("/staged/one.md", "more", append=True), "never changed")
        assert session.write("/staged/two.md", "other").created
        assert session.exec("cat /staged/one.md").stdout == "first"


def test_every_operation_allowed_or_denied_is_audited_with_the_session_id(box):
    s = box.session
    s.read("/input/a.txt")
    s.write("/work/a.txt", "x")
    s.list("/work")
    s.delete("/work/a.txt")
    s.exec(["true"])
    with pytest.raises(PolicyError):
        s.read("/etc/passwd")
    with pytest.raises(PolicyError):
        s.write("/input/a.txt", "x")
    s.close()
    entries = box.orch.audit.query(AuditFilter(session=s.id))
    seen = [(e.operation, e.allowed, e.path) for e in entries]
    for expected in [
        ("sandbox.read", True, "/input/a.txt"),
        ("sandbox.write", True, "/work/a.txt"),
        ("sandbox.list", True, "/work"),
        ("sandbox.delete", True, "/work/a.txt"),
        ("sandbox.read", False, "/etc/passwd"),
        ("sandbox.write", False, "/input/a.txt"),
    ]:
        assert expected in seen, seen
    (execd,) = [e for e in entries if e.operation == "session.exec"]
    assert execd.metadata["argv"] == ["true"] and execd.metadata["exit_code"] == 0
    denied = [e for e in entries if not e.allowed]
    assert all(e.reason for e in denied)
    assert "session.closed" in [e.operation for e in entries]
    # The command line shows the same entries.
    shown = cli("audit", "--json", "--session", s.id, "--limit", "0", "--project", str(box.root))
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert {"sandbox.read", "sandbox.write", "session.exec"} <= {e["operation"] for e in lines}


# -- the container is hostile: it races the host ------------------------------------------------

RACER = """
import os, shutil, sys, time
out = sys.argv[1]
end = time.time() + float(sys.argv[2])
rounds = 0
def clear():
    try:
        os.unlink("/work/d")
    except IsADirectoryError:
        shutil.rmtree("/work/d", ignore_errors=True)
    except FileNotFoundError:
        pass
def fill():
    os.mkdir("/work/d")
    with open("/work/d/f.txt", "w") as f:
        f.write("inside")
steps = [
    fill,
    lambda: os.symlink(out, "/work/d"),  # the folder becomes a link to the host's
    lambda: (os.mkdir("/work/d"), os.symlink(out + "/f.txt", "/work/d/f.txt")),  # the file
]
while time.time() < end:
    for step in steps:
        clear()
        try:
            step()
        except OSError:  # the host made /work/d meanwhile
            pass
    rounds += 1
print(rounds)
"""


def test_a_container_swapping_a_folder_for_a_symlink_never_leads_the_host_out(box):
    s = box.session
    canary = box.outside / "f.txt"
    before = (canary.stat().st_mtime_ns, sorted(os.listdir(box.outside)))
    racer: dict[str, object] = {}

    def race() -> None:
        racer["result"] = s.exec(["python3", "-c", RACER, str(box.outside), "6"], timeout=60)

    thread = threading.Thread(target=race)
    thread.start()
    ops = {"ok": 0, "refused": 0}
    read_inside = 0
    leaked: list[str] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for op in (
            lambda: s.read("/work/d/f.txt"),
            lambda: s.write("/work/d/f.txt", "host"),
            lambda: s.write("/work/d/g.txt", "host", append=True),
            lambda: s.list("/work/d"),
            lambda: s.stat("/work/d/f.txt"),
            lambda: s.delete("/work/d/f.txt"),
        ):
            try:
                answer = op()
            except OrchestratorError:
                ops["refused"] += 1
                continue
            except OSError as exc:  # a race must end in a refusal, never a raw error
                leaked.append(f"{exc!r} at {traceback.extract_tb(exc.__traceback__)[-2:]}")
                continue
            ops["ok"] += 1
            assert "HOST-SECRET" not in repr(answer)
            if isinstance(answer, TextContent) and answer.text == "inside":
                read_inside += 1
    thread.join(timeout=60)
    result = racer["result"]
    assert result.exit_code == 0, result.stderr  # type: ignore[attr-defined]
    assert int(result.stdout) > 50  # type: ignore[attr-defined]
    assert leaked == []
    assert ops["ok"] > 50 and ops["refused"] > 50, ops  # the race really interleaved
    assert canary.read_text() == "HOST-SECRET"
    assert (canary.stat().st_mtime_ns, sorted(os.listdir(box.outside))) == before


# -- exec ------------------------------------------------------------------------------------


def test_exec_results_env_and_streaming(box):
    s = box.session
    result = s.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.signal is None and not result.timed_out and result.duration_s < 10
    uid = s.exec(["id", "-u"]).stdout.strip()
    assert uid not in ("", "0")
    assert s.exec("echo $HOME $GREETING", env={"GREETING": "hi"}).stdout == "/tmp hi\n"
    refused(lambda: s.exec("true", env={"HOME": "/work"}), "HOME is owned by the sandbox")
    assert s.exec("cat", stdin="fed").stdout == "fed"
    assert s.exec("pwd", cwd="/work").stdout == "/work\n"
    seen: list[tuple[str, bytes]] = []
    streamed = s.exec(
        "echo one; sleep 0.3; echo two >&2", on_output=lambda n, c: seen.append((n, c))
    )
    assert streamed.stdout == "one\n" and seen == [("stdout", b"one\n"), ("stderr", b"two\n")]


def test_an_out_of_range_timeout_is_refused_before_the_command_runs_and_audited(box):
    s = box.session
    for timeout in (1e12, float("inf"), float("nan"), 0, 7 * 24 * 3600 + 1):
        refused(lambda t=timeout: s.exec("echo X > /work/m.txt", timeout=t), "Cannot run with")
    assert not (box.root / "work" / "m.txt").exists()
    for timeout in (1e12, float("nan")):
        answer = Toolset(s).call("exec", {"command": "echo X > /work/m.txt", "timeout": timeout})
        assert answer["ok"] is False and answer["status"] == "invalid_arguments", answer
        assert "'timeout' must be" in answer["error"]
    assert not (box.root / "work" / "m.txt").exists()
    denied = [
        e
        for e in box.orch.audit.query(AuditFilter(session=s.id))
        if e.operation == "session.exec" and not e.allowed
    ]
    assert len(denied) == 5 and all("is not in the range" in (e.reason or "") for e in denied)
    assert s.exec("echo ok", timeout=7 * 24 * 3600).stdout == "ok\n"
    for limits in ({"idle_timeout": float("inf")}, {"max_lifetime": 1e12}):
        refused(lambda k=limits: box.orch.open_session("w", **k), "is not in the range",
                OrchestratorError)  # fmt: skip


def test_exec_timeout_kills_the_whole_tree(box):
    s = box.session
    started = time.monotonic()
    result = s.exec("sleep 300 & sleep 301 & (sleep 302; true) & wait", timeout=1)
    assert result.timed_out and time.monotonic() - started < 15
    processes = s.exec(PROCESSES).stdout
    assert "sleep 30" not in processes, processes
    assert s.exec(["true"]).exit_code == 0  # the session lives on


def test_processes_and_tmp_survive_between_execs(box):
    s = box.session
    assert s.exec("echo kept > /tmp/note; nohup sleep 600 >/dev/null 2>&1 &").exit_code == 0
    assert s.exec("cat /tmp/note").stdout == "kept\n"
    assert "sleep 600" in s.exec(PROCESSES).stdout


# -- lifecycle -------------------------------------------------------------------------------


def test_close_removes_the_container_and_later_calls_say_why(engine, box):
    s = box.session
    assert container_of(engine, s) is not None
    result = s.close()
    assert result.container_removed and container_of(engine, s) is None
    assert s.closed and s.close() is result
    refused(lambda: s.read("/input/a.txt"), "is closed (closed by its owner)", SessionClosed)
    refused(lambda: s.exec("true"), "open a new one", SessionClosed)


@pytest.mark.parametrize(
    ("limits", "because"),
    [
        ({"idle_timeout": 1.0}, "idle for 1 s"),
        ({"idle_timeout": None, "max_lifetime": 1.5}, "maximum lifetime of 1.5 s"),
    ],
)
def test_idle_timeout_and_max_lifetime_close_the_session(engine, project, limits, because):
    sandbox_project(project)
    orch = Orchestrator(project.root, engine=engine)
    session = orch.open_session("w", **limits)
    try:
        assert session.exec(["true"]).exit_code == 0
        deadline = time.monotonic() + 30
        while not session.closed and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session.closed
        deadline = time.monotonic() + 30  # the watchdog is removing the container
        while container_of(engine, session) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert container_of(engine, session) is None
        message = refused(lambda: session.list("/"), because, SessionClosed)
        assert session.id in message
    finally:
        session.close()


def test_keyboard_interrupt_inside_with_removes_the_container(engine, project):
    sandbox_project(project)
    orch = Orchestrator(project.root, engine=engine)
    opened: list[Session] = []

    def agent() -> None:
        with orch.open_session("w") as session:
            opened.append(session)
            assert container_of(engine, session) is not None
            raise KeyboardInterrupt  # Ctrl-C in the middle of the work

    with pytest.raises(KeyboardInterrupt):
        agent()
    (session,) = opened
    assert container_of(engine, session) is None
    refused(lambda: session.exec("true"), "closed on KeyboardInterrupt", SessionClosed)


@pytest.mark.serial
def test_a_sigkilled_owner_leaves_only_what_gc_removes(engine, project):
    sandbox_project(project)
    code = textwrap.dedent(
        f"""
        import sys, time
        from orchestrator import Orchestrator
        session = Orchestrator({str(project.root)!r}).open_session("w")
        print(session.run_id, flush=True)
        time.sleep(600)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        run_id = process.stdout.readline().strip()
        assert run_id, process.stderr.read() if process.stderr else ""
        process.kill()
        process.wait(timeout=30)
    finally:
        process.kill()
        process.communicate()

    def orphans():
        return [
            o
            for o in engine.list_managed()
            if o.kind == "container" and o.labels.get(labels.RUN_ID) == run_id
        ]

    assert len(orphans()) == 1  # SIGKILL gives no chance to clean up...
    result = cli("gc", "--json")
    assert result.returncode == 0, result.stderr
    assert orphans() == []  # ...gc does


# -- child workers ---------------------------------------------------------------------------


def test_a_child_worker_is_called_through_the_broker(engine, project):
    project.zone("work", "rw", files={"a.txt": "parent data"})
    project.worker(
        "main",
        f"{NEVER}\ntrust: session\nchildren: [leaf]\nsandbox: {{zones: [{{name: work, mode: rw}}]}}",
    )
    project.worker(
        "leaf",
        'command: ["sh", "-c", "echo leaf sees $(cat /work/a.txt)"]\ntrust: session\n'
        "sandbox: {zones: [{name: work}]}",
    )
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("main") as session:
        called = session.exec(["orchestrator-call", "leaf"], timeout=120)
        assert called.exit_code == 0, called.stderr
        assert "leaf sees parent data" in called.stdout
        refused_call = session.exec(["orchestrator-call", "stranger"], timeout=60)
        assert refused_call.exit_code != 0 and "stranger" in refused_call.stderr
    calls = orch.audit.query(AuditFilter(operation="broker.call"))
    assert [e.metadata["child"] for e in calls if e.session_id == session.id] == ["leaf"]
