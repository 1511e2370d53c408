"""``orchestrator session`` through the real command line: a detached owner process keeps a
live sandbox across commands (start, exec, cp, list, stop), and its container goes away on
stop, on its idle timeout, on SIGTERM of the owner, and by ``gc`` after a SIGKILL."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from orchestrator import labels
from tests.integration.conftest import alive, cli, wait_until

pytestmark = pytest.mark.docker


def session_containers(engine, session_id: str) -> list:
    return [
        o
        for o in engine.list_managed()
        if o.kind == "container" and o.labels.get(labels.SESSION) == session_id
    ]


@pytest.fixture
def sessions(engine, project):
    """Start sessions through the command line; whatever a test leaves is stopped here."""
    project.zone("input", "ro", files={"notes.txt": "alpha\nbeta\n"})
    project.zone("data", "rw", files={"kept.txt": "original"})
    project.worker("w", "trust: session\nsandbox: {zones: [{name: input}, {name: data, mode: rw}]}")
    started: list[dict] = []

    def start(*extra: str) -> dict:
        done = cli("session", "start", "w", "--project", str(project.root), "--json", *extra)
        assert done.returncode == 0, done.stderr
        info = done.json()
        started.append(info)
        return info

    yield start
    for info in started:
        if alive(info["pid"]):
            os.kill(info["pid"], signal.SIGTERM)
            if not wait_until(lambda i=info: not alive(i["pid"]), 30):
                os.kill(info["pid"], signal.SIGKILL)
        for obj in session_containers(engine, info["id"]):
            engine.remove_object(obj)


def test_start_exec_cp_list_stop(sessions, project, engine, tmp_path):
    info = sessions()
    sid, root = info["id"], str(project.root)
    assert info["worker"] == "w" and info["trust"] == "session"
    assert {"path": "/input", "mode": "ro"} in info["zones"]
    control = project.root / ".sandbox" / "control"
    assert stat.S_IMODE(os.lstat(control).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(control / f"{sid}.sock").st_mode) == 0o600
    assert len(session_containers(engine, sid)) == 1

    # exec: the command's own exit code, stdout and stderr apart; state survives commands
    done = cli("session", "exec", sid, "--project", root, "--",
               "sh", "-c", "echo out; echo err >&2; echo kept > /tmp/state; exit 3")  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    done = cli("session", "exec", sid, "--project", root, "--json", "--", "cat", "/tmp/state")
    assert done.returncode == 0
    assert done.json()["stdout"] == "kept\n" and done.json()["timed_out"] is False
    done = cli("session", "exec", sid, "--project", root, "--timeout", "1", "--", "sleep", "30")
    assert done.returncode == 124

    # cp in and out, through the same checks as the Python API
    local = tmp_path / "local.bin"
    local.write_bytes(bytes(range(256)) * 10)
    done = cli("session", "cp", str(local), f"{sid}:/data/sub/copy.bin", "--project", root)
    assert done.returncode == 0, done.stderr
    assert (project.root / "data" / "sub" / "copy.bin").read_bytes() == local.read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    done = cli("session", "cp", f"{sid}:/input/notes.txt", str(out), "--project", root)
    assert done.returncode == 0, done.stderr
    assert (out / "notes.txt").read_text() == "alpha\nbeta\n"
    done = cli(
        "session", "cp", f"{sid}:/data/sub/copy.bin", str(out / "back.bin"), "--project", root
    )
    assert done.returncode == 0, done.stderr
    assert (out / "back.bin").read_bytes() == local.read_bytes()
    cli("session", "exec", sid, "--project", root, "--", "ln", "-s", "/etc/passwd", "/data/evil")
    done = cli("session", "cp", f"{sid}:/data/evil", str(out / "evil"), "--project", root)
    assert done.returncode == 125 and "Cannot read '/data/evil'" in done.stderr
    assert not (out / "evil").exists()
    (out / "link").symlink_to(tmp_path / "victim")
    done = cli("session", "cp", f"{sid}:/input/notes.txt", str(out / "link"), "--project", root)
    assert done.returncode == 125 and "symbolic link" in done.stderr
    assert not (tmp_path / "victim").exists()

    # a write to a read-only zone is refused with the guiding message
    done = cli("session", "cp", str(local), f"{sid}:/input/x.bin", "--project", root)
    assert done.returncode == 125
    assert "Cannot write '/input/x.bin': /input is read-only. Writable:" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

    done = cli("session", "list", "--project", root, "--json")
    assert [s["id"] for s in done.json()] == [sid]
    assert done.json()[0]["worker"] == "w"

    # stop: the outbox becomes a change set, listed by staged list; the owner exits
    cli("session", "exec", sid, "--project", root, "--", "sh", "-c", "echo r > /staged/r.txt")
    done = cli("session", "stop", sid, "--project", root)
    assert done.returncode == 0, done.stderr
    change = done.stderr.split("staged change set ")[1].split()[0]
    listed = cli("staged", "list", "--project", root, "--json")
    assert change in listed.stdout
    assert wait_until(lambda: not alive(info["pid"]), 30)
    assert session_containers(engine, sid) == []
    assert not (control / f"{sid}.sock").exists()

    done = cli("session", "exec", sid, "--project", root, "--", "true")
    assert done.returncode == 125
    assert f"no live session '{sid}'" in done.stderr and "orchestrator session list" in done.stderr


def test_failed_start_leaves_nothing(sessions, project, engine):
    done = cli("session", "start", "nosuch", "--project", str(project.root))
    assert done.returncode == 125
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    control = project.root / ".sandbox" / "control"
    assert list(control.iterdir()) == []


def test_idle_timeout_ends_the_owner(sessions, project, engine):
    info = sessions("--idle-timeout", "2s")
    assert wait_until(lambda: not alive(info["pid"]), 60)
    assert session_containers(engine, info["id"]) == []
    done = cli("session", "list", "--project", str(project.root), "--json")
    assert done.json() == []


def test_sigterm_of_the_owner_removes_the_container(sessions, engine):
    info = sessions()
    os.kill(info["pid"], signal.SIGTERM)
    assert wait_until(lambda: not alive(info["pid"]), 60)
    assert session_containers(engine, info["id"]) == []


@pytest.mark.serial
def test_sigkill_of_the_owner_then_gc(sessions, project, engine):
    info = sessions()
    os.kill(info["pid"], signal.SIGKILL)
    # dead, if perhaps still a zombie its new parent has not reaped: gone for gc too
    assert wait_until(lambda: not alive(info["pid"]), 30)
    assert len(session_containers(engine, info["id"])) == 1
    # the dead owner's socket is stale: list removes it
    done = cli("session", "list", "--project", str(project.root), "--json")
    assert done.json() == []
    assert not (project.root / ".sandbox" / "control" / f"{info['id']}.sock").exists()
    done = cli("gc")
    assert done.returncode == 0, done.stderr
    assert session_containers(engine, info["id"]) == []


def test_exec_forwards_stdin_and_env(sessions, project):
    info = sessions()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "session", "exec", info["id"], "--project",
         str(project.root), "--env", "GREETING=hi", "--", "sh", "-c", 'echo "$GREETING"; cat'],
        input=b"from stdin\n", capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"hi\nfrom stdin\n"


def test_cp_never_follows_a_link_the_worker_planted_above_the_host_path(
    sessions, project, tmp_path
):
    info = sessions()
    sid, root = info["id"], str(project.root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("HOST-SECRET")
    done = cli("session", "exec", sid, "--project", root, "--",
               "sh", "-c", f"ln -s {outside} /data/reports; ln -s {outside}/secret.txt /data/s")  # fmt: skip
    assert done.returncode == 0, done.stderr

    # out to the host: a link in a folder above the destination is refused, nothing written
    planted = project.root / "data" / "reports"
    for destination in (planted / "keep.txt", planted):
        done = cli("session", "cp", f"{sid}:/input/notes.txt", str(destination), "--project", root)
        assert done.returncode == 125, done.stderr
        assert f"cannot write {destination}: " in done.stderr and "symbolic link" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert sorted(os.listdir(outside)) == ["secret.txt"]

    # in from the host: the worker's link never carries a host file into the sandbox
    for source in (planted / "secret.txt", project.root / "data" / "s"):
        done = cli("session", "cp", str(source), f"{sid}:/data/got.txt", "--project", root)
        assert done.returncode == 125, done.stderr
        assert "symbolic link" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (project.root / "data" / "got.txt").exists()
    # nor does it as a run's input
    done = cli("run", "w", "--project", root, "--input", str(planted / "secret.txt"))
    assert done.returncode == 125, done.stderr
    assert f"{planted} is a symbolic link in a folder a worker can write" in done.stderr

    # the host's own links, outside the project and its zones, are still followed
    (tmp_path / "alias").symlink_to(outside)
    done = cli("session", "cp", f"{sid}:/input/notes.txt", str(tmp_path / "alias" / "n.txt"),
               "--project", root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (outside / "n.txt").read_text() == "alpha\nbeta\n"
    done = cli("session", "cp", str(tmp_path / "alias" / "secret.txt"), f"{sid}:/data/mine.txt",
               "--project", root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (project.root / "data" / "mine.txt").read_text() == "HOST-SECRET"


def test_out_of_range_timeouts_and_durations_are_one_line_errors(sessions, project):
    info = sessions()
    sid, root = info["id"], str(project.root)
    for timeout in ("1e308", "nan", "inf", "604801"):
        done = cli("session", "exec", sid, "--project", root, "--timeout", timeout, "--",
                   "echo", "hi")  # fmt: skip
        assert done.returncode == 125, done.stderr
        assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr
        assert "Invalid value for '--timeout'" in done.stderr and "0<x<=604800" in done.stderr
    done = cli("session", "start", "w", "--project", root, "--idle-timeout", "99999999999999d")
    assert done.returncode == 125 and "Traceback" not in done.stderr, done.stderr
    assert "'--idle-timeout': '99999999999999d': 8.64e+18 is not in the range" in done.stderr
