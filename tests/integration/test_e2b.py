"""The E2B server (docs/e2b.md) driven by the unmodified ``e2b`` SDK.

The server is the real command line (``python -m orchestrator e2b serve``) in a
subprocess on 127.0.0.1; the SDK reads the three variables it printed. Each sandbox is a
session of the project's worker: commands and files reach the same container, a zone's
mode holds, the key and the sandbox's access token are required, unknown routes get
E2B's error shape, and nothing is left once the sandboxes are killed or the server stops.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import subprocess
import sys

import httpx
import pytest
from e2b import (
    ALL_TRAFFIC,
    AsyncSandbox,
    CommandExitException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)

from orchestrator.audit import AuditFilter
from orchestrator.config import load_project
from orchestrator.runtime import open_audit
from tests.conftest import stop, wait_until
from tests.integration.conftest import cli, containers_of, web_service

pytestmark = pytest.mark.docker

WORKER = """\
sandbox:
  zones:
    - {name: data, mode: ro}
    - {name: out, mode: rw}
network: none
resources: {memory: 256m, timeout: 60}
"""


@pytest.fixture
def server(isolation, project, monkeypatch):
    """The server over a project with one worker ``box``; its exports in the environment."""
    project.zone("data", "ro", files={"notes.txt": "hello from the zone\n"})
    project.zone("out", "rw", extra="untrusted_output: true")
    project.worker("box", WORKER)
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "e2b", "serve", "--project", str(project.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TESTCONTAINERS_RYUK_DISABLED": "true"},
    )
    exports = {}
    try:
        for _ in range(3):
            line = process.stdout.readline()
            assert line.startswith("export "), (
                line,
                process.stderr.read() if process.poll() is not None else "",
            )
            name, _, value = line[len("export ") :].strip().partition("=")
            exports[name] = value
        assert set(exports) == {"E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"}
        assert exports["E2B_SANDBOX_URL"] == exports["E2B_API_URL"]
        assert exports["E2B_API_URL"].startswith("http://127.0.0.1:")
        for name, value in exports.items():
            monkeypatch.setenv(name, value)
        exports["pid"] = process.pid
        exports["project"] = project
        yield exports
    finally:
        stop(process)
    key_file = project.root / ".sandbox" / "e2b-api-key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert key_file.read_text().strip() == exports["E2B_API_KEY"]


def test_create_run_files_kill(isolation, server, engine, project):
    assert containers_of(engine, server["pid"]) == []
    sandbox = Sandbox.create(
        "box", timeout=120, metadata={"purpose": "test"}, envs={"GREETING": "hi"}
    )
    try:
        # a foreground command: its output, exit code, env and cwd
        done = sandbox.commands.run("echo $GREETING $EXTRA; pwd; echo oops >&2; id -u")
        assert done.exit_code == 0
        uid = project.identity[0]
        assert done.stdout == f"hi\n/tmp\n{uid}\n", done.stdout  # the worker's folder, its uid
        assert done.stderr == "oops\n"
        shown = sandbox.commands.run(
            "echo $GREETING $EXTRA; pwd", envs={"EXTRA": "there"}, cwd="/tmp"
        )
        assert shown.stdout == "hi there\n/tmp\n"
        # a failing command raises the SDK's own error, with its exit code
        with pytest.raises(CommandExitException) as failed:
            sandbox.commands.run("exit 3")
        assert failed.value.exit_code == 3
        # a command over its timeout is stopped
        with pytest.raises(TimeoutException):
            sandbox.commands.run("sleep 30", timeout=2)
        assert wait_until(lambda: sandbox.commands.list() == [], timeout=10)  # it was stopped
        # a background command with a handle
        handle = sandbox.commands.run("sleep 1; echo later", background=True)
        [listed] = sandbox.commands.list()
        assert (listed.pid, listed.cmd, listed.args) == (
            handle.pid,
            "/bin/bash",
            ["-l", "-c", "sleep 1; echo later"],
        )
        assert handle.wait().stdout == "later\n"
        assert sandbox.commands.list() == []
        # a background command and what it forked, killed through its handle
        server_like = sandbox.commands.run("sleep 300 & sleep 301; echo never", background=True)
        assert wait_until(
            lambda: (
                "sleep 301"
                in sandbox.commands.run(
                    "ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr '\\0' ' '"
                ).stdout
            ),
            timeout=10,
        )
        assert server_like.kill()
        with pytest.raises(CommandExitException):
            server_like.wait()
        assert wait_until(lambda: sandbox.commands.list() == [], timeout=10)
        left = sandbox.commands.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
        assert "sleep 30" not in left, left
        assert sandbox.commands.kill(server_like.pid) is False

        # files: write, read, list, exists, make_dir, rename, remove
        info = sandbox.files.write("/out/report.md", "# report\n")
        assert info.path == "/out/report.md"
        assert sandbox.files.read("/out/report.md") == "# report\n"
        assert (project.root / "out" / "report.md").read_text() == "# report\n"
        assert sandbox.commands.run("cat /out/report.md").stdout == "# report\n"
        sandbox.files.write("/tmp/blob.bin", b"\x00\x01\xff")
        sandbox.files.write("/tmp/zipped.txt", "through gzip\n" * 1000, gzip=True)
        assert sandbox.files.read("/tmp/zipped.txt") == "through gzip\n" * 1000
        assert sandbox.files.read("/tmp/blob.bin", format="bytes") == b"\x00\x01\xff"
        assert sandbox.files.read("/data/notes.txt") == "hello from the zone\n"
        assert sandbox.files.exists("/out/report.md")
        assert not sandbox.files.exists("/out/missing")
        assert sandbox.files.make_dir("/tmp/new/deep")
        assert not sandbox.files.make_dir("/tmp/new/deep")
        names = {e.name: e for e in sandbox.files.list("/tmp/new")}
        assert set(names) == {"deep"} and names["deep"].type.value == "dir"
        listed = {e.path for e in sandbox.files.list("/tmp", depth=2)}
        assert {"/tmp/blob.bin", "/tmp/new", "/tmp/new/deep"} <= listed
        moved = sandbox.files.rename("/tmp/blob.bin", "/tmp/new/blob.bin")
        assert moved.path == "/tmp/new/blob.bin" and moved.size == 3
        sandbox.files.remove("/tmp/new")
        assert not sandbox.files.exists("/tmp/new")
        with pytest.raises(NotFoundException):
            sandbox.files.read("/tmp/new/blob.bin")
        # the read-only zone stays read-only, and so does the root
        with pytest.raises(SandboxException):
            sandbox.files.write("/data/planted", "x")
        with pytest.raises(SandboxException):
            sandbox.files.write("/etc/planted", "x")
        assert not (project.root / "data" / "planted").exists()

        # a folder watched while a background command streams its output and writes in it
        assert sandbox.files.make_dir("/tmp/w")
        watcher = sandbox.files.watch_dir("/tmp/w", recursive=True)
        seen_output = []
        writer = sandbox.commands.run(
            "for i in 1 2 3; do echo $i > /tmp/w/f$i; echo wrote $i; sleep 0.3; done; mkdir /tmp/w/sub; echo x > /tmp/w/sub/g",
            background=True,
        )
        assert writer.wait(on_stdout=seen_output.append).exit_code == 0
        assert seen_output == ["wrote 1\n", "wrote 2\n", "wrote 3\n"]
        events = {(e.name, e.type.name) for e in watcher.get_new_events()}
        assert events == {
            ("f1", "CREATE"),
            ("f2", "CREATE"),
            ("f3", "CREATE"),
            ("sub", "CREATE"),
            ("sub/g", "CREATE"),
        }
        sandbox.commands.run("rm /tmp/w/f1; echo longer > /tmp/w/f2")
        events = {(e.name, e.type.name) for e in watcher.get_new_events()}
        assert events == {("f1", "REMOVE"), ("f2", "WRITE")}
        assert watcher.get_new_events() == []
        watcher.stop()
        # the REST side: info, list with a metadata filter, timeout
        got = Sandbox.get_info(sandbox.sandbox_id)
        assert got.metadata == {"purpose": "test"} and got.template_id == "box"
        assert [
            s.sandbox_id
            for s in Sandbox.list(query=SandboxQuery(metadata={"purpose": "test"})).next_items()
        ] == [sandbox.sandbox_id]
        assert Sandbox.list(query=SandboxQuery(metadata={"purpose": "other"})).next_items() == []
        sandbox.set_timeout(60)
        assert sandbox.is_running()
        # connect: the same sandbox, from its id alone
        again = Sandbox.connect(sandbox.sandbox_id, timeout=90)
        assert again.commands.run("cat /out/report.md").stdout == "# report\n"
        # many files at once, and one file's details
        written = sandbox.files.write_files(
            [{"path": "/tmp/m/a.txt", "data": "a"}, {"path": "/tmp/m/b.bin", "data": b"bb"}]
        )
        assert sorted(w.path for w in written) == ["/tmp/m/a.txt", "/tmp/m/b.bin"]
        assert sandbox.commands.run("cat /tmp/m/a.txt /tmp/m/b.bin").stdout == "abb"
        entry = sandbox.files.get_info("/tmp/m/b.bin")
        assert (entry.name, entry.size, entry.type.value) == ("b.bin", 2, "file")
        # the outbox: what the sandbox leaves there becomes a change set when it is killed
        sandbox.files.write("/staged/summary.md", "# staged\n")
    finally:
        assert sandbox.kill()
    staged = cli("staged", "list", "--project", str(project.root), "--json")
    assert staged.returncode == 0, staged.stderr
    [change] = staged.json()
    assert (change["worker"], change["files"], change["status"]) == ("box", 1, "pending")
    assert change["session_id"] == sandbox.sandbox_id
    # every command and file operation is in the project's audit log, under the session
    audit = open_audit(load_project(project.root))
    execs = audit.query(AuditFilter(operation="session.exec"))
    commands = [" ".join(e.metadata["argv"]) for e in execs]
    assert any("echo $GREETING $EXTRA; pwd" in c for c in commands), commands
    assert any(c.endswith(" /out/report.md") for c in commands), commands
    assert {e.session_id for e in execs} == {sandbox.sandbox_id}
    (started,) = audit.query(AuditFilter(operation="run.started"))
    assert started.metadata["isolation"] == isolation
    assert not sandbox.is_running()
    assert Sandbox.kill(sandbox.sandbox_id) is False
    assert containers_of(engine, server["pid"]) == []  # the session's container is gone
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id)


def test_async_client(server):
    async def go():
        sandbox = await AsyncSandbox.create("box", timeout=60)
        try:
            done = await sandbox.commands.run("echo async")
            await sandbox.files.write("/tmp/a.txt", "from async")
            # pause, and connect resuming it, through the async client too
            assert await sandbox.pause() is True
            assert not await sandbox.is_running()
            again = await AsyncSandbox.connect(sandbox.sandbox_id, timeout=60)
            assert (await again.commands.run("cat /tmp/a.txt")).stdout == "from async"
            return done.stdout, await sandbox.files.read("/tmp/a.txt")
        finally:
            await sandbox.kill()

    assert asyncio.run(go()) == ("async\n", "from async")


def test_refusals(server):
    url, key = server["E2B_API_URL"], server["E2B_API_KEY"]
    # no key, a wrong key: refused by the SDK's own calls and over plain HTTP
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "0" * 40).next_items()
    for headers in ({}, {"X-API-Key": key[:-1] + ("0" if key[-1] != "0" else "1")}):
        answer = httpx.get(f"{url}/v2/sandboxes", headers=headers)
        assert answer.status_code == 401
        assert answer.json()["code"] == 401 and "API key" in answer.json()["message"]
    # an unknown route and a malformed body: E2B's error shape, no traceback
    answer = httpx.get(f"{url}/no/such/route", headers={"X-API-Key": key})
    assert answer.status_code == 404
    assert set(answer.json()) == {"code", "message"}
    answer = httpx.post(f"{url}/v2/sandboxes", headers={"X-API-Key": key}, content=b"{nope")
    assert answer.status_code == 400 and answer.json()["message"] == "the request body is not JSON"
    # an unsupported call: one line naming the route
    answer = httpx.post(f"{url}/sandboxes/x/timeout", headers={"X-API-Key": key}, json={})
    assert answer.status_code == 400 and "timeout" in answer.json()["message"]
    answer = httpx.post(
        f"{url}/sandboxes/x/timeout", headers={"X-API-Key": key}, json={"timeout": "soon"}
    )
    assert answer.status_code == 400 and "whole number of seconds" in answer.json()["message"]
    answer = httpx.get(f"{url}/v2/sandboxes/x/logs", headers={"X-API-Key": key})
    assert answer.status_code == 501 and "not supported" in answer.json()["message"]
    # a template that is not a worker (nor a path), and the default template without a base worker
    with pytest.raises(SandboxException, match="not a worker of the project"):
        Sandbox.create("../../etc")
    with pytest.raises(SandboxException, match="no worker named 'base'"):
        Sandbox.create()
    # another sandbox's id without its token, or a made-up one: refused in the sandbox API
    sandbox = Sandbox.create("box", timeout=60)
    try:
        for headers in (
            {"E2b-Sandbox-Id": sandbox.sandbox_id},
            {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": "wrong"},
        ):
            answer = httpx.get(f"{url}/files", params={"path": "/etc/hostname"}, headers=headers)
            assert answer.status_code == 401, answer.text
        # calls not supported yet: one line naming them, through the SDK's own calls
        with pytest.raises(SandboxException, match="network: not supported"):
            sandbox.update_network({"deny_out": [ALL_TRAFFIC]})
        # metrics: one sample of the container, now (the engine's one-shot stats)
        [sample] = sandbox.get_metrics()
        assert (sample.cpu_count, sample.mem_total) == (sandbox.get_info().cpu_count, 256 << 20)
        assert 0 < sample.mem_used <= sample.mem_total and 0 <= sample.cpu_used_pct <= 100
        assert (sample.disk_used, sample.disk_total) == (0, 0)
        assert sandbox.get_metrics(end=datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)) == []
        with pytest.raises(NotFoundException, match="process 1 is not running"):
            sandbox.commands.connect(1)
        with pytest.raises(NotFoundException, match="process 1 is not running"):
            sandbox.commands.send_stdin(1, "x")
        # no internet asked of a worker that has some: refused, never widened or ignored
        server_project = server["project"]
        server_project.worker(
            "online", WORKER.replace("network: none", "network: {allow: [example.invalid]}")
        )
        with pytest.raises(SandboxException, match="worker 'online' has network 'allowlist'"):
            Sandbox.create("online", allow_internet_access=True)
        with pytest.raises(SandboxException, match="worker 'box' has network 'none', not full"):
            Sandbox.create("box", allow_internet_access=True)
        # nothing was created by the refusals: only this test's own sandbox runs
        assert [s.sandbox_id for s in Sandbox.list().next_items()] == [sandbox.sandbox_id]
        with pytest.raises(SandboxException, match="network.deny_out: only all traffic"):
            Sandbox.create("box", network={"deny_out": ["192.0.2.1"]})
        # malformed in-sandbox requests: Connect's error shape, no traceback
        token = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token}
        start = "application/connect+json"
        for route, body, kind, says in (
            ("/process.Process/Start", b"\x00\x00\x00\x00\x05{nope", start, "not JSON"),
            ("/process.Process/Start", b"\x00\x00", start, "truncated"),
            (
                "/process.Process/Start",
                b'\x00\x00\x00\x00\x0d{"process":7}',
                start,
                "ProcessConfig",
            ),
            ("/filesystem.Filesystem/Stat", b"[]", "application/json", "not a JSON object"),
            ("/filesystem.Filesystem/Stat", b"{}", "application/json", "path: give a path"),
        ):
            answer = httpx.post(
                f"{url}{route}", content=body, headers={**token, "Content-Type": kind}
            )
            assert answer.status_code == 400, (route, answer.text)
            assert answer.json()["code"] == "invalid_argument", answer.text
            assert says in answer.json()["message"], answer.text
        # a made-up sandbox is not running (E2B's edge says 502)
        headers = {"E2b-Sandbox-Id": "nope", "X-Access-Token": "wrong"}
        answer = httpx.get(f"{url}/files", params={"path": "/etc/hostname"}, headers=headers)
        assert answer.status_code == 502 and set(answer.json()) == {"code", "message"}
    finally:
        sandbox.kill()


def test_stopping_the_server_kills_its_sandboxes(isolation, project, engine, server):
    sandbox = Sandbox.create("box", timeout=60)
    assert sandbox.commands.run("true").exit_code == 0
    assert len(containers_of(engine, server["pid"])) >= 1
    os.kill(server["pid"], signal.SIGTERM)
    assert wait_until(lambda: containers_of(engine, server["pid"]) == [], timeout=60)


def test_a_sandbox_past_its_timeout_is_killed(isolation, engine, server):
    sandbox = Sandbox.create("box", timeout=6)
    assert sandbox.is_running()
    # another user than the worker is refused, for commands and files alike
    with pytest.raises(SandboxException, match="worker's own uid"):
        sandbox.commands.run("id", user="root")
    with pytest.raises(SandboxException, match="worker's own uid"):
        sandbox.files.read("/etc/hostname", user="root")
    assert wait_until(lambda: not sandbox.is_running(), timeout=30)
    assert wait_until(lambda: containers_of(engine, server["pid"]) == [], timeout=30)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id)


def test_ten_sandboxes_driven_at_once(isolation, engine, server):
    """Ten sandboxes created, used and killed concurrently (async client): each sees only
    its own files and its own environment."""

    async def one(index: int) -> tuple[str, str]:
        sandbox = await AsyncSandbox.create("box", timeout=120, envs={"INDEX": str(index)})
        try:
            await sandbox.files.write("/tmp/mine.txt", f"file {index}")
            done = await sandbox.commands.run("echo $INDEX; ls /tmp")
            return done.stdout, await sandbox.files.read("/tmp/mine.txt")
        finally:
            await sandbox.kill()

    async def all_of_them():
        return await asyncio.gather(*(one(i) for i in range(10)))

    results = asyncio.run(all_of_them())
    assert results == [(f"{i}\nmine.txt\n", f"file {i}") for i in range(10)]
    assert containers_of(engine, server["pid"]) == []


SCRATCH = """\
sandbox:
  zones:
    - {name: data, mode: ro}
network: none
resources: {memory: 256m, timeout: 60}
"""


def test_pause_resume_snapshot_fork(isolation, engine, server):
    """The sessions' lifecycle through the SDK: a paused sandbox keeps its processes and is
    not reachable until ``connect`` resumes it; a snapshot and a fork start sandboxes with
    its files and none of its processes, each changing only its own."""
    project = server["project"]
    project.worker("scratch", SCRATCH)
    sandbox = Sandbox.create("scratch", timeout=120, metadata={"role": "source"})
    others: list[Sandbox] = []
    try:
        sandbox.commands.run("echo prepared > /tmp/state")
        ticker = sandbox.commands.run(
            "while :; do date +%s%N > /tmp/tick; sleep 0.2; done", background=True
        )
        assert sandbox.pause() is True
        assert sandbox.pause() is False  # paused already
        with pytest.raises(SandboxException, match="pause mode 'filesystem'"):
            Sandbox.pause(sandbox.sandbox_id, mode="filesystem")
        with pytest.raises(SandboxException, match="on_resume='reboot'"):
            Sandbox.connect(sandbox.sandbox_id, on_resume="reboot")
        assert not sandbox.is_running()
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [sandbox.sandbox_id]
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
        assert running == []
        with pytest.raises(SandboxException, match="is paused: Sandbox.connect resumes it"):
            sandbox.commands.run("true")
        url, headers = server["E2B_API_URL"], {"E2b-Sandbox-Id": sandbox.sandbox_id}
        answer = httpx.get(f"{url}/files", params={"path": "/tmp/state"}, headers=headers)
        assert answer.status_code == 401  # without its token, a paused sandbox tells nothing
        with pytest.raises(SandboxException, match="is paused: resume it first"):
            sandbox.create_snapshot()
        # connect resumes it: the same processes go on
        again = Sandbox.connect(sandbox.sandbox_id, timeout=120)
        assert again.is_running() and sandbox.is_running()
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
        assert [p.pid for p in sandbox.commands.list()] == [ticker.pid]
        first = sandbox.files.read("/tmp/tick")
        assert wait_until(lambda: sandbox.files.read("/tmp/tick") != first, timeout=10)

        # a snapshot, and a sandbox made from it: its files, none of its processes
        with pytest.raises(SandboxException, match="named by its id"):
            sandbox.create_snapshot(name="mine")
        snap = sandbox.create_snapshot()
        assert snap.snapshot_id.startswith("snap-") and snap.names == [snap.snapshot_id]
        assert [s.snapshot_id for s in sandbox.list_snapshots().next_items()] == [snap.snapshot_id]
        child = Sandbox.create(snap.snapshot_id, timeout=60)
        others.append(child)
        assert child.sandbox_id != sandbox.sandbox_id
        assert child.commands.run("cat /tmp/state").stdout == "prepared\n"
        assert child.commands.list() == []
        child.files.write("/tmp/state", "child\n")
        assert sandbox.files.read("/tmp/state") == "prepared\n"
        with pytest.raises(SandboxException, match="a snapshot keeps no values"):
            Sandbox.create(snap.snapshot_id, envs={"A": "b"})

        # fork: two sandboxes from a new snapshot, each its own
        forks = sandbox.fork(count=2, timeout=60)
        assert all(isinstance(f, Sandbox) for f in forks), forks
        others.extend(forks)
        for index, forked in enumerate(forks):
            assert forked.commands.run("cat /tmp/state").stdout == "prepared\n"
            forked.files.write("/tmp/state", f"fork {index}\n")
            assert Sandbox.get_info(forked.sandbox_id).metadata == {"role": "source"}
        assert [f.files.read("/tmp/state") for f in forks] == ["fork 0\n", "fork 1\n"]
        assert sandbox.files.read("/tmp/state") == "prepared\n"
        # a worker with a writable host zone is never forked (a fork would write there)
        box = Sandbox.create("box", timeout=60)
        others.append(box)
        with pytest.raises(SandboxException, match="writable host folder"):
            box.fork()
        assert box.pause()  # killed below while paused: resumed, its outbox read, closed
        assert Sandbox.list_snapshots(sandbox_id=box.sandbox_id).next_items() == []  # none left
        # the snapshots are the project's: listed by the CLI, removed through the SDK
        taken = {s.snapshot_id for s in Sandbox.list_snapshots().next_items()}
        assert len(taken) == 2 and snap.snapshot_id in taken
        listed = cli("snapshot", "list", "--project", str(project.root), "--json")
        assert {s["id"] for s in listed.json()} == taken
        for snapshot_id in taken:
            assert Sandbox.delete_snapshot(snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        assert Sandbox.list_snapshots().next_items() == []
        assert forks[0].commands.run("cat /tmp/state").stdout == "fork 0\n"  # forks go on
    finally:
        for other in others:
            other.kill()
        sandbox.kill()
    assert wait_until(lambda: containers_of(engine, server["pid"]) == [], timeout=60)


#: Fetches http://web.NET/ and http://other.NET/ through the sandbox's proxy variables.
FETCH = """python3 -c '
import urllib.request, urllib.error
for name in ("web", "other"):
    try:
        print(name, urllib.request.urlopen("http://%s.NET/" % name, timeout=20).status)
    except urllib.error.HTTPError as refused:
        print(name, refused.code)
    except OSError as failed:
        print(name, "unreachable")
'"""


@pytest.fixture
def local_web(engine, project):
    """A local web server on a test-made network the project declares as a service."""
    from orchestrator.docker import egress as eg
    from orchestrator.docker import egress_gc as eg_gc

    with web_service(engine, "e2b") as net:
        project.extra = f"network:\n  services:\n    - network: {net}\n"
        project.write_project()
        try:
            yield net
        finally:  # the proxy of the worker's own allowlist (web_service removes web's)
            both = eg.validate_allowlist([f"web.{net}", f"other.{net}"])
            eg_gc.remove_egress(engine, eg.egress_key(both, [net]))


def test_network_rules_narrow_the_workers_network(isolation, engine, local_web, server):
    """``network`` and ``allow_internet_access`` narrow the worker's network, enforced by
    the project's egress proxy; asking for more than the worker declares is refused."""
    net = local_web
    project = server["project"]
    project.worker(
        "online",
        WORKER.replace("network: none", f"network: {{allow: [web.{net}, other.{net}]}}"),
    )
    fetch = FETCH.replace("NET", net)
    sandboxes = []
    try:
        own = Sandbox.create("online", timeout=60)  # the worker's own allowlist: both
        sandboxes.append(own)
        assert own.commands.run(fetch).stdout == "web 200\nother 200\n"
        narrow = Sandbox.create(
            "online", timeout=60, network={"deny_out": [ALL_TRAFFIC], "allow_out": [f"web.{net}"]}
        )
        sandboxes.append(narrow)
        assert narrow.commands.run(fetch).stdout == "web 200\nother 403\n"  # the proxy refuses
        closed = Sandbox.create("online", timeout=60, allow_internet_access=False)
        sandboxes.append(closed)
        assert closed.commands.run(fetch).stdout == "web unreachable\nother unreachable\n"
        # more than the worker declares: refused before any container exists
        with pytest.raises(SandboxException, match=r"not on worker 'online''s allowlist"):
            Sandbox.create(
                "online", network={"deny_out": [ALL_TRAFFIC], "allow_out": ["example.org"]}
            )
        with pytest.raises(SandboxException, match="worker 'box' has network 'none'"):
            Sandbox.create("box", network={"deny_out": [ALL_TRAFFIC], "allow_out": [f"web.{net}"]})
        assert len(Sandbox.list().next_items()) == 3
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
    assert wait_until(lambda: containers_of(engine, server["pid"]) == [], timeout=60)
