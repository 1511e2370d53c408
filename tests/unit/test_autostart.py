"""A server started on first use, through the real console entry point, without an engine
(``--version`` is the command): the first command runs here and then starts
``orchestrator serve --auto`` detached, the second goes through it; the opt-outs and the
commands and processes that never start one; the idle exit; two first commands at once
start one server; a server started on first use stops once its package files change. Each
test runs in a private XDG_RUNTIME_DIR and ends with no server of it left (killed and
named if one was)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import launcher
from orchestrator.cli import wire
from tests.conftest import alive, wait_until

ENTRY = Path(sys.executable).with_name("orchestrator")  # the console script
DEBUG = {"ORCHESTRATOR_SERVER_DEBUG": "1"}


def servers_of(runtime: Path) -> list[int]:
    """Pids of ``orchestrator serve`` processes whose socket folder is under ``runtime``."""
    found = []
    marker = f"XDG_RUNTIME_DIR={runtime}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmdline and marker in environ and alive(int(name)):
            found.append(int(name))
    return found


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A private XDG_RUNTIME_DIR; afterwards no server of it may be left (any is killed)."""
    folder = Path(tempfile.mkdtemp(prefix="orch-xdg-"))
    try:
        yield folder
    finally:
        left = servers_of(folder)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        assert not left, f"servers left behind: {left}"


def environment(runtime: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {launcher.NO_SERVER, launcher.NO_AUTOSTART}}  # fmt: skip
    env.update(XDG_RUNTIME_DIR=str(runtime), **DEBUG, **extra)
    return env


def command(runtime: Path, *args: str, prefix: tuple[str, ...] = (), **extra: str):
    return subprocess.run(
        [*prefix, str(ENTRY), *args], capture_output=True, text=True, timeout=60,
        env=environment(runtime, **extra), check=False,
    )  # fmt: skip


def started_pid(stderr: str) -> int:
    (line,) = [line for line in stderr.splitlines() if "started a server (pid " in line]
    return int(line.split("(pid ")[1].split(";")[0])


def socket_of(runtime: Path) -> Path:
    return runtime / "orchestrator" / wire.SOCKET_NAME


def stop(runtime: Path, pid: int) -> None:
    done = command(runtime, "serve", "--stop")
    assert f"stopped the server (pid {pid})" in done.stderr, done.stderr
    assert not alive(pid) and not socket_of(runtime).exists()


# -- the decision, without processes --


def test_what_starts_no_server():
    plain = {"Seccomp": "0", "NoNewPrivs": "0"}
    assert launcher.autostart_refusal(["run", "w"], {}, plain) is None
    assert launcher.autostart_refusal(["--version"], {launcher.IDLE: "90s"}, plain) is None
    off = launcher.autostart_refusal(["run", "w"], {launcher.NO_AUTOSTART: "1"}, plain)
    assert off == "ORCHESTRATOR_NO_AUTOSTART is set"
    assert launcher.autostart_refusal(["run"], {launcher.NO_AUTOSTART: "0"}, plain) is None
    assert "never starts one" in str(launcher.autostart_refusal(["mcp", "w"], {}, plain))
    for status, named in (({"NoNewPrivs": "1"}, "NoNewPrivs"), ({"Seccomp": "2"}, "Seccomp"),
                          ({"Seccomp": "unknown"}, "Seccomp")):  # fmt: skip
        assert named in str(launcher.autostart_refusal(["run"], {}, {**plain, **status}))
    bad = launcher.autostart_refusal(["run"], {launcher.IDLE: "soon"}, plain)
    assert bad == "ORCHESTRATOR_SERVER_IDLE='soon' is not a duration such as 90s, 15m or 2h"
    # serve and session serve run here before anything is decided (launcher.local)
    assert launcher.local(["serve", "--auto"]) and launcher.local(["session", "serve", "w"])


def test_idle_durations():
    assert [launcher.parse_idle(t) for t in ("90", "90s", "15m", "2h")] == [90, 90, 900, 7200]
    for bad in ("", "0", "0s", "m", "1.5m", "-1", "10d", "1 m"):
        with pytest.raises(ValueError, match="not a duration"):
            launcher.parse_idle(bad)


# -- through the console entry point --


def test_the_first_command_starts_a_server_the_second_goes_through_it(runtime):
    first = command(runtime, "--version", ORCHESTRATOR_SERVER_IDLE="60s", SECRET_TOKEN="x")
    assert first.returncode == 0 and "version" in first.stdout
    assert "not using the server" in first.stderr and "does not exist" in first.stderr
    pid = started_pid(first.stderr)
    try:
        assert wait_until(socket_of(runtime).exists)
        second = command(runtime, "--version")
        assert second.returncode == 0 and second.stdout == first.stdout
        assert f"through the server (pid {pid})" in second.stderr
        assert "started a server" not in second.stderr
        # detached: a session of its own, in /, stdio on /dev/null, no inherited secret
        assert os.getsid(pid) == pid and os.readlink(f"/proc/{pid}/cwd") == "/"
        assert {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)} == {os.devnull}
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"SECRET_TOKEN=x" not in environ and b"PATH=" + os.environ["PATH"].encode() in (
            environ
        )
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"--auto" in cmdline and b"--idle-exit=60s" in cmdline
        # it loaded its modules at the lowest priority where it may restore its own: it
        # serves at the priority of the command that started it
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        stop(runtime, pid)
    assert servers_of(runtime) == []


def test_the_opt_outs_and_the_commands_that_never_start_one(runtime):
    off = command(runtime, "--version", ORCHESTRATOR_NO_SERVER="1")
    assert off.returncode == 0 and "ORCHESTRATOR_NO_SERVER is set" in off.stderr
    assert "started" not in off.stderr and not (runtime / "orchestrator").exists()
    no_start = command(runtime, "--version", ORCHESTRATOR_NO_AUTOSTART="1")
    assert no_start.returncode == 0 and "does not exist" in no_start.stderr
    assert "not starting a server: ORCHESTRATOR_NO_AUTOSTART is set" in no_start.stderr
    for args in (["mcp", "--help"], ["serve", "--stop"]):
        assert "started a server" not in command(runtime, *args).stderr
    sandboxed = command(runtime, "--version", prefix=("setpriv", "--no-new-privs"))
    assert sandboxed.returncode == 0 and "runs with NoNewPrivs set" in sandboxed.stderr
    bad = command(runtime, "--version", ORCHESTRATOR_SERVER_IDLE="soon")
    assert bad.returncode == 0 and "is not a duration" in bad.stderr
    assert servers_of(runtime) == [] and not socket_of(runtime).exists()
    # ORCHESTRATOR_NO_AUTOSTART still uses a running server
    pid = started_pid(command(runtime, "--version").stderr)
    try:
        assert wait_until(socket_of(runtime).exists)
        used = command(runtime, "--version", ORCHESTRATOR_NO_AUTOSTART="1")
        assert f"through the server (pid {pid})" in used.stderr
    finally:
        stop(runtime, pid)


def test_a_server_started_on_first_use_exits_when_idle(runtime):
    pid = started_pid(command(runtime, "--version", ORCHESTRATOR_SERVER_IDLE="3s").stderr)
    assert wait_until(socket_of(runtime).exists)
    assert "through the server" in command(runtime, "--version").stderr  # restarts the clock
    started = time.monotonic()
    assert wait_until(lambda: not alive(pid), 30)
    assert time.monotonic() - started >= 2  # not before its idle time
    assert not socket_of(runtime).exists()
    again = command(runtime, "--version", ORCHESTRATOR_SERVER_IDLE="3s")
    assert "does not exist" in again.stderr  # the next command starts a new one
    assert wait_until(lambda: not alive(started_pid(again.stderr)), 30)


def test_two_first_commands_at_once_start_one_server(runtime):
    env = environment(runtime, ORCHESTRATOR_SERVER_IDLE="60s")
    clients = [subprocess.Popen([str(ENTRY), "--version"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]  # fmt: skip
    said = [client.communicate(timeout=60)[1] for client in clients]
    starts = [text for text in said if "started a server" in text]
    assert len(starts) == 1, said
    pid = started_pid(starts[0])
    assert all("another one is starting or running" in text for text in said if text not in starts)
    try:
        assert wait_until(socket_of(runtime).exists)
        assert servers_of(runtime) == [pid]
    finally:
        stop(runtime, pid)


def test_two_servers_started_at_once_without_a_handed_lock_leave_one(runtime):
    env = {k: v for k, v in environment(runtime).items() if k not in DEBUG}
    servers = [subprocess.Popen([str(ENTRY), "serve", "--auto", "--idle-exit=60s"], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]  # fmt: skip
    try:
        assert wait_until(lambda: any(s.poll() is not None for s in servers), 60)
        (loser,) = [s for s in servers if s.poll() is not None]
        (winner,) = [s for s in servers if s is not loser]
        assert loser.communicate() == ("", None) and loser.returncode == 0  # quietly
        assert wait_until(socket_of(runtime).exists)
        assert f"through the server (pid {winner.pid})" in command(runtime, "--version").stderr
        stop(runtime, winner.pid)
    finally:
        for server in servers:
            if server.stdout is not None and not server.stdout.closed:
                server.kill()
                server.communicate()


OUTDATING_SERVER = """
import os, sys
from orchestrator.cli import server, wire
server.OUTDATED_CHECK_S = 0.2
real = wire.fingerprint
wire.fingerprint = lambda: real() + ("-changed" if os.path.exists(sys.argv[1]) else "")
from orchestrator.cli.main import main
main(["serve", "--auto"])
"""


def test_a_server_started_on_first_use_exits_once_its_package_files_change(runtime, tmp_path):
    upgraded = tmp_path / "upgraded"
    process = subprocess.Popen([sys.executable, "-c", OUTDATING_SERVER, str(upgraded)],
                               env=environment(runtime), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert wait_until(socket_of(runtime).exists)
        time.sleep(0.5)
        assert process.poll() is None
        upgraded.touch()
        assert process.wait(timeout=10) == 0
        assert not socket_of(runtime).exists()
    finally:
        process.kill()
        process.wait()


#: Runs its command line with a new terminal as stdin, in the foreground of that terminal's
#: session or (argument ``background``) as a background job of it.
ON_A_TERMINAL = r"""
import fcntl, os, pty, sys, termios
master, slave = pty.openpty()
os.setsid()
fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "background":
        os.setpgid(0, 0)
    os.dup2(slave, 0)
    os.execv(sys.argv[2], sys.argv[2:])
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_background_job_keeps_its_terminal_and_runs_here(runtime):
    """A background job reading its terminal is stopped (SIGTTIN) when it runs here; a
    command forked by the server would read it: so it is not handed over."""
    pid = started_pid(command(runtime, "--version").stderr)
    try:
        assert wait_until(socket_of(runtime).exists)
        for where in ("foreground", "background"):
            done = command(runtime, "--version", prefix=(sys.executable, "-c", ON_A_TERMINAL,
                                                         where))  # fmt: skip
            assert done.returncode == 0 and "version" in done.stdout
            through = f"through the server (pid {pid})" in done.stderr
            assert through == (where == "foreground"), done.stderr
        assert "is not in the foreground of" in done.stderr and "started" not in done.stderr
    finally:
        stop(runtime, pid)


FAILING_SERVER = """
from orchestrator.cli import server
server.PRELOAD = ("orchestrator.no_such_module",)
from orchestrator.cli.main import main
main(["serve", "--auto"])
"""


def test_a_failed_start_is_recorded_and_not_retried_at_once(runtime):
    env = {k: v for k, v in environment(runtime).items() if k not in DEBUG}
    failed = subprocess.run([sys.executable, "-c", FAILING_SERVER], env=env, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert failed.returncode != 0 and not socket_of(runtime).exists()
    record = runtime / "orchestrator" / wire.FAILED_NAME
    assert "no_such_module" in record.read_text()
    assert os.lstat(record).st_mode & 0o777 == 0o600
    held_off = command(runtime, "--version")
    assert held_off.returncode == 0 and "the last one failed" in held_off.stderr
    assert "started a server" not in held_off.stderr and servers_of(runtime) == []
    past = time.time() - launcher.RETRY_AFTER_S - 1
    os.utime(record, (past, past))  # long ago: tried again, and a served start clears it
    pid = started_pid(command(runtime, "--version").stderr)
    try:
        assert wait_until(socket_of(runtime).exists) and not record.exists()
    finally:
        stop(runtime, pid)


def test_the_started_server_keeps_no_pipe_of_its_starter_open(runtime):
    """A reader of a pipe the first command inherited (``3>&1`` in a shell, a harness's
    extra descriptor) sees its end when the command ends, not when the server does."""
    import select

    read_end, write_end = os.pipe()
    try:
        first = subprocess.run(
            [str(ENTRY), "--version"], pass_fds=(write_end,), capture_output=True, text=True,
            timeout=60, env=environment(runtime), check=False,
        )  # fmt: skip
        os.close(write_end)
        write_end = -1
        pid = started_pid(first.stderr)
        try:
            assert select.select([read_end], [], [], 20)[0] and os.read(read_end, 1) == b""
            assert wait_until(socket_of(runtime).exists)
        finally:
            stop(runtime, pid)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
