"""``orchestrator serve`` through the real entry point (``python -m orchestrator``): a command
run through the fork server behaves as it does alone (output, exit codes, stdin, the
one-line error), and nothing outlives its caller: SIGINT removes the container, and a
SIGKILLed client gets its command terminated and its container removed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator import labels
from tests.integration.conftest import alive, cli, unavailable, wait_until

pytestmark = pytest.mark.docker

DEBUG = {"ORCHESTRATOR_SERVER_DEBUG": "1"}
LOCAL = {"ORCHESTRATOR_NO_SERVER": "1"}


def start_server(runtime: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    """`orchestrator serve` in ``runtime`` (as XDG_RUNTIME_DIR); the environment to reach it."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("ORCHESTRATOR_NO_SERVER", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "serve"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if not wait_until((runtime / "orchestrator" / "server.sock").exists, 30):
        process.kill()
        unavailable(f"the server did not start: {process.communicate()[1]}")
    return process, env


@pytest.fixture(scope="module")
def server(engine):
    """A server in a private XDG_RUNTIME_DIR of its own (short: a socket path has a limit);
    ``os.environ`` points there for the module's commands. Stopped, and checked gone, after."""
    runtime = Path(tempfile.mkdtemp(prefix="orch-xdg-"))
    process, env = start_server(runtime)
    socket_path = runtime / "orchestrator" / "server.sock"
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "ORCHESTRATOR_NO_SERVER")}
    try:
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        os.environ.pop("ORCHESTRATOR_NO_SERVER", None)
        yield process
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "serve", "--stop"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        try:
            assert process.wait(timeout=30) == 0, done.stderr
        finally:
            process.kill()
            process.communicate()
            shutil.rmtree(runtime, ignore_errors=True)
    assert not socket_path.exists()


@pytest.fixture
def runc_project(project):
    project.isolation = "runc"  # the fast runtime: these tests are about the server
    project.write_project()
    return project


def python_worker(project, name: str, script: str) -> None:
    project.worker(name, f"command: {json.dumps(['python3', '-c', script])}")


def run_ids(engine) -> set[str]:
    return {o.labels.get(labels.RUN_ID, "") for o in engine.list_managed() if o.kind == "container"}


def test_a_run_through_the_server_is_a_local_run(server, runc_project):
    python_worker(runc_project, "w", "import sys; print('out'); print('err', file=sys.stderr); "
                  "sys.exit(3)")  # fmt: skip
    root = str(runc_project.root)
    served = cli("run", "w", "--project", root, env=DEBUG)
    alone = cli("run", "w", "--project", root, env=LOCAL)
    assert f"through the server (pid {server.pid})" in served.stderr
    assert (served.returncode, served.stdout) == (alone.returncode, alone.stdout) == (3, "out\n")
    assert "err" in served.stderr and "exited with code 3" in served.stderr
    as_json = cli("run", "w", "--project", root, "--json").json()
    assert (as_json["exit_code"], as_json["container_removed"]) == (3, True)


def test_a_bad_worker_file_is_125_with_the_same_line(server, runc_project):
    runc_project.worker("bad", "command: [true]\nnetwork: sideways")
    root = str(runc_project.root)
    served = cli("run", "bad", "--project", root, env=DEBUG)
    alone = cli("run", "bad", "--project", root, env=LOCAL)
    assert served.returncode == alone.returncode == 125
    through = f"orchestrator: through the server (pid {server.pid})\n"
    assert served.stderr.startswith(through)
    assert served.stderr.removeprefix(through) == alone.stderr
    assert "bad.worker" in alone.stderr and "Traceback" not in alone.stderr


def test_stdin_reaches_the_command(server, engine, runc_project):
    runc_project.worker("s", "trust: session")
    root = str(runc_project.root)
    started = cli("session", "start", "s", "--project", root, "--json")
    assert started.returncode == 0, started.stderr
    info = started.json()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "session", "exec", info["id"], "--project",
             root, "--", "cat"],
            input=b"from stdin\n", capture_output=True, timeout=60, check=False,
            env={**os.environ, **DEBUG},
        )  # fmt: skip
        assert b"through the server" in done.stderr
        assert (done.returncode, done.stdout) == (0, b"from stdin\n"), done.stderr
    finally:
        assert cli("session", "stop", info["id"], "--project", root).returncode == 0
        for obj in engine.list_managed():
            if obj.labels.get(labels.SESSION) == info["id"] and obj.kind == "container":
                engine.remove_object(obj)


def start_long_run(project, env=None) -> tuple[subprocess.Popen, str]:
    """A run of a sleeping worker through the server, and its run id once it has started."""
    python_worker(project, "w", "import time; print('started', flush=True); time.sleep(120)")
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "w", "--project", str(project.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**(env or os.environ), **DEBUG},
        text=True,
    )
    assert process.stderr is not None and process.stdout is not None
    assert "through the server" in process.stderr.readline()
    line = process.stderr.readline()  # "orchestrator: run ID: worker w, ..."
    assert line.startswith("orchestrator: run "), line
    assert process.stdout.readline() == "started\n"
    return process, line.split()[2].rstrip(":")


def test_sigint_to_the_client_removes_the_container(server, engine, runc_project):
    process, run_id = start_long_run(runc_project)
    try:
        assert run_id in run_ids(engine)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
        assert "interrupted; container removed" in process.communicate()[1]
    finally:
        process.kill()
        process.communicate()
    assert run_id not in run_ids(engine)


def test_a_sigkilled_client_takes_its_command_and_container_along(server, engine, runc_project):
    process, run_id = start_long_run(runc_project)
    try:
        (container,) = [o for o in engine.list_managed() if o.labels.get(labels.RUN_ID) == run_id]
        owner = int(container.labels[labels.OWNER_PID])
        assert owner not in {process.pid, server.pid} and alive(owner)
        process.kill()
        process.wait(timeout=10)
        assert wait_until(lambda: not alive(owner) and run_id not in run_ids(engine), 30)
        assert not os.path.exists(f"/proc/{owner}")  # reaped by the server, not a zombie
    finally:
        process.kill()
        process.communicate()
    assert server.poll() is None  # the server goes on


def test_the_server_opened_no_engine_connection_and_no_thread(server):
    tasks = os.listdir(f"/proc/{server.pid}/task")
    assert tasks == [str(server.pid)]
    sockets = []
    for fd in os.listdir(f"/proc/{server.pid}/fd"):
        target = os.readlink(f"/proc/{server.pid}/fd/{fd}")
        if target.startswith("socket:"):
            sockets.append(target)
    assert len(sockets) == 1  # its listening socket: no connection to the engine


def test_a_killed_server_takes_its_commands_along(engine, runc_project):
    runtime = Path(tempfile.mkdtemp(prefix="orch-xdg-"))
    server, env = start_server(runtime)
    process = None
    try:
        process, run_id = start_long_run(runc_project, env)
        (container,) = [o for o in engine.list_managed() if o.labels.get(labels.RUN_ID) == run_id]
        owner = int(container.labels[labels.OWNER_PID])
        server.kill()  # no chance to relay anything: the child learns it from the kernel
        server.wait(timeout=10)
        assert wait_until(lambda: not alive(owner) and run_id not in run_ids(engine), 30)
        assert process.wait(timeout=30) == 125  # the client says the server went away
        assert "ended the connection" in process.communicate()[1]
    finally:
        server.kill()
        server.communicate()
        if process is not None:
            process.kill()
            process.communicate()
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_terminal_is_a_terminal_through_the_server(server, runc_project, monkeypatch):
    """isatty() in the forked command sees the client's terminal: escapes shown escaped,
    bytes intact in pipes."""
    from tests.integration.test_terminal import PAYLOAD, assert_shown, in_terminal, printer

    printer(runc_project)
    monkeypatch.setenv("ORCHESTRATOR_SERVER_DEBUG", "1")
    code, seen = in_terminal("run", "w", "--project", str(runc_project.root))
    assert code == 0, seen
    assert f"through the server (pid {server.pid})".encode() in seen
    assert_shown(seen)
    piped = cli("run", "w", "--project", str(runc_project.root))
    assert "through the server" in piped.stderr and piped.stdout == PAYLOAD.decode()


def test_stopping_the_server_ends_its_commands_cleanly(engine, runc_project):
    runtime = Path(tempfile.mkdtemp(prefix="orch-xdg-"))
    server, env = start_server(runtime)
    process = None
    try:
        process, run_id = start_long_run(runc_project, env)
        stop = subprocess.run(
            [sys.executable, "-m", "orchestrator", "serve", "--stop"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert f"stopped the server (pid {server.pid})" in stop.stderr
        assert server.wait(timeout=5) == 0  # gone when --stop returns
        assert process.wait(timeout=5) == 143  # SIGTERM: the command's own clean-up ran
        assert "interrupted; container removed" in process.communicate()[1]
        assert run_id not in run_ids(engine)
        assert not (runtime / "orchestrator" / "server.sock").exists()
    finally:
        server.kill()
        server.communicate()
        if process is not None:
            process.kill()
            process.communicate()
        shutil.rmtree(runtime, ignore_errors=True)


def wrapped(wrapper: list[str], *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "orchestrator", *args],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **env},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("wrapper", "reason"),
    [
        (["setpriv", "--no-new-privs"], "its NoNewPrivs (1;"),
        (["unshare", "--net"], "its net namespace"),
    ],
    ids=["no-new-privs", "netns"],
)
def test_a_client_confined_otherwise_runs_its_run_itself(server, runc_project, wrapper, reason):
    if wrapper[0] == "unshare" and os.getuid() != 0:
        pytest.skip("unshare --net needs root")
    python_worker(runc_project, "w", "import sys; print('out'); sys.exit(3)")
    root = str(runc_project.root)
    refused = wrapped(wrapper, "run", "w", "--project", root, env=DEBUG)
    alone = wrapped(wrapper, "run", "w", "--project", root, env=LOCAL)
    said = f"not using the server: the server (pid {server.pid}) does not serve this process"
    assert said in refused.stderr and reason in refused.stderr, refused.stderr
    assert "through the server" not in refused.stderr
    assert (refused.returncode, refused.stdout) == (alone.returncode, alone.stdout) == (3, "out\n")


def test_a_run_through_the_server_has_the_clients_umask_and_limits(server, engine, runc_project):
    python_worker(runc_project, "w", "import time; print('started', flush=True); time.sleep(120)")
    process = subprocess.Popen(
        ["prlimit", "--nofile=64:64", "sh", "-c", 'umask 077; exec "$@"', "sh",
         sys.executable, "-m", "orchestrator", "run", "w", "--project", str(runc_project.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **DEBUG}, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None and process.stdout is not None
        assert f"through the server (pid {server.pid})" in process.stderr.readline()
        run_id = process.stderr.readline().split()[2].rstrip(":")
        assert process.stdout.readline() == "started\n"
        (container,) = [o for o in engine.list_managed() if o.labels.get(labels.RUN_ID) == run_id]
        owner = int(container.labels[labels.OWNER_PID])  # the server's child
        assert owner not in {process.pid, server.pid}
        with open(f"/proc/{owner}/status") as status:
            assert "Umask:\t0077\n" in status.readlines()
        import resource

        assert resource.prlimit(owner, resource.RLIMIT_NOFILE) == (64, 64)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
    finally:
        process.kill()
        process.communicate()
    assert run_id not in run_ids(engine)
