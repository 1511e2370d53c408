"""Pause, resume, snapshots and forks of live sessions, on the real engine (gVisor and runc).

- pause freezes a counting process (its value stays put while paused) and resume lets it
  go on from where it was; calls on a paused session are refused in one line naming
  ``resume``; a paused session does not close as idle;
- a snapshot taken, the source changed, two forks each see the snapshot's state (a file
  in the session folder, one in /tmp, and under gVisor with ``image_user`` a root edit
  under /etc) and are independent of each other and of the source; their grant is the
  snapshot's; a fork made after the source was stopped and gc ran;
- a writable host zone refuses a fork in one line naming it; a snapshot id of another
  project is refused; ``snapshot rm`` leaves nothing (image, folder); gc removes what a
  killed snapshot left (and never a snapshot);
- the audit events, and the command line through the real entry point.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
import uuid

import pytest

from orchestrator import Orchestrator
from orchestrator.audit import AuditFilter
from orchestrator.runtime import snapshots as snapshots_module
from orchestrator.runtime.session import SessionPaused
from orchestrator.runtime.snapshots import REPOSITORY, SnapshotError
from tests.integration.conftest import cli, require_gvisor

pytestmark = pytest.mark.docker

WORKER = 'command: ["sleep", "1000"]\ntrust: session\nsandbox: {zones: []}\n'
COUNTER = (
    "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /session/count.new; "
    "mv /session/count.new /session/count; sleep 0.02; done' >/dev/null 2>&1 &"
)


@pytest.fixture(autouse=True)
def no_snapshot_left(engine, project):
    """Whatever a test did (or failed to do), its project's snapshots and their images go
    at its end; a test that passes must have removed them itself."""
    yield
    left = []
    store = project.root / ".sandbox" / "snapshots"
    names = [p.name for p in store.iterdir()] if store.is_dir() else []
    for name in names:
        snap_id = name.removeprefix(".tmp-").rpartition("-")[0] if name.startswith(".") else name
        left.append(name)
        engine.remove_image(f"{REPOSITORY}:{snap_id}")
    for image, _tags, found in engine.images_labelled("io.orchestrator.snapshot-root"):
        if found.get("io.orchestrator.snapshot-root") == str(project.root / ".sandbox"):
            engine.remove_image(image)
    assert not left, f"the test left snapshots behind: {left}"


def _events(orch: Orchestrator, operation: str) -> list:
    return [e for e in orch.audit.query(AuditFilter()) if e.operation == operation]


def _image_gone(engine, ref: str) -> bool:
    return not engine.image_exists(ref)


def test_pause_freezes_and_resume_continues(engine, project, isolation):
    """The counter writes to the session folder, which the host reads while the sandbox
    is frozen: its value stays put for a second, then goes on after resume."""
    project.worker("w", WORKER)
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w", idle_timeout=1.0) as s:
        assert s.exec(COUNTER).exit_code == 0
        count = s._run.prepared.paths.session / "count"
        assert wait_for(lambda: _host_count(count) > 5)
        assert s.pause() < 1.0
        time.sleep(0.2)  # a write in flight lands
        frozen = _host_count(count)
        time.sleep(1.0)
        assert _host_count(count) == frozen, "a paused session's process went on counting"
        with pytest.raises(SessionPaused) as refused:
            s.exec("true")
        assert "resume" in str(refused.value) and "\n" not in str(refused.value)
        with pytest.raises(SessionPaused):
            s.read("/session/count")
        assert not s.closed, "a paused session closed as idle"  # 1.2 s > its idle timeout
        assert s.resume() < 1.0
        assert wait_for(lambda: _host_count(count) > frozen + 5, 10.0)
        assert frozen > 5
    assert _events(orch, "session.pause")[0].metadata["seconds"] < 1.0
    assert _events(orch, "session.resume")


def test_pauses_racing_commands_never_wedge_the_sandbox(engine, project, isolation):
    """Commands start in a loop from other threads while the session is paused and resumed
    again and again: a command is refused while paused or runs whole, and every pause and
    resume answers (an exec started just before a freeze once left the runtime waiting on
    a frozen process, and every later resume with it)."""
    import threading

    project.worker("w", WORKER)
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w", idle_timeout=60.0) as s:
        stop, ran, failures = threading.Event(), [], []

        def commands() -> None:
            while not stop.is_set():
                try:
                    ran.append(s.exec("true").exit_code)
                except SessionPaused:
                    pass
                except Exception as exc:  # noqa: BLE001 - reported below
                    failures.append(exc)

        threads = [threading.Thread(target=commands, daemon=True) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            for _ in range(15):
                for step in (s.pause, s.resume):
                    done = threading.Thread(target=step, daemon=True)
                    done.start()
                    done.join(timeout=30)
                    assert not done.is_alive(), f"{step.__name__} never answered"
                time.sleep(0.02)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        assert not failures, failures
        assert ran and set(ran) == {0}, ran
        assert s.exec("echo still here").stdout.strip() == "still here"


def _host_count(path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _task_image(engine) -> str:
    tag = f"orchestrator-test/snap-root:{uuid.uuid4().hex[:8]}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"FROM orchestrator/worker:latest\nUSER root\n"
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    for _ in engine.api.build(fileobj=buffer, custom_context=True, tag=tag, rm=True, decode=True):
        pass
    return tag


@pytest.fixture
def root_image(engine):
    tag = _task_image(engine)
    yield tag
    engine.api.remove_image(tag, force=True)


def test_snapshot_and_two_independent_forks(engine, project, isolation, request):
    image_user = isolation == "gvisor"
    extra = ""
    if image_user:
        tag = request.getfixturevalue("root_image")
        extra = f"image: {tag}\nimage_user: true\n"
    project.worker("w", WORKER + extra)
    orch = Orchestrator(project.root, engine=engine)
    root_edit = "echo snap > /etc/snap.conf; " if image_user else ""
    with orch.open_session("w", snapshots=True) as source:
        setup = source.exec(f"{root_edit}echo snap > /session/s.txt; echo snap > /tmp/t.txt")
        assert setup.exit_code == 0, setup.stderr
        snap = source.snapshot()
        assert snap.bytes > 0 and snap.seconds >= 0
        source.exec(f"{root_edit.replace('snap >', 'source >')}echo source > /session/s.txt; "
                    "echo source > /tmp/t.txt")  # fmt: skip
        forks = snap.fork(2)
        try:
            show = "cat /session/s.txt /tmp/t.txt" + (" /etc/snap.conf" if image_user else "")
            expected = "snap\nsnap\n" + ("snap\n" if image_user else "")
            for fork in forks:
                assert fork.exec(show).stdout == expected
                assert fork.files.grant == _same_grant(fork, source)
            forks[0].exec("echo first > /session/s.txt; echo first > /tmp/t.txt")
            assert forks[1].exec(show).stdout == expected  # not the other fork's
            assert source.exec("cat /session/s.txt /tmp/t.txt").stdout == "source\nsource\n"
            assert forks[0].id != forks[1].id != source.id
        finally:
            for fork in forks:
                fork.close()
    forks_audited = _events(orch, "session.fork")
    assert len(forks_audited) == 2 and forks_audited[0].metadata["snapshot"] == snap.id
    taken = _events(orch, "session.snapshot")
    assert taken[0].metadata["snapshot"] == snap.id and taken[0].metadata["bytes"] == snap.bytes

    # after the source is gone and gc ran, a fork still starts from the snapshot
    orch.gc()
    [late] = orch.fork(snap.id)
    with late:
        assert late.exec("cat /session/s.txt /tmp/t.txt").stdout == "snap\nsnap\n"
    assert [s.id for s in orch.snapshots()] == [snap.id]

    orch.remove_snapshot(snap.id)
    assert orch.snapshots() == []
    assert _image_gone(engine, snap.tag)
    assert not (project.root / ".sandbox" / "snapshots" / snap.id).exists()
    assert _events(orch, "snapshot.removed")[0].metadata["snapshot"] == snap.id


def _same_grant(fork, source):
    """The fork's grant, checked to equal the source's but for its own session folders."""
    theirs = {(z.name, z.target, z.mode) for z in source.files.grant.zones}
    ours = {(z.name, z.target, z.mode) for z in fork.files.grant.zones}
    assert ours == theirs
    assert fork.files.grant.network == source.files.grant.network
    assert fork.files.grant.limits == source.files.grant.limits
    return fork.files.grant


def test_image_user_root_needs_snapshots(engine, project, root_image):
    require_gvisor(engine)
    project.isolation = "gvisor"
    project.write_project()
    project.worker("w", WORKER + f"image: {root_image}\nimage_user: true\n")
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as s, pytest.raises(SnapshotError) as refused:
        s.snapshot()
    assert "--snapshots" in str(refused.value) and "\n" not in str(refused.value)
    assert orch.snapshots() == []


def test_writable_host_zone_refuses_a_fork(engine, project):
    project.zone("data", "rw", files={"d.txt": "host\n"})
    project.worker("w", WORKER.replace("{zones: []}", "{zones: [{name: data, mode: rw}]}"))
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as s:
        snap = s.snapshot()
    try:
        with pytest.raises(SnapshotError) as refused:
            snap.fork(1)
        assert "'data'" in str(refused.value) and "\n" not in str(refused.value)
        assert (project.root / "data" / "d.txt").read_text() == "host\n"
    finally:
        orch.remove_snapshot(snap.id)


def test_another_projects_snapshot_is_refused(engine, project, tmp_path):
    from tests.conftest import ProjectDir

    project.worker("w", WORKER)
    other = ProjectDir(tmp_path / "other")
    other.write_project()
    other.worker("w", WORKER)
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as s:
        snap = s.snapshot()
    try:
        foreign = Orchestrator(other.root, engine=engine)
        with pytest.raises(SnapshotError) as refused:
            foreign.fork(snap.id)
        assert "no snapshot" in str(refused.value)
        done = cli("session", "fork", snap.id, "--project", str(other.root))
        assert done.returncode == 125
        assert len(done.stderr.strip().splitlines()) == 1 and snap.id in done.stderr
        done = cli("snapshot", "rm", snap.id, "--project", str(other.root))
        assert done.returncode == 125
        assert [s.id for s in orch.snapshots()] == [snap.id]
    finally:
        orch.remove_snapshot(snap.id)


def test_a_killed_snapshot_leaves_nothing(engine, project, monkeypatch):
    """A snapshot whose maker dies after its image is made: the temporary folder and the
    image are left, no snapshot is listed; gc removes both and no real snapshot."""
    project.worker("w", WORKER)
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as s:
        kept = s.snapshot()

        write = snapshots_module._write_file

        def dies(folder, name, data):
            if name == snapshots_module.MANIFEST:  # the image is made by then
                raise KeyboardInterrupt  # stands for the SIGKILL: nothing after it runs
            write(folder, name, data)

        monkeypatch.setattr(snapshots_module, "_write_file", dies)
        monkeypatch.setattr(snapshots_module, "_remove_folder", lambda *a: None)
        monkeypatch.setattr(type(engine), "remove_image", lambda *a: True)
        with pytest.raises(KeyboardInterrupt):
            s.snapshot()
        monkeypatch.undo()
    store = project.root / ".sandbox" / "snapshots"
    temps = [p.name for p in store.iterdir() if p.name.startswith(".tmp-")]
    assert len(temps) == 1
    half = temps[0].removeprefix(".tmp-").rpartition("-")[0]
    assert engine.image_exists(f"{REPOSITORY}:{half}")
    assert [x.id for x in orch.snapshots()] == [kept.id]
    # its maker (this process) is alive: gc leaves it; once "dead", gc removes it
    assert (
        cli("gc", "--project", str(project.root), "--json").json()["snapshot_leftovers_removed"]
        == []
    )
    owner = json.loads((store / temps[0] / "owner.json").read_text())
    owner["io.orchestrator.owner-pid"] = "999999999"
    (store / temps[0] / "owner.json").write_text(json.dumps(owner))
    os.rename(store / temps[0], store / f".tmp-{half}-999999999")
    done = cli("gc", "--project", str(project.root), "--json")
    assert done.returncode == 0, done.stderr
    assert done.json()["snapshot_leftovers_removed"] == [f".tmp-{half}-999999999"]
    assert not [p for p in store.iterdir() if p.name.startswith(".tmp-")]
    assert _image_gone(engine, f"{REPOSITORY}:{half}")
    assert [x.id for x in orch.snapshots()] == [kept.id]
    orch.remove_snapshot(kept.id)


def test_cli_pause_resume_snapshot_fork_list_rm(engine, project, isolation):
    project.worker("w", WORKER)
    where = ("--project", str(project.root))
    started = cli("session", "start", "w", *where, "--json")
    assert started.returncode == 0, started.stderr
    sid = started.json()["id"]
    made: list[str] = []
    try:
        assert cli("session", "exec", sid, *where, "--", "sh", "-c", COUNTER).returncode == 0
        paused = cli("session", "pause", sid, *where, "--json")
        assert paused.returncode == 0 and paused.json()["paused"] is True
        refused = cli("session", "exec", sid, *where, "--", "true")
        assert refused.returncode == 125
        assert len(refused.stderr.strip().splitlines()) == 1 and "resume" in refused.stderr
        assert cli("session", "resume", sid, *where).returncode == 0
        assert cli("session", "resume", sid, *where).returncode == 125  # not paused

        cli("session", "exec", sid, *where, "--", "sh", "-c", "echo cli > /session/c.txt")
        taken = cli("session", "snapshot", sid, *where, "--json")
        assert taken.returncode == 0, taken.stderr
        snap = taken.json()
        assert set(snap) >= {"snapshot", "bytes", "seconds"} and snap["bytes"] > 0

        listed = cli("snapshot", "list", *where, "--json").json()
        assert [(s["id"], s["session"], s["worker"]) for s in listed] == [
            (snap["snapshot"], sid, "w")
        ]
        assert {"id", "bytes", "created", "session", "worker"} <= set(listed[0])

        forked = cli("session", "fork", snap["snapshot"], "--count", "2", *where, "--json")
        assert forked.returncode == 0, forked.stderr
        made = forked.json()["sessions"]
        assert len(made) == 2
        for fork_id in made:
            shown = cli("session", "exec", fork_id, *where, "--", "cat", "/session/c.txt")
            assert shown.stdout == "cli\n"
        from_live = cli("session", "fork", sid, *where, "--json")
        assert from_live.returncode == 0, from_live.stderr
        made += from_live.json()["sessions"]
        assert len(cli("snapshot", "list", *where, "--json").json()) == 2

        bad = cli("session", "fork", "snap-000000000000", *where)
        assert bad.returncode == 125 and len(bad.stderr.strip().splitlines()) == 1
    finally:
        for each in [sid, *made]:
            cli("session", "stop", each, *where)
    for listed_snap in cli("snapshot", "list", *where, "--json").json():
        removed = cli("snapshot", "rm", listed_snap["id"], *where)
        assert removed.returncode == 0, removed.stderr
        assert _image_gone(engine, f"{REPOSITORY}:{listed_snap['id']}")
    assert cli("snapshot", "list", *where, "--json").json() == []
    gone = cli("snapshot", "rm", "snap-000000000000", *where)
    assert gone.returncode == 125 and "no snapshot" in gone.stderr
    assert json.loads(cli("session", "list", *where, "--json").stdout) == []


def test_owner_sigkilled_mid_snapshot_leaves_nothing(engine, project):
    """The session's owner is SIGKILLed while it writes a snapshot (100 MB in /session): no
    snapshot is listed, and gc removes the container, the temporary folder and any image."""
    import signal
    import subprocess
    import sys

    project.worker("w", WORKER)
    where = ("--project", str(project.root))
    started = cli("session", "start", "w", *where, "--json")
    assert started.returncode == 0, started.stderr
    info = started.json()
    sid, owner = info["id"], info["pid"]
    big = "head -c 100000000 /dev/urandom > /session/big"
    assert cli("session", "exec", sid, *where, "--", "sh", "-c", big).returncode == 0
    store = project.root / ".sandbox" / "snapshots"
    taking = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "session", "snapshot", sid, *where],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(
            lambda: store.is_dir() and any(p.name.startswith(".tmp-") for p in store.iterdir()),
            30.0,
        ), "the snapshot never started"
        os.kill(owner, signal.SIGKILL)
    finally:
        taking.wait(60)
    assert taking.returncode != 0
    assert cli("snapshot", "list", *where, "--json").json() == []
    done = cli("gc", "--project", str(project.root), "--json")
    assert done.returncode == 0, done.stderr
    [leftover] = done.json()["snapshot_leftovers_removed"]
    half = leftover.removeprefix(".tmp-").rpartition("-")[0]
    assert not list(store.iterdir())
    assert not engine.image_exists(f"{REPOSITORY}:{half}")
    assert not engine.images_labelled(f"io.orchestrator.snapshot-root={project.root / '.sandbox'}")
    assert cli("snapshot", "list", *where, "--json").json() == []


def test_six_sessions_snapshot_and_fork_at_once(engine, project):
    from concurrent.futures import ThreadPoolExecutor

    project.worker("w", WORKER)
    orch = Orchestrator(project.root, engine=engine)

    def one(n: int) -> str:
        with orch.open_session("w") as s:
            s.exec(f"echo {n} > /session/n; echo {n} > /tmp/n")
            snap = s.snapshot()
        [fork] = snap.fork(1)
        with fork:
            seen = fork.exec("cat /session/n /tmp/n").stdout
        orch.remove_snapshot(snap.id)
        return seen

    with ThreadPoolExecutor(6) as pool:
        seen = list(pool.map(one, range(6)))
    assert seen == [f"{n}\n{n}\n" for n in range(6)]
    assert orch.snapshots() == []


def test_idle_pause_pauses_then_saves_a_snapshot_and_closes(engine, project):
    """``idle: pause``: past its idle timeout the session is paused (not closed), and after
    ``stop_paused_after`` it is saved as a snapshot, then closed; a fork sees its state."""
    project.worker("w", WORKER + "idle: pause\nstop_paused_after: 2\n")
    orch = Orchestrator(project.root, engine=engine)
    s = orch.open_session("w", idle_timeout=1.0)
    try:
        s.exec("echo parked > /session/p.txt; echo parked > /tmp/p.txt")
        assert wait_for(lambda: s.paused, 10.0), "the idle session was not paused"
        assert not s.closed
        pause = _events(orch, "session.pause")[-1]
        assert pause.metadata["why"].startswith("idle for")
        assert wait_for(lambda: s.closed, 20.0), "the paused session was never closed"
    finally:
        s.close()
    [snap] = orch.snapshots()
    assert snap.session == s.id
    closed = [e for e in _events(orch, "session.closed") if e.session_id == s.id]
    assert snap.id in (closed[-1].reason or "")
    [fork] = snap.fork(1)
    with fork:
        assert fork.exec("cat /session/p.txt /tmp/p.txt").stdout == "parked\nparked\n"
    orch.remove_snapshot(snap.id)


def test_idle_is_stop_or_pause_in_the_worker_file(project):
    project.worker("w", WORKER + "idle: sleep\n")
    done = cli("plan", "w", "--project", str(project.root))
    assert done.returncode == 125
    assert "idle" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_live_session_forks_itself_in_python(engine, project):
    project.worker("w", WORKER)
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as s:
        s.exec("echo live > /tmp/l.txt")
        [fork] = s.fork(1)
        with fork:
            assert fork.exec("cat /tmp/l.txt").stdout == "live\n"
            assert fork.orchestrator is orch
    [snap] = orch.snapshots()
    assert snap.session == s.id
    orch.remove_snapshot(snap.id)


def test_snapshots_removed_by_age(engine, project):
    project.worker("w", WORKER)
    where = ("--project", str(project.root))
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as s:
        first, second = s.snapshot(), s.snapshot()
    kept = cli("snapshot", "rm", "--older-than", "1d", *where, "--json")
    assert kept.returncode == 0 and kept.json() == []
    time.sleep(2.1)
    both = cli("snapshot", "rm", "--older-than", "2s", *where, "--json")
    assert both.returncode == 0, both.stderr
    assert sorted(s["id"] for s in both.json()) == sorted([first.id, second.id])
    assert orch.snapshots() == []
    assert not engine.image_exists(first.tag) and not engine.image_exists(second.tag)
    whys = [e.metadata["why"] for e in _events(orch, "snapshot.removed")]
    assert whys == ["older than 2 s", "older than 2 s"]
    neither = cli("snapshot", "rm", *where)
    assert neither.returncode == 125 and "--older-than" in neither.stderr


def test_a_fork_never_gets_more_than_its_snapshot(engine, project):
    """The worker's declaration raised after the snapshot (a zone added, more memory): a
    fork is refused in one line naming what changed, and nothing is started."""
    project.zone("docs", "ro", files={"d.txt": "doc\n"})
    project.worker("w", WORKER)
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("w") as s:
        snap = s.snapshot()
    try:
        project.worker(
            "w",
            WORKER.replace("{zones: []}", "{zones: [{name: docs}]}") + "resources: {memory: 1g}\n",
        )
        with pytest.raises(SnapshotError) as refused:
            snap.fork(1)
        message = str(refused.value)
        assert "zones" in message and "limits" in message and "\n" not in message
        sessions = project.root / ".sandbox" / "sessions"
        assert not [p for p in sessions.iterdir() if p.name != s.id]
    finally:
        orch.remove_snapshot(snap.id)


def test_the_checkpoint_tool_only_where_the_worker_allows_it(engine, project):
    where = ("--project", str(project.root))
    project.worker("w", WORKER)
    project.worker("c", WORKER + "checkpoints: true\n")
    started = {name: cli("session", "start", name, *where, "--json") for name in ("w", "c")}
    ids = {name: done.json()["id"] for name, done in started.items()}
    try:
        refused = cli("session", "call", ids["w"], "checkpoint", *where)
        assert refused.returncode == 1
        assert json.loads(refused.stdout)["status"] == "blocked"
        assert "checkpoints: true" in json.loads(refused.stdout)["error"]
        taken = cli("session", "call", ids["c"], "checkpoint", *where)
        assert taken.returncode == 0, taken.stdout + taken.stderr
        snap_id = json.loads(taken.stdout)["result"]["snapshot"]
        listed = cli("snapshot", "list", *where, "--json").json()
        assert [(s["id"], s["session"]) for s in listed] == [(snap_id, ids["c"])]
    finally:
        for sid in ids.values():
            cli("session", "stop", sid, *where)
    assert cli("snapshot", "rm", snap_id, *where).returncode == 0


def test_the_branch_tool_starts_forks_of_the_agents_own_checkpoint(engine, project):
    """Through `session call ID branch`, under gVisor: the forks exist after the call (and
    after their source stopped), each sees the checkpoint's state, they are independent of
    each other and of the source; refused without `checkpoints: true` and from another
    session's checkpoint; audited."""
    require_gvisor(engine)
    project.isolation = "gvisor"
    project.write_project()
    where = ("--project", str(project.root))
    project.worker("w", WORKER)
    project.worker("c", WORKER + "checkpoints: true\n")
    started = {name: cli("session", "start", name.rstrip("2"), *where, "--json")
               for name in ("w", "c", "c2")}  # fmt: skip
    ids = {name: done.json()["id"] for name, done in started.items()}
    source = ids["c"]
    forks: list[str] = []
    snaps: list[str] = []

    def run(sid: str, script: str) -> str:
        done = cli("session", "exec", sid, *where, "--", "sh", "-c", script)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    try:
        refused = cli("session", "call", ids["w"], "branch", *where)
        assert refused.returncode == 1
        answer = json.loads(refused.stdout)
        assert answer["status"] == "blocked"
        assert "checkpoints: true" in answer["error"] and "session fork" in answer["error"]

        # another session's checkpoint (same worker, same project) is not this agent's
        others = cli("session", "call", ids["c2"], "checkpoint", *where)
        assert others.returncode == 0, others.stdout + others.stderr
        snaps.append(json.loads(others.stdout)["result"]["snapshot"])
        stolen = cli("session", "call", source, "branch",
                     json.dumps({"snapshot": snaps[0]}), *where)  # fmt: skip
        assert stolen.returncode == 1
        answer = json.loads(stolen.stdout)
        assert answer["status"] == "blocked"
        assert answer["error"].startswith(f"snapshot {snaps[0]} is not a checkpoint of session")
        assert len(cli("session", "list", *where, "--json").json()) == 3

        run(source, "echo before > /session/state; echo warm > /tmp/cache")
        taken = cli("session", "call", source, "checkpoint", *where)
        assert taken.returncode == 0, taken.stdout + taken.stderr
        snap_id = json.loads(taken.stdout)["result"]["snapshot"]
        snaps.append(snap_id)
        run(source, "echo after > /session/state; rm /tmp/cache")

        branched = cli("session", "call", source, "branch",
                       json.dumps({"count": 2, "snapshot": snap_id}), *where)  # fmt: skip
        assert branched.returncode == 0, branched.stdout + branched.stderr
        result = json.loads(branched.stdout)["result"]
        forks += result["sessions"]
        assert result["snapshot"] == snap_id
        assert len(set(forks)) == 2 and source not in forks

        now = cli("session", "call", source, "branch", *where)  # a checkpoint taken now
        assert now.returncode == 0, now.stdout + now.stderr
        latest = json.loads(now.stdout)["result"]
        forks += latest["sessions"]
        snaps.append(latest["snapshot"])
        assert latest["snapshot"] != snap_id and len(latest["sessions"]) == 1

        assert cli("session", "stop", source, *where).returncode == 0  # the forks go on
        listed = {s["id"] for s in cli("session", "list", *where, "--json").json()}
        assert set(forks) <= listed and source not in listed
        first, second, third = forks
        assert run(first, "cat /session/state /tmp/cache") == "before\nwarm\n"
        assert run(second, "cat /session/state /tmp/cache") == "before\nwarm\n"
        assert run(third, "cat /session/state; ls /tmp") == "after\n"
        run(first, "echo mine > /session/state; echo cold > /tmp/cache")
        assert run(second, "cat /session/state /tmp/cache") == "before\nwarm\n"

        audit = Orchestrator(project.root, engine=engine).audit
        events = list(audit.query(AuditFilter()))
        branches = [e for e in events if e.operation == "session.branch"]
        (refusal, branch_event, now_event) = branches
        assert (refusal.session_id, refusal.allowed) == (source, False)
        assert refusal.reason.startswith(f"snapshot {snaps[0]} is not a checkpoint")
        assert branch_event.session_id == source and branch_event.allowed
        assert branch_event.metadata["sessions"] == forks[:2]
        assert now_event.metadata["snapshot"] == latest["snapshot"]
        fork_events = {e.session_id: e for e in events if e.operation == "session.fork"}
        assert set(fork_events) == set(forks)
        assert {fork_events[f].metadata["parent"] for f in forks} == {source}
        assert {fork_events[f].metadata["snapshot"] for f in forks[:2]} == {snap_id}
    finally:
        for sid in [*forks, *ids.values()]:
            cli("session", "stop", sid, *where)
        for snap in snaps:
            cli("snapshot", "rm", snap, *where)
    assert not cli("session", "list", *where, "--json").json()


def test_exec_resume_resumes_a_paused_session_first(engine, project):
    """Refused on a paused session in one line naming `resume`, unless the caller asks
    for it (`session exec --resume`): then resumed (audited) and run."""
    where = ("--project", str(project.root))
    project.worker("w", WORKER)
    sid = cli("session", "start", "w", *where, "--json").json()["id"]
    try:
        assert cli("session", "pause", sid, *where).returncode == 0
        refused = cli("session", "exec", sid, *where, "--", "echo", "hi")
        assert refused.returncode == 125
        (line,) = refused.stderr.strip().splitlines()
        assert "is paused: resume it first" in line and f"session resume {sid}" in line
        ran = cli("session", "exec", sid, *where, "--resume", "--", "echo", "hi")
        assert (ran.returncode, ran.stdout) == (0, "hi\n"), ran.stderr
        (info,) = cli("session", "list", *where, "--json").json()
        assert info["paused"] is False
        again = cli("session", "exec", sid, *where, "--resume", "--", "echo", "on")
        assert (again.returncode, again.stdout) == (0, "on\n"), again.stderr  # not paused: runs
        audit = Orchestrator(project.root, engine=engine).audit
        resumed = [e for e in audit.query(AuditFilter()) if e.operation == "session.resume"]
        assert [e.session_id for e in resumed] == [sid]
    finally:
        cli("session", "stop", sid, *where)
