"""Commands run in a live, hardened worker container, as a session runs them."""

from __future__ import annotations

import time

import pytest

from orchestrator.config import load_project, load_worker
from orchestrator.errors import PolicyError
from orchestrator.prepare import prepare
from orchestrator.runtime.execs import run_exec
from orchestrator.runtime.host_folders import make_host_folders
from tests.conftest import ProjectDir

pytestmark = pytest.mark.docker

#: Every process of the container as "pid pgid cmdline" (the image has no `ps`).
PROCESSES = (
    "for d in /proc/[0-9]*; do [ -r $d/cmdline ] || continue; "
    'echo "${d#/proc/} $(cut -d" " -f5 $d/stat 2>/dev/null) $(tr "\\0" " " < $d/cmdline)"; done'
)


@pytest.fixture(scope="module")
def live(engine, tmp_path_factory):
    """A keep-alive worker container (it has an outbox, so its own process only idles)."""
    project = ProjectDir(tmp_path_factory.mktemp("execs") / "project")
    project.zone("data", "ro", files={"hello.txt": "hi\n"})
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: data}]}')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    spec = prepared.spec
    assert spec.supervisor_user is not None
    make_host_folders(prepared)
    container_id = engine.create(spec)
    try:
        engine.start(container_id)

        def run(command, **kwargs):
            return run_exec(
                engine, container_id, command, user=spec.user, base_env=spec.env, **kwargs
            )

        run.spec = spec
        yield run
    finally:
        engine.remove(container_id)


def test_exit_code_and_streams_apart(live):
    result = live("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert result.signal is None and not result.timed_out
    assert result.argv == ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]
    assert result.duration_s < 5


def test_runs_as_the_worker_with_the_spec_env(live):
    result = live(["sh", "-c", 'echo "$(id -u):$(id -g) $HOME $ORCHESTRATOR_WORKER"'])
    assert result.stdout == f"{live.spec.user} /tmp w\n", result.stderr


def test_output_past_the_cap_keeps_the_end(live):
    result = live("head -c 300000 /dev/zero | tr '\\0' a; echo END", cap=1000)
    assert result.stdout_truncated and not result.stderr_truncated
    assert len(result.stdout) == 1000 and result.stdout.endswith("aaEND\n")
    small = live("echo -n 12345 >&2", cap=5)
    assert small.stderr == "12345" and not small.stderr_truncated


def test_output_is_streamed_and_a_failing_callback_only_stops_the_echo(live):
    seen: list[tuple[str, bytes]] = []

    def echo(stream, chunk):
        seen.append((stream, chunk))
        raise BrokenPipeError

    result = live("echo one; sleep 0.2; echo two", on_output=echo)
    assert seen == [("stdout", b"one\n")]
    assert result.stdout == "one\ntwo\n"


def test_stdin_is_fed_then_closed(live):
    assert live("cat", stdin="hello\n").stdout == "hello\n"
    assert live("wc -c", stdin=b"").stdout.strip() == "0"
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB
    result = live("wc -c; true", stdin=big, timeout=60)
    assert result.stdout.strip() == str(len(big)), result.stderr
    # a command that never reads its input still ends
    assert live("true", stdin=big, timeout=30).exit_code == 0


def test_no_stdin_means_empty_input(live):
    assert live("cat; echo done").stdout == "done\n"


def test_reserved_env_is_refused_other_env_merged(live):
    with pytest.raises(PolicyError, match="HOME is owned by the sandbox"):
        live("true", env={"HOME": "/session"})
    with pytest.raises(PolicyError, match="ORCHESTRATOR_RUN_ID: it is set by the orchestrator"):
        live("true", env={"ORCHESTRATOR_RUN_ID": "x"})
    with pytest.raises(PolicyError, match="HTTPS_PROXY"):
        live("true", env={"HTTPS_PROXY": "http://elsewhere:1"})
    result = live('echo "$GREETING $HOME"', env={"GREETING": "hello"})
    assert result.stdout == "hello /tmp\n"


def test_cwd(live):
    assert live("pwd").stdout == f"{live.spec.workdir}\n"
    assert live("pwd; cat hello.txt", cwd="/data").stdout == "/data\nhi\n"
    missing = live("pwd", cwd="/nowhere")
    assert missing.exit_code == 126 and "/nowhere" in missing.stderr
    with pytest.raises(PolicyError, match="absolute"):
        live("pwd", cwd="data")


def test_timeout_kills_the_whole_tree_and_nothing_else(live):
    bystander = live("sleep 97 >/dev/null 2>&1 & echo $!")
    assert bystander.exit_code == 0
    started = time.monotonic()
    result = live("sleep 100 & sleep 100 & sleep 100", timeout=1)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code == 124 and result.signal == 9
    assert elapsed < 4, elapsed
    processes = live(PROCESSES).stdout
    assert "sleep 100" not in processes
    assert "sleep 97" in processes  # another command of the same session is left alone
    assert live(f"kill -9 {bystander.stdout.strip()}").exit_code == 0


def test_death_by_signal_is_reported(live):
    result = live("kill -9 $$")
    assert (result.exit_code, result.signal) == (137, 9)
    assert live("kill -TERM $$").signal == 15


def test_a_missing_command_is_127(live):
    result = live(["no-such-command", "x"])
    assert result.exit_code == 127
    assert "no-such-command" in result.stderr
    assert "orchestrator-exec-pid" not in result.stderr


def test_the_pid_line_never_shows(live):
    result = live("echo x >&2")
    assert result.stderr == "x\n"


def test_a_callback_that_raises_ends_the_command_too(live):
    def stop(stream, chunk):
        raise RuntimeError("caller gave up")

    with pytest.raises(RuntimeError, match="caller gave up"):
        live("echo first; exec sleep 98", on_output=stop, timeout=30)
    assert gone(live, "sleep 98")


def gone(live, command: str, within: float = 5.0) -> bool:
    """Whether ``command`` is no longer running, waiting a little: under gVisor a killed
    process can still be listed for a moment after ``kill`` returned."""
    deadline = time.monotonic() + within
    while command in live(PROCESSES).stdout:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
