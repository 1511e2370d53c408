"""The entry point's client side (``orchestrator.launcher``) and the server's start and stop,
without an engine: which folders and servers it refuses (and says why with the debug
variable), that it imports nothing but the standard library, that an outdated server is
not used, that a client confined otherwise than the server (groups, NoNewPrivs, seccomp,
namespaces) runs its command itself while the server's command takes its client's umask and
limits, and that every server started here is stopped."""

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
from orchestrator.cli import peer, wire

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
         "orchestrator.exits", "orchestrator.launcher"]
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


# -- who the server serves: a client confined otherwise than the server runs by itself --

#: A server whose commands only say that it ran them, with the umask and the limits they got.
TELLING_SERVER = """
import os, resource
from orchestrator.cli import server

def entry(argv):
    mask = os.umask(0)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"served by the server: umask {mask:04o} nofile {nofile[0]}:{nofile[1]}", flush=True)
    raise SystemExit(0)

server._serve(entry, False, server.Options())
"""

#: Runs the rest of its command line under a seccomp filter that allows everything (mode 2).
SECCOMP = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
allow = (Insn * 1)(Insn(0x06, 0, 0, 0x7FFF0000))  # BPF_RET|BPF_K SECCOMP_RET_ALLOW
if os.geteuid() != 0 and libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
if libc.prctl(22, 2, ctypes.byref(Prog(1, allow)), 0, 0) != 0:  # SECCOMP_MODE_FILTER
    raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")
os.execvp(sys.argv[1], sys.argv[1:])
"""

ROOT = os.getuid() == 0
#: How each client is confined: (the wrapper, what the server names, whether it needs root).
CONFINED = {
    "no new privileges": (["setpriv", "--no-new-privs"], "its NoNewPrivs (1;", False),
    "other groups": (["setpriv", "--groups", "4242"], "its supplementary groups (4242;", True),
    "network namespace": (["unshare", "--net"], "its net namespace", True),
    "mount namespace": (["unshare", "--mount"], "its mnt namespace", True),
    "user namespace": (["unshare", "--user"], "its user namespace", False),
    "seccomp filter": ([sys.executable, "-c", SECCOMP], "its seccomp mode (2;", False),
}


@pytest.fixture
def telling_server(runtime: Path) -> Iterator[subprocess.Popen[str]]:
    process = start_server(runtime, TELLING_SERVER)
    yield process
    stop_server(runtime, process)


def confined(runtime: Path, wrapper: list[str], *args: str, **env: str):
    full = {k: v for k, v in os.environ.items() if k != launcher.NO_SERVER}
    full.update(XDG_RUNTIME_DIR=str(runtime), **env)
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "orchestrator", *args],
        capture_output=True, text=True, timeout=60, env=full, check=False,
    )  # fmt: skip


def test_a_client_confined_as_the_server_is_served(runtime, telling_server):
    done = orchestrator(runtime, "--version", **DEBUG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("served by the server")
    assert f"through the server (pid {telling_server.pid})" in done.stderr
    cleared = confined(runtime, ["setpriv", "--clear-groups"] if ROOT else [], "--version")
    assert cleared.stdout.startswith("served by the server")  # root's groups: none either way


@pytest.mark.parametrize("how", list(CONFINED))
def test_a_client_confined_otherwise_runs_the_command_itself(runtime, telling_server, how):
    wrapper, reason, needs_root = CONFINED[how]
    if needs_root and not ROOT:
        pytest.skip(f"needs root: {' '.join(wrapper)}")
    if shutil.which(wrapper[0]) is None:
        pytest.skip(f"no {wrapper[0]} here")
    probe = subprocess.run([*wrapper, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot confine a process here: {probe.stderr.strip()}")
    done = confined(runtime, wrapper, "--version", **DEBUG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("orchestrator, version")  # its own, not the server's
    assert "served by the server" not in done.stdout
    assert "through the server" not in done.stderr
    said = (
        f"not using the server: the server (pid {telling_server.pid}) does not serve this process"
    )
    assert said in done.stderr and reason in done.stderr, done.stderr
    quiet = confined(runtime, wrapper, "--version")
    assert (quiet.returncode, quiet.stderr) == (0, "")  # silent without the debug variable
    assert quiet.stdout.startswith("orchestrator, version")


@pytest.fixture
def other_cgroup() -> Iterator[Path]:
    """A cgroup of its own in the pids hierarchy (cgroup v1) or the unified one (v2), as
    a systemd scope would be; removed after (its processes are gone by then)."""
    if not ROOT:
        pytest.skip("needs root: making a cgroup")
    found = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        if controllers in ("pids", ""):
            hierarchy = "pids" if controllers == "pids" else "unified"
            base = Path("/sys/fs/cgroup") / hierarchy
            if not base.is_dir() and controllers == "":
                base = Path("/sys/fs/cgroup")
            found.append(base / path.lstrip("/"))
    if not found:
        pytest.skip("no pids or unified cgroup hierarchy here")
    folder = found[0] / f"orch-test-{os.getpid()}"
    folder.mkdir()
    yield folder
    folder.rmdir()


def test_a_client_in_another_cgroup_runs_the_command_itself(runtime, telling_server, other_cgroup):
    """A command runs in the server's cgroup: a client in another one would escape its
    limits through the server, so it runs the command itself."""
    wrapper = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(other_cgroup)]
    done = confined(runtime, wrapper, "--version", **DEBUG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("orchestrator, version")  # its own, not the server's
    assert "its cgroup (" in done.stderr and "does not serve this process" in done.stderr


def test_another_root_directory_is_a_difference(tmp_path):
    """A client chrooted elsewhere sees another file system than the server's commands
    would: its root directory differs (read from ``/proc/PID/root``)."""
    if not ROOT:
        pytest.skip("needs root: chroot")
    chrooted_r, chrooted_w = os.pipe()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.chroot(tmp_path)
        os.write(chrooted_w, b"x")
        os.read(done_r, 1)
        os._exit(0)
    try:
        assert os.read(chrooted_r, 1) == b"x"
        theirs, ours = peer.confinement(child), peer.confinement("self")
        found = peer.differences(theirs, ours)
        assert [d for d in found if d.startswith("its root directory (")], found
        assert peer.differences(peer.confinement(os.getpid()), ours) == []
    finally:
        os.write(done_w, b"x")
        os.waitpid(child, 0)
        for fd in (chrooted_r, chrooted_w, done_r, done_w):
            os.close(fd)


def test_the_command_takes_the_clients_umask_and_limits(runtime, telling_server):
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit here")
    plain = orchestrator(runtime, "--version")
    mask = os.umask(0o022)
    os.umask(mask)
    assert plain.stdout.startswith(f"served by the server: umask {mask:04o}")
    done = confined(
        runtime, ["prlimit", "--nofile=64:64", "sh", "-c", 'umask 077; exec "$@"', "sh"],
        "--version", **DEBUG,
    )  # fmt: skip
    assert done.stdout == "served by the server: umask 0077 nofile 64:64\n", done.stderr
    assert f"through the server (pid {telling_server.pid})" in done.stderr


def test_a_hard_limit_above_the_servers_is_refused_without_the_capability(runtime):
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 128:
        pytest.skip("no finite hard limit on open files to lower")
    lowered = start_server_limited(runtime, hard - 1)
    try:
        done = orchestrator(runtime, "--version", **DEBUG)
        with open(f"/proc/{lowered.pid}/status") as status:
            capable = any(
                line.startswith("CapEff:") and int(line.split()[1], 16) >> 24 & 1 for line in status
            )
        if capable:  # CAP_SYS_RESOURCE: the child can raise it again
            assert done.stdout.startswith("served by the server"), done.stderr
        else:
            assert done.stdout.startswith("orchestrator, version")
            assert "its hard RLIMIT_NOFILE above the server's" in done.stderr
    finally:
        stop_server(runtime, lowered)


def start_server_limited(runtime: Path, nofile: int) -> subprocess.Popen[str]:
    code = f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))\n"
    return start_server(runtime, code + TELLING_SERVER)
