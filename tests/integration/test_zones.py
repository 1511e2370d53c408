"""Zones, trust levels, sessions, the broker and restriction, tried in real containers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project, load_worker
from orchestrator.errors import OrchestratorError
from orchestrator.policy import ZoneView
from orchestrator.prepare import prepare
from orchestrator.runtime import execute
from orchestrator.runtime.container import ContainerBackend
from tests.integration.conftest import cli, containers_of

pytestmark = pytest.mark.docker


def script_worker(project, name: str, script: str, front: str = "") -> None:
    command = json.dumps(["python3", "-c", textwrap.dedent(script)])
    project.worker(name, f"command: {command}\n{textwrap.dedent(front).strip()}")


def run(engine, project, name: str, staging=None, **kwargs):
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, name), **kwargs)
    audit = AuditLog(loaded.sandbox_root / "audit.jsonl")
    result = execute(ContainerBackend(engine), prepared, audit=audit, staging=staging)
    return result, prepared, audit


class TarContents:
    """A test staging sink: the outbox as {name: content} of its regular files."""

    def outbox(self, spec, stream) -> dict[str, bytes]:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            return {
                m.name.removeprefix("./"): archive.extractfile(m).read()
                for m in archive
                if m.isfile()
            }

    def zones(self, prepared):
        return []


LIST = """
import os
for path in ("/session", "/workspace", "/repo", "/staged", "/workers"):
    print(path, sorted(os.listdir(path)) if os.path.isdir(path) else "ABSENT")
"""


def test_untrusted_sees_only_its_session_workers_and_a_fresh_outbox(engine, project):
    script_worker(
        project,
        "w",
        LIST + "open('/staged/out-' + os.environ['ORCHESTRATOR_RUN_ID'], 'w').write('x')",
        "sandbox: {}\ntrust: untrusted",
    )
    first, _, _ = run(engine, project, "w", staging=TarContents())
    second, _, _ = run(engine, project, "w", staging=TarContents())
    assert first.exit_code == 0, first.stderr
    assert "/workspace ABSENT" in second.stdout
    assert "/repo ABSENT" in second.stdout
    assert "/staged []" in second.stdout  # the first run's outbox is not visible
    assert "/workers ['w.worker']" in second.stdout
    # ...but it was read out after the run: each run's outbox holds its own file only
    assert first.outbox == {f"out-{first.run_id}": b"x"}
    assert second.outbox == {f"out-{second.run_id}": b"x"}


def test_sessions_never_see_each_other(engine, project):
    script_worker(
        project,
        "w",
        """
        import os, sys
        print(sorted(os.listdir("/session")))
        open("/session/mine-" + os.environ["ORCHESTRATOR_SESSION"], "w").write("secret")
        """,
        "sandbox: {}\ntrust: session",
    )
    a1, _, _ = run(engine, project, "w", session_id="alpha")
    b1, _, _ = run(engine, project, "w", session_id="beta")
    a2, _, _ = run(engine, project, "w", session_id="alpha")
    assert a1.stdout.strip() == "[]"
    assert b1.stdout.strip() == "[]"  # beta does not see alpha's file
    assert a2.stdout.strip() == "['mine-alpha']"  # alpha resumes its own


def test_workspaces_are_separate_and_persistent(engine, project):
    script_worker(
        project,
        "w",
        "import os; print(sorted(os.listdir('/workspace'))); open('/workspace/f', 'a').write('x')",
        "sandbox: {}\ntrust: session",
    )
    assert run(engine, project, "w", workspace="one")[0].stdout.strip() == "[]"
    assert run(engine, project, "w", workspace="two")[0].stdout.strip() == "[]"
    assert run(engine, project, "w", workspace="one")[0].stdout.strip() == "['f']"


def git_init(path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True)


@pytest.mark.parametrize("trust", ["workspace", "full"])
def test_repo_never_exposes_the_sandbox_and_git_stays_read_only(engine, project, trust):
    git_init(project.root)
    (project.root / "README").write_text("hello")
    script_worker(
        project,
        "w",
        """
        import os, errno
        print("readme", open("/repo/README").read())
        try:
            print("sandbox", sorted(os.listdir("/repo/.sandbox")))
        except PermissionError:
            print("sandbox []")  # the mask copies the folder's 0700: unreadable, and empty
        for path in ("/repo/.git/hooks/post-checkout", "/repo/.git/config", "/repo/new.txt",
                     "/repo/.sandbox/audit.jsonl"):
            try:
                open(path, "a").write("#!/bin/sh\\necho pwned\\n")
                print("WROTE", path)
            except OSError as e:
                print("refused", path, errno.errorcode[e.errno])
        """,
        f"sandbox: {{}}\ntrust: {trust}",
    )
    result, _, _ = run(engine, project, "w")
    out = result.stdout
    assert "readme hello" in out, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "sandbox []" in out  # the audit log, sessions and runs are not visible
    assert "refused /repo/.git/hooks/post-checkout EROFS" in out
    assert "refused /repo/.git/config" in out  # EROFS, or EACCES first when root owns it
    assert "refused /repo/.sandbox/audit.jsonl" in out
    assert not (project.root / ".git" / "hooks" / "post-checkout").exists()
    if trust == "full":
        assert "WROTE /repo/new.txt" in out
    else:
        assert "refused /repo/new.txt EROFS" in out


def test_full_trust_refuses_a_repo_without_git(project):
    project.worker("w", 'command: ["true"]\nsandbox: {}\ntrust: full')
    loaded = load_project(project.root)
    with pytest.raises(OrchestratorError, match="has no .git"):
        prepare(loaded, load_worker(loaded, "w"))


def test_planted_symlink_gives_no_access_to_the_host(engine, project, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET")
    script_worker(
        project,
        "w",
        f"""
        import os
        if not os.path.lexists("/session/link"):
            os.symlink("{secret}", "/session/link")
            os.symlink("/", "/session/root")
        for name in ("/session/link", "/session/root/{secret.relative_to("/")}"):
            try:
                print("READ", open(name).read())
            except OSError as e:
                print("no", e.strerror)
        """,
        "sandbox: {}\ntrust: session",
    )
    first, prepared, _ = run(engine, project, "w", session_id="s1")
    second, _, _ = run(engine, project, "w", session_id="s1")
    for result in (first, second):
        assert "HOST-SECRET" not in result.stdout
        assert "READ" not in result.stdout
    # Host-side tools asking about the same virtual paths are refused too.
    view = ZoneView(prepared.grant)
    assert not view.can_read("/session/link")
    assert not view.can_read(f"/session/root/{secret.relative_to('/')}")
    with pytest.raises(OrchestratorError, match="symlink"):
        view.check_read("/session/link")


def test_restricting_a_child_to_a_planted_symlink_is_refused(engine, project, tmp_path):
    data = project.zone("data", "rw")
    (data / "sub").symlink_to(tmp_path)
    project.worker(
        "main",
        'command: ["true"]\ntrust: session\nchildren: [leaf]\nsandbox: {zones: [{name: data, mode: rw}]}',
    )
    script_worker(
        project,
        "leaf",
        "print('ran')",
        "trust: session\nsandbox: {zones: [{name: data, restrict: sub}]}",
    )
    loaded = load_project(project.root)
    from orchestrator.policy import RunPaths, restrict
    from orchestrator.prepare import compile_prepared
    from orchestrator.runtime.host_folders import make_host_folders

    parent = prepare(loaded, load_worker(loaded, "main"))
    paths = RunPaths.of(loaded, session_id=parent.session_id, workspace="default", run_id="c1")
    grant = restrict(parent.grant, "main", loaded, load_worker(loaded, "leaf"), paths)
    child = compile_prepared(
        loaded, load_worker(loaded, "leaf"), grant, paths, run_id="c1", session_id=parent.session_id
    )
    with pytest.raises(OrchestratorError, match=r"/data/sub is a symbolic link \(to "):
        make_host_folders(child)


def chain_project(project):
    data = project.zone(
        "data", "rw", files={"top.txt": "top", "sub/mid.txt": "mid", "sub/deep/leaf.txt": "leaf"}
    )
    assert data.exists()
    report = """
    import os, errno, json, subprocess, sys
    me = os.environ["ORCHESTRATOR_WORKER"]
    mounts = [l.split()[1:4:2] for l in open("/proc/self/mounts") if l.split()[1].startswith("/data")]
    print(me, "sees", json.dumps(sorted(os.path.relpath(os.path.join(d, f), "/data") for d, _, fs in os.walk("/data") for f in fs)))
    try:
        open("/data/sub/deep/" + me, "w").write("x"); print(me, "wrote")
    except OSError as e:
        print(me, "write", errno.errorcode[e.errno])
    """
    script_worker(
        project,
        "top",
        report + "sys.exit(subprocess.run(['orchestrator-call', 'middle']).returncode)",
        "trust: session\nchildren: [middle]\nsandbox: {zones: [{name: data, mode: rw}]}",
    )
    script_worker(
        project,
        "middle",
        report
        + "sys.exit(subprocess.run(['orchestrator-call', 'leaf', '--attach', '/data/sub/deep/leaf.txt']).returncode)",
        "trust: session\nchildren: [leaf]\nsandbox: {zones: [{name: data, mode: rw, restrict: sub}]}",
    )
    script_worker(
        project,
        "leaf",
        report + "print('attachments', os.environ['ORCHESTRATOR_ATTACHMENTS'])",
        "trust: untrusted\nsandbox: {readonly: true, zones: [{name: data, restrict: sub/deep}]}",
    )
    return data


def test_three_level_call_chain_narrows(engine, project):
    data = chain_project(project)
    result, prepared, audit = run(engine, project, "top")
    out = result.stdout
    assert result.exit_code == 0, result.stderr
    assert 'top sees ["sub/deep/leaf.txt", "sub/mid.txt", "top.txt"]' in out
    # each writes its marker before calling the next, so the narrower views include those
    assert 'middle sees ["sub/deep/leaf.txt", "sub/deep/top", "sub/mid.txt"]' in out
    assert 'leaf sees ["sub/deep/leaf.txt", "sub/deep/middle", "sub/deep/top"]' in out
    assert "top wrote" in out and "middle wrote" in out
    # The untrusted leaf runs under gVisor, which checks permissions before the read-only
    # mount: EACCES when its uid may not write there anyway (a root-owned project).
    assert "leaf write EROFS" in out or "leaf write EACCES" in out, out
    assert 'attachments ["/data/sub/deep/leaf.txt"]' in out
    assert sorted(p.name for p in (data / "sub" / "deep").iterdir()) == [
        "leaf.txt",
        "middle",
        "top",
    ]
    calls = audit.query(AuditFilter(operation="broker.call"))
    assert [e.metadata["child"] for e in calls if e.session_id == prepared.session_id] == [
        "middle",
        "leaf",
    ]


def test_child_asking_more_than_its_parent_is_refused_before_any_container(engine, project):
    project.zone("data", "rw", files={"a.txt": "x"})
    script_worker(
        project,
        "main",
        """
        import subprocess, sys
        for child in ("greedy", "stranger", "leaf"):
            r = subprocess.run(["orchestrator-call", child], capture_output=True, text=True)
            print(child, r.returncode, r.stderr.strip())
        r = subprocess.run(["orchestrator-call", "leaf", "--attach", "/etc/passwd"], capture_output=True, text=True)
        print("attach", r.returncode, r.stderr.strip())
        """,
        "trust: session\nchildren: [greedy, leaf]\nsandbox: {zones: [{name: data, mode: ro}]}",
    )
    project.worker(
        "greedy", 'command: ["true"]\ntrust: session\nsandbox: {zones: [{name: data, mode: rw}]}'
    )
    project.worker("stranger", 'command: ["true"]')
    script_worker(project, "leaf", "print('leaf ran')", "sandbox: {zones: [{name: data}]}")
    result, prepared, audit = run(engine, project, "main")
    out = result.stdout
    assert result.exit_code == 0, result.stderr
    assert (
        "greedy 125 orchestrator-call: refused: child 'greedy' asks rw on 'data' but parent 'main' has ro"
        in out
    )
    assert "stranger 125 orchestrator-call: refused: parent 'main' may not call 'stranger'" in out
    assert "leaf 0" in out
    assert "attach 125" in out and "Cannot read '/etc/passwd'" in out
    refusals = audit.query(AuditFilter(operation="broker.refused", denied_only=True))
    assert {e.metadata["child"] for e in refusals if e.run_id == prepared.spec.run_id} == {
        "greedy",
        "stranger",
        "leaf",
    }
    started = [
        e.worker
        for e in audit.query(AuditFilter(operation="run.started", session=prepared.session_id))
    ]
    assert sorted(started) == ["leaf", "main"]  # no container for the refused children


@pytest.mark.serial
def test_resume_after_killing_a_run_finds_the_session_files(engine, project):
    script_worker(
        project,
        "w",
        """
        import os, time
        path = "/session/progress.txt"
        if os.path.exists(path):
            print("resumed:", open(path).read()); raise SystemExit(0)
        open(path, "w").write("step 1 done"); print("working", flush=True); time.sleep(120)
        """,
        "sandbox: {}\ntrust: session",
    )
    args = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "w",
        "--project",
        str(project.root),
        "--session",
        "job-7",
    ]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "working\n"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
        process.communicate()
    assert cli("gc").returncode == 0
    assert containers_of(engine, process.pid) == []
    result = cli("run", "w", "--project", str(project.root), "--session", "job-7")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "resumed: step 1 done"


def test_cli_trust_can_only_be_lowered_unless_promoted(engine, project):
    script_worker(
        project,
        "w",
        "import os; print(os.environ['ORCHESTRATOR_TRUST'])",
        "sandbox: {}\ntrust: session",
    )
    lowered = cli("run", "w", "--project", str(project.root), "--trust", "untrusted")
    assert lowered.stdout.strip() == "untrusted"
    assert "trust untrusted" in lowered.stderr  # printed at the start of every run
    raised = cli("run", "w", "--project", str(project.root), "--trust", "workspace")
    assert raised.returncode == 125
    assert "pass --promote" in raised.stderr
    subprocess.run(["git", "init", "-q", str(project.root)], check=True)
    promoted = cli("run", "w", "--project", str(project.root), "--trust", "workspace", "--promote")
    assert promoted.stdout.strip() == "workspace"
    log = AuditLog(load_project(project.root).sandbox_root / "audit.jsonl")
    denied = log.query(AuditFilter(operation="policy.denied", denied_only=True))
    assert any("--promote" in (e.reason or "") for e in denied)
    assert {e.trust_level for e in log.query(AuditFilter(operation="run.started"))} == {
        "untrusted",
        "workspace",
    }


def test_interrupting_a_parent_also_removes_its_running_child(engine, project):
    script_worker(
        project,
        "main",
        "import subprocess; print('calling', flush=True); subprocess.run(['orchestrator-call', 'kid'])",
        "trust: session\nchildren: [kid]\nsandbox: {}",
    )
    script_worker(project, "kid", "import time; time.sleep(120)", "sandbox: {}")
    args = [sys.executable, "-m", "orchestrator", "run", "main", "--project", str(project.root)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "calling\n"
        deadline = time.monotonic() + 30
        while len(containers_of(engine, process.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(containers_of(engine, process.pid)) == 2  # parent and child
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
        assert time.monotonic() - started < 30
    finally:
        process.kill()
        process.communicate()
    assert containers_of(engine, process.pid) == []
