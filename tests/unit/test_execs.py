"""run_exec's pure parts, with the fake engine: capture, the pid line, env and argv checks."""

from __future__ import annotations

import pytest

from orchestrator.errors import PolicyError
from orchestrator.runtime.execs import PID_PREFIX, Capture, check_env, run_exec
from tests.unit.fake_engine import FakeEngine

BASE = {"HOME": "/tmp", "PATH": "/usr/bin:/bin", "ORCHESTRATOR_WORKER": "w"}


def run(engine: FakeEngine, command, **kwargs):
    return run_exec(engine, "c1", command, user="1000:1000", base_env=BASE, **kwargs)


def test_the_wrapper_reports_its_pid_then_runs_the_command_with_the_merged_env():
    engine = FakeEngine(exec_frames=[[("stderr", PID_PREFIX + b"42\n"), ("stdout", b"hi\n")]])
    result = run(engine, "echo hi", env={"GREETING": "x"}, cwd="/data", stdin="é")
    call = engine.execs[0]
    assert call.argv[:2] == ["/bin/sh", "-c"]
    assert call.argv[3:] == ["sh", "/data", "/bin/sh", "-c", "echo hi"]
    assert call.env == {**BASE, "GREETING": "x"}
    assert call.stdin == "é".encode()
    assert call.user == "1000:1000"
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "", 0)
    assert result.argv == ["/bin/sh", "-c", "echo hi"]
    assert result.to_dict()["argv"] == result.argv


def test_the_pid_line_is_removed_even_split_across_chunks():
    frames = [
        ("stderr", PID_PREFIX[:5]),
        ("stderr", PID_PREFIX[5:] + b"4"),
        ("stderr", b"2\nwarning\n"),
    ]
    seen = []
    engine = FakeEngine(exec_frames=[frames])
    result = run(engine, ["true"], on_output=lambda s, c: seen.append((s, c)))
    assert result.stderr == "warning\n"
    assert seen == [("stderr", b"warning\n")]


def test_stderr_that_is_not_the_pid_line_is_kept():
    engine = FakeEngine(exit_code=126, exec_frames=[[("stderr", b"exec failed: no /bin/sh\n")]])
    result = run(engine, ["true"])
    assert result.stderr == "exec failed: no /bin/sh\n"
    assert result.exit_code == 126 and result.signal is None


@pytest.mark.parametrize(
    ("code", "signal"), [(0, None), (1, None), (128, None), (137, 9), (143, 15), (255, None)]
)
def test_signal_is_inferred_from_128_plus_n(code, signal):
    engine = FakeEngine(exit_code=code, exec_frames=[[("stderr", PID_PREFIX + b"7\n")]])
    assert run(engine, ["true"]).signal == signal


def test_capture_keeps_the_last_bytes_and_never_starts_inside_a_character():
    capture = Capture(cap=4)
    for chunk in (b"abc", "\u00e9\u00e9".encode(), b"z"):  # é is two bytes
        capture.add(chunk)
    assert capture.truncated
    assert capture.text() == "\u00e9z"  # the last 4 bytes began with half an é
    whole = Capture(cap=4)
    whole.add(b"abcd")
    assert (whole.text(), whole.truncated) == ("abcd", False)


def test_invalid_utf8_is_replaced():
    engine = FakeEngine(exec_frames=[[("stdout", b"\xff\xfeok")]])
    assert run(engine, ["true"]).stdout == "\ufffd\ufffdok"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HOME": "/session"}, "Cannot set env HOME: HOME is owned by the sandbox"),
        ({"ORCHESTRATOR_TRUST": "trusted"}, "Cannot set env ORCHESTRATOR_TRUST: it is set by"),
        ({"http_proxy": "http://x:1"}, "Cannot set env http_proxy: it is set by"),
        ({"A=B": "x"}, "a variable name is letters"),
        ({"OK": "a\0b"}, "without NUL bytes"),
    ],
)
def test_env_the_orchestrator_owns_is_refused_in_one_line(env, message):
    with pytest.raises(PolicyError) as refused:
        check_env(env)
    assert len(refused.value.problems) == 1
    assert message in str(refused.value)


def test_refusals_happen_before_anything_runs():
    engine = FakeEngine()
    with pytest.raises(PolicyError):
        run(engine, "true", env={"HOME": "/x"})
    with pytest.raises(PolicyError, match="absolute container path"):
        run(engine, "true", cwd="relative")
    with pytest.raises(PolicyError, match="non-empty"):
        run(engine, [])
    for timeout in (0, -1, 604801, 1e12, float("inf"), float("nan")):
        with pytest.raises(PolicyError, match="not in the range 0<x<=604800 seconds"):
            run(engine, "true", timeout=timeout)
    assert engine.execs == []


def test_a_failing_callback_stops_the_echo_not_the_capture():
    calls = []

    def echo(stream, chunk):
        calls.append(chunk)
        raise BrokenPipeError

    engine = FakeEngine(exec_frames=[[("stdout", b"a"), ("stdout", b"b")]])
    assert run(engine, ["true"], on_output=echo).stdout == "ab"
    assert calls == [b"a"]


def test_an_error_in_the_callback_reaches_the_caller():
    def bad(stream, chunk):
        raise RuntimeError("callback broke")

    engine = FakeEngine(exec_frames=[[("stdout", b"a")]])
    with pytest.raises(RuntimeError, match="callback broke"):
        run(engine, ["true"], on_output=bad)


def test_stdout_before_the_pid_line_waits_so_a_failing_callback_still_kills_the_command():
    # Podman may deliver the command's first stdout ahead of the wrapper's pid line.
    frames = [("stdout", b"first\n"), ("stderr", PID_PREFIX + b"42\nwarn\n")]
    engine = FakeEngine(exec_frames=[frames])
    seen = []

    def stop(stream, chunk):
        seen.append((stream, chunk))
        raise RuntimeError("caller gave up")

    with pytest.raises(RuntimeError, match="caller gave up"):
        run(engine, ["sleep", "98"], on_output=stop)
    assert seen == [("stdout", b"first\n")]
    kill = engine.execs[1]
    assert kill.argv[-1] == "42"  # the command's group, killed by its pid


def test_stdout_held_for_a_pid_line_that_never_comes_is_still_delivered():
    seen = []
    engine = FakeEngine(exec_frames=[[("stdout", b"a"), ("stdout", b"b")]])
    result = run(engine, ["true"], on_output=lambda s, c: seen.append(c))
    assert seen == [b"a", b"b"] and result.stdout == "ab"
