"""The entry point's client side (``orchestrator.launcher``) and the server's start and stop,
without an engine: which folders and servers it refuses (and says why with the debug
variable), that it imports nothing but the standard library, that an outdated server is
not used, and that every server started here is stopped."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import launcher
from orchestrator.cli import wire

DEBUG = {"ORCHESTRATOR_SERVER_DEBUG": "1"}


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A private XDG_RUNTIME_DIR (short: a unix socket's path has a length limit)."""
    folder = Path(tempfile.mkdtemp(prefix="orch-xdg-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def orchestrator(runtime: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != launcher.NO_SERVER}
    full.update(XDG_RUNTIME_DIR=str(runtime), **env)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True, text=True, timeout=60, env=full, check=False,
    )  # fmt: skip


def start_server(runtime: Path, code: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != launcher.NO_SERVER}
    env["XDG_RUNTIME_DIR"] = str(runtime)
    command = ["-m", "orchestrator", "serve"] if code is None else ["-c", code]
    process = subprocess.Popen(
        [sys.executable, *command], env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    path = str(runtime / "orchestrator" / wire.SOCKET_NAME)
    while process.poll() is None and time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as probe:
            if probe.connect_ex(path) == 0:  # listening (the server then sees a quiet client)
                return process
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"the server did not start: {process.communicate(timeout=30)[1]}")


def stop_server(runtime: Path, process: subprocess.Popen[str]) -> str:
    done = orchestrator(runtime, "serve", "--stop")
    try:
        assert process.wait(timeout=30) == 0, done.stderr
    finally:
        process.kill()
        process.communicate()
    return done.stderr


@pytest.fixture
def server(runtime: Path) -> Iterator[subprocess.Popen[str]]:
    process = start_server(runtime)
    yield process
    stderr = stop_server(runtime, process)
    assert f"stopped the server (pid {process.pid})" in stderr


def test_the_folder_is_made_private_and_the_socket_0600(runtime, server):
    folder = runtime / "orchestrator"
    assert (os.lstat(folder).st_mode & 0o777, os.lstat(folder).st_uid) == (0o700, os.getuid())
    assert os.lstat(folder / wire.SOCKET_NAME).st_mode & 0o777 == 0o600


def test_a_command_goes_through_the_server_and_the_client_imports_only_the_stdlib(runtime, server):
    done = orchestrator(runtime, "--version", **DEBUG)
    assert done.returncode == 0 and "version" in done.stdout
    assert f"through the server (pid {server.pid})" in done.stderr
    probe = (
        "import sys\nbefore = set(sys.modules)\nimport orchestrator.launcher\n"
        "print(sorted(m for m in set(sys.modules) - before\n"
        "             if m.split('.')[0] not in sys.stdlib_module_names))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True).stdout  # fmt: skip
    assert loaded.strip() == str(
        ["orchestrator", "orchestrator.cli", "orchestrator.cli.wire", "orchestrator.errors",
         "orchestrator.launcher"]
    )  # fmt: skip
    timed = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator", "--version"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime), launcher.NO_SERVER: ""},
    )  # fmt: skip
    imported = {line.rsplit("|", 1)[1].strip() for line in timed.stderr.splitlines() if "|" in line}
    assert timed.returncode == 0 and "click" not in imported and "pydantic" not in imported


def test_a_second_server_is_refused(runtime, server):
    done = orchestrator(runtime, "serve")
    assert done.returncode == 125
    assert f"already listens on {runtime}/orchestrator/server.sock (pid {server.pid})" in (
        done.stderr
    )


def test_a_server_of_other_package_files_is_not_used(runtime):
    outdated = start_server(
        runtime,
        "import orchestrator.cli.wire as w\n"
        "w.fingerprint = lambda: 'another-version'\n"
        "from orchestrator.cli.main import main\n"
        "main(['serve'])\n",
    )
    try:
        done = orchestrator(runtime, "--version", **DEBUG)
        assert done.returncode == 0 and "version" in done.stdout
        assert "not using the server" in done.stderr and "other package files" in done.stderr
        assert "through the server" not in done.stderr
    finally:
        stop_server(runtime, outdated)


@pytest.mark.parametrize("problem", ["mode 0777", "symlink", "other owner", "socket 0666"])
def test_a_folder_or_socket_others_could_use_is_refused(runtime, problem, tmp_path):
    folder = runtime / "orchestrator"
    if problem == "symlink":
        real = runtime / "elsewhere"
        real.mkdir(mode=0o700)
        folder.symlink_to(real)
        reason = "is a symbolic link"
    else:
        folder.mkdir(mode=0o700)
        reason = {"mode 0777": "has mode 0777", "other owner": "belongs to uid 65534",
                  "socket 0666": "server.sock has mode 0666"}[problem]  # fmt: skip
    if problem == "mode 0777":
        folder.chmod(0o777)
    if problem == "other owner":
        if os.getuid() != 0:
            pytest.skip("needs root to give the folder away")
        os.chown(folder, 65534, 65534)
    if problem == "socket 0666":
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(folder / wire.SOCKET_NAME))
        os.chmod(folder / wire.SOCKET_NAME, 0o666)
    done = orchestrator(runtime, "--version", **DEBUG)
    assert done.returncode == 0 and "version" in done.stdout  # ran by itself
    assert "not using the server" in done.stderr and reason in done.stderr
    quiet = orchestrator(runtime, "--version")
    assert quiet.stderr == ""  # silent without the debug variable
    if problem != "socket 0666":
        refused = orchestrator(runtime, "serve")
        assert refused.returncode == 125 and reason in refused.stderr
        assert len(refused.stderr.splitlines()) == 1


def test_no_socket_and_the_opt_out_run_the_command_here(runtime):
    done = orchestrator(runtime, "--version", **DEBUG)
    assert done.returncode == 0 and "does not exist" in done.stderr
    off = orchestrator(runtime, "--version", ORCHESTRATOR_NO_SERVER="1", **DEBUG)
    assert off.returncode == 0 and "ORCHESTRATOR_NO_SERVER is set" in off.stderr  # says why
    assert orchestrator(runtime, "--version", ORCHESTRATOR_NO_SERVER="1").stderr == ""
    assert "no server to stop" in orchestrator(runtime, "serve", "--stop").stderr


def test_the_server_and_the_session_owner_never_go_through_a_server(monkeypatch):
    monkeypatch.delenv("ORCHESTRATOR_NO_SERVER", raising=False)
    assert launcher.local(["serve"]) and launcher.local(["serve", "--stop"])
    assert launcher.local(["session", "serve", "w", "--project", "p"])
    assert not launcher.local(["run", "serve"]) and not launcher.local(["session", "exec", "x"])
    monkeypatch.setenv("ORCHESTRATOR_NO_SERVER", "1")
    assert launcher.local(["run", "w"])


def test_the_fingerprint_follows_the_package_files(tmp_path, monkeypatch):
    before = wire.fingerprint()
    assert before == wire.fingerprint()
    monkeypatch.setattr(sys, "executable", "/another/python")
    assert wire.fingerprint() != before


def test_the_fingerprint_follows_the_installed_dependencies(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / "docker-7.1.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    before = wire.fingerprint()
    (site / "docker-7.1.0.dist-info").rename(site / "docker-7.2.0.dist-info")  # an upgrade
    upgraded = wire.fingerprint()
    assert upgraded != before
    (site / "docker-7.2.0.dist-info" / "RECORD").write_text("")  # the same version: same
    assert wire.fingerprint() == upgraded


def test_a_request_survives_any_bytes_but_nul():
    argv = ["run", "w", "--", "a b", "", "=", "\udcff-not-utf8", "-\n-"]
    env = {"A": "1=2", "EMPTY": "", "B": "\udcfe", "LONG": "x" * 100_000}
    payload = wire.encode_request(argv, "/some where", env)
    assert wire.decode_request(payload) == (argv, "/some where", env)
    for bad in (
        b"",
        b"/cwd",
        b"/cwd\x00x",
        b"/cwd\x005\x00a",
        b"/cwd\x000\x00novalue",
        b"/cwd\x00-1",
    ):
        with pytest.raises(ValueError, match="malformed request"):
            wire.decode_request(bad)


def test_a_stale_socket_is_skipped_then_replaced_by_a_new_server(runtime):
    folder = runtime / "orchestrator"
    folder.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as dead:  # bound, never listening: a dead server's
        dead.bind(str(folder / wire.SOCKET_NAME))
    os.chmod(folder / wire.SOCKET_NAME, 0o600)
    done = orchestrator(runtime, "--version", **DEBUG)
    assert done.returncode == 0 and "a stale socket?" in done.stderr
    process = start_server(runtime)
    try:
        assert "through the server" in orchestrator(runtime, "--version", **DEBUG).stderr
    finally:
        stop_server(runtime, process)
