"""The wrapper that gives an exec into a runc container its nofile limit, run by the host's
own ``/bin/sh`` (no engine): limits set, the command becomes the process, and a command
that cannot start is reported as the engine reports it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from orchestrator.docker import execlimits
from orchestrator.docker.engine import start_failure_code

LIMITS = "import resource as r; print(os.getpid(), *r.getrlimit(r.RLIMIT_NOFILE))"


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)


def test_the_command_gets_the_limits_and_the_wrapper_s_pid():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 64:
        pytest.fail(f"this host's nofile hard limit ({hard}) is below what the test lowers to")
    probe = [sys.executable, "-c", f"import os; {LIMITS}"]
    shown = "import os, subprocess, sys; p = subprocess.Popen(sys.argv[1:]); p.wait(); print(p.pid)"
    done = run([sys.executable, "-c", shown, *execlimits.wrapped(probe, (32, 64))])
    assert done.returncode == 0, done.stderr
    inner, outer = done.stdout.splitlines()
    pid, got_soft, got_hard = inner.split()
    assert (got_soft, got_hard) == ("32", "64")
    assert pid == outer  # the shell became the command: same process


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["no-such-command-here"], 127, "executable file not found in $PATH"),
        (["/no/such/program"], 127, "no such file or directory"),
        (["/etc"], 126, "permission denied"),
        (["./plain.txt"], 126, "permission denied"),  # not executable
    ],
)
def test_a_command_that_cannot_start_is_reported_as_the_engine_does(tmp_path, argv, code, words):
    (tmp_path / "plain.txt").write_text("echo ran\n")
    (tmp_path / "plain.txt").chmod(0o644)
    done = run(execlimits.wrapped(argv, (32, 64)), cwd=tmp_path)
    assert done.returncode == code
    first = done.stdout.encode()
    assert first == execlimits.FAILED + f'"{argv[0]}": {words}\n'.encode()
    assert start_failure_code(done.stdout) == code


def test_the_command_is_looked_up_in_its_own_path(tmp_path):
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\necho found "$@"\n')
    tool.chmod(0o755)
    env = {"PATH": f"/nowhere:{tmp_path}"}
    done = run(execlimits.wrapped(["tool", "a b", "*"], (32, 64)), env=env, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "found a b *\n")
    relative = run(execlimits.wrapped(["./tool"], (32, 64)), env=env, cwd=tmp_path)
    assert relative.stdout == "found\n"
    assert os.access(tool, os.X_OK)


def test_limits_come_from_the_container_s_ulimits_and_never_under_gvisor():
    docker = [
        {"Name": "core", "Soft": 0, "Hard": 0},
        {"Name": "nofile", "Soft": 1024, "Hard": 4096},
    ]
    assert execlimits.nofile(False, docker) == (1024, 4096)
    assert execlimits.nofile(False, [{"Name": "RLIMIT_NOFILE", "Soft": 1024, "Hard": 4096}]) == (
        1024,
        4096,
    )
    assert execlimits.nofile(True, docker) is None
    assert execlimits.nofile(False, None) is None
    assert execlimits.nofile(False, [{"Name": "nofile", "Soft": 9, "Hard": 1}]) is None
    assert execlimits.wrapped(["true"], None) == ["true"]
