"""One command run inside a session's live container, as the worker's uid.

:func:`exec_request` checks a command once, for every backend (argv, env names, cwd,
timeout) into an :class:`ExecRequest`, which a live run's
:meth:`~orchestrator.runtime.backend.Launch.exec` runs. On a container engine that is
:func:`exec_in` (:func:`run_exec` is both): it starts the command through a tiny
``/bin/sh`` wrapper that first reports its own pid on stderr (that line is taken off
again), changes to ``cwd`` when one is given, and then replaces itself with the command,
which so keeps that pid. The container runtime
(runc) starts every exec in a session and process group of its own, so that pid is also the
process group of everything the command forks; a timeout kills that group with
``kill -9 -<pgid>`` from a second exec as the same user (with :data:`TOOL_ENV`), and other
commands running in the same session are left alone. A process that calls ``setsid`` itself
leaves the group: it escapes the timeout and is only killed when the session's container is
removed (the pids limit bounds how many such processes there can be).

What comes back (:class:`ExecResult`):

- ``stdout`` and ``stderr`` apart, each decoded as UTF-8 (invalid bytes replaced) and capped
  at ``cap`` bytes (1 MiB by default). The LAST bytes are kept, as in a run's result: the end
  of a build or test log is where its verdict is. ``stdout_truncated`` / ``stderr_truncated``
  say when the start was dropped. Output is read to its end either way, so a chatty command
  never blocks on a full pipe.
- ``exit_code`` as the engine reports it. ``signal`` is only inferred: the runtime (and any
  shell) reports a process killed by signal N as exit code 128+N, so a code from 129 to 192
  is reported as that signal — a command that itself exits with such a code looks the same.
- ``timed_out``: the command outlived ``timeout`` and its process group was killed; the exit
  code is then 124 (as with coreutils ``timeout``) and ``signal`` 9 (SIGKILL, what was sent).
"""

from __future__ import annotations

import re
import signal as signals
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.errors import PolicyError, StartFailure
from orchestrator.exits import Exit
from orchestrator.plan import RESERVED_ENV
from orchestrator.runtime.engine import Containers, ExecHandle, Stream
from orchestrator.runtime.supervised import TOOL_ENV, drain
from orchestrator.timeouts import MAX_TIMEOUT_S, seconds_problem

#: Bytes kept of each of stdout and stderr (the last ones).
DEFAULT_CAP = 1 << 20
#: How long to wait for the output to end once a command's group has been killed.
KILL_GRACE_S = 5.0
PID_PREFIX = b"orchestrator-exec-pid="
#: $0 is the wrapper's name in its own messages; $1 the working folder ("" for the default).
WRAPPER = (
    f'printf "{PID_PREFIX.decode()}%s\\n" "$$" >&2 || exit 126; '
    'if [ -n "$1" ]; then cd -- "$1" || exit 126; fi; shift; exec "$@"'
)
#: Kills one command's process group (its pid is $0); only that pid if it has no group.
KILL_GROUP = 'kill -9 -"$0" 2>/dev/null || kill -9 "$0" 2>/dev/null; true'
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

OutputCallback = Callable[[Stream, bytes], None]
#: Stdout chunks held back while the pid line has not come (see _Reader.run).
MAX_HELD = 256


@dataclass(frozen=True)
class ExecResult:
    """How one command run in a session ended, and what it printed."""

    argv: list[str]
    exit_code: int
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    timed_out: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Capture:
    """The last ``cap`` bytes of one stream, and whether anything before them was dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buffer = bytearray()
        self.dropped = False

    @property
    def truncated(self) -> bool:
        return self.dropped or len(self.buffer) > self.cap

    def add(self, chunk: bytes) -> None:
        self.buffer += chunk
        if len(self.buffer) > 2 * self.cap:  # trim in batches, not on every chunk
            self._trim()

    def _trim(self) -> None:
        if len(self.buffer) > self.cap:
            del self.buffer[: len(self.buffer) - self.cap]
            self.dropped = True

    def text(self) -> str:
        self._trim()
        data = bytes(self.buffer)
        if self.truncated:  # the cut may have split a character: drop its continuation bytes
            skip = 0
            while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
                skip += 1
            data = data[skip:]
        return data.decode("utf-8", errors="replace")


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's variables, or a PolicyError naming each one that may not be set."""
    problems = []
    for name, value in (env or {}).items():
        if name == "HOME":
            problems.append(
                "Cannot set env HOME: HOME is owned by the sandbox (it is /tmp); "
                "use another variable name"
            )
        elif name in RESERVED_ENV:
            problems.append(
                f"Cannot set env {name}: it is set by the orchestrator itself; "
                "use another variable name"
            )
        elif not isinstance(name, str) or not ENV_NAME.match(name):
            problems.append(
                f"Cannot set env {name!r}: a variable name is letters, digits and '_', "
                "not starting with a digit"
            )
        elif not isinstance(value, str) or "\0" in value:
            problems.append(f"Cannot set env {name}: its value must be text without NUL bytes")
    if problems:
        raise PolicyError(problems)
    return dict(env or {})


def _argv(command: str | Sequence[str]) -> list[str]:
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise PolicyError(
            ["Cannot run the command: give a non-empty list of strings (or one shell string)"]
        )
    return argv


def _signal_of(code: int) -> int | None:
    number = code - 128
    return number if 0 < number <= 64 else None


class _Reader:
    """Reads one exec's frames (in its own thread): strips the wrapper's pid line, captures
    both streams, and echoes chunks to ``on_output`` until that raises OSError."""

    def __init__(self, handle: ExecHandle, cap: int, on_output: OutputCallback | None) -> None:
        self.handle = handle
        self.captures: dict[Stream, Capture] = {"stdout": Capture(cap), "stderr": Capture(cap)}
        self.on_output = on_output
        self.pid: int | None = None
        self.pid_known = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._head: bytes | None = b""  # stderr before the pid line; None once it is past

    def run(self) -> None:
        # An engine may deliver the command's first stdout before the wrapper's pid line on
        # stderr (Podman does): stdout is held until the pid is known, so that a callback
        # failing on it still finds the command's group to kill.
        held: list[tuple[Stream, bytes]] = []
        try:
            for stream, chunk in self.handle.frames:
                if self._head is not None and stream == "stdout" and len(held) < MAX_HELD:
                    held.append((stream, chunk))
                    continue
                if stream == "stderr" and self._head is not None:
                    chunk = self._pid_line(chunk)
                if self._head is None and held:
                    held, earlier = [], held
                    for early in earlier:
                        self._emit(*early)
                if chunk:
                    self._emit(stream, chunk)
            held, earlier = [], held  # the output ended before any pid line
            for early in earlier:
                self._emit(*early)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self.error = exc
        finally:
            for stream, chunk in held:  # kept, not echoed: reading failed before them
                self.captures[stream].add(chunk)
            if self._head:  # output ended inside the first line: it was never ours
                self._emit("stderr", self._head)
            self._head = None
            self.pid_known.set()
            self.done.set()

    def _pid_line(self, chunk: bytes) -> bytes:
        assert self._head is not None
        data = self._head + chunk
        line, newline, rest = data.partition(b"\n")
        if not newline:
            if len(data) < 64 and PID_PREFIX.startswith(data[: len(PID_PREFIX)]):
                self._head = data
                return b""
            self._head = None
            self.pid_known.set()
            return data
        self._head = None
        if line.startswith(PID_PREFIX) and line[len(PID_PREFIX) :].isdigit():
            self.pid = int(line[len(PID_PREFIX) :])
            self.pid_known.set()
            return rest
        self.pid_known.set()
        return data

    def _emit(self, stream: Stream, chunk: bytes) -> None:
        self.captures[stream].add(chunk)
        if self.on_output is not None:
            try:
                self.on_output(stream, chunk)
            except OSError:
                self.on_output = None  # stop echoing (a closed pipe), keep capturing


@dataclass(frozen=True)
class ExecRequest:
    """One command for a live run, checked (:func:`exec_request`): what a backend's
    :meth:`~orchestrator.runtime.backend.Launch.exec` runs."""

    argv: list[str]
    user: str
    env: dict[str, str]
    """The whole environment of the command (the plan's, or the tools', and the caller's)."""
    cwd: str | None = None
    """A container path (None: the container's working folder)."""
    timeout: float | None = None
    """Seconds, after which the command's whole process tree is killed (None: none)."""
    stdin: bytes | None = None
    """Fed to the command, then end of file (None: empty standard input)."""
    cap: int = DEFAULT_CAP
    """Bytes kept of each of stdout and stderr (the last ones)."""


def exec_request(
    argv: str | Sequence[str],
    *,
    user: str,
    base_env: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    stdin: bytes | str | None = None,
    cap: int = DEFAULT_CAP,
) -> ExecRequest:
    """``argv`` (a str runs as ``/bin/sh -c``) as a checked :class:`ExecRequest`.

    ``env`` is merged over ``base_env`` (the spec's); the names the orchestrator owns (HOME,
    ``ORCHESTRATOR_*``, the proxy variables) are refused with a :class:`PolicyError`, as
    are a relative ``cwd`` and a timeout that is not a positive number of at most a week.
    """
    command = _argv(argv)
    merged = {**base_env, **check_env(env)}
    if cwd is not None and (not cwd.startswith("/") or "\0" in cwd):
        raise PolicyError([f"Cannot run in '{cwd}': cwd must be an absolute container path"])
    problem = None if timeout is None else seconds_problem(timeout, MAX_TIMEOUT_S)
    if problem:
        raise PolicyError([f"Cannot run with timeout: {problem}; give more than 0, at most a week"])
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return ExecRequest(command, user, merged, cwd, timeout, data, cap)


def run_exec(
    engine: Containers,
    container_id: str,
    argv: str | Sequence[str],
    *,
    user: str,
    base_env: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    stdin: bytes | str | None = None,
    on_output: OutputCallback | None = None,
    cap: int = DEFAULT_CAP,
) -> ExecResult:
    """Run ``argv`` in a running container as ``user``: :func:`exec_request`'s checks,
    then :func:`exec_in`. ``on_output(stream, chunk)`` sees the output as it comes."""
    request = exec_request(
        argv, user=user, base_env=base_env, env=env, cwd=cwd, timeout=timeout, stdin=stdin, cap=cap
    )
    return exec_in(engine, container_id, request, on_output)


def exec_in(
    engine: Containers,
    container_id: str,
    request: ExecRequest,
    on_output: OutputCallback | None = None,
) -> ExecResult:
    """Run a checked command in a running container (see the module docstring): with a
    timeout, the command's whole process group is killed when it outlives it."""
    user, timeout = request.user, request.timeout
    wrapped = ["/bin/sh", "-c", WRAPPER, "sh", request.cwd or "", *request.argv]
    started = time.monotonic()
    handle = engine.exec(container_id, wrapped, user=user, env=request.env, stdin=request.stdin)
    reader = _Reader(handle, request.cap, on_output)
    thread = threading.Thread(target=reader.run, name=f"exec-{container_id[:12]}", daemon=True)
    thread.start()
    try:
        finished = reader.done.wait(timeout=timeout)
    except BaseException:  # Ctrl-C while waiting: the command does not outlive its caller
        _kill_group(engine, container_id, user, reader)
        raise
    if not finished:
        _kill_group(engine, container_id, user, reader)
        reader.done.wait(timeout=KILL_GRACE_S)
    if reader.error is not None:  # the callback failed: the command does not run on unread
        # Stop reading first: under gVisor, a command blocked on output nobody reads holds
        # up the engine's other execs into that container, the kill's among them.
        close = getattr(handle.frames, "close", None)
        if close is not None:
            close()
        if finished:
            _kill_group(engine, container_id, user, reader)
        raise reader.error
    duration = round(time.monotonic() - started, 3)
    if finished:
        code = _exit_code(handle)
        exit_code = -1 if code is None else code
        died_of = _signal_of(exit_code)
    else:
        exit_code, died_of = Exit.TIMEOUT, int(signals.SIGKILL)
    out, err = reader.captures["stdout"], reader.captures["stderr"]
    return ExecResult(
        argv=request.argv,
        exit_code=exit_code,
        signal=died_of,
        stdout=out.text(),
        stderr=err.text(),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        duration_s=duration,
        timed_out=not finished,
    )


#: How long the engine may take to record an exec's exit code once its output has ended.
#: Half a second (what this was) is short for a busy engine: the command is then reported
#: as exit -1, and a session's existence probe reads that as "absent".
EXIT_CODE_WAIT_S = 10.0


def _exit_code(handle: ExecHandle) -> int | None:
    """The exit code; the engine may record it a moment after the output has ended."""
    deadline = time.monotonic() + EXIT_CODE_WAIT_S
    while True:
        try:
            code = handle.exit_code()
        except StartFailure as exc:  # even the wrapper shell could not start
            return exc.code
        if code is not None or time.monotonic() > deadline:
            return code
        time.sleep(0.01)


def _kill_group(engine: Containers, container_id: str, user: str, reader: _Reader) -> None:
    """Kill the command's process group (nothing else of the session's)."""
    reader.pid_known.wait(timeout=KILL_GRACE_S)  # printed before the command even starts
    if reader.pid is None:
        return
    kill = ["/bin/sh", "-c", KILL_GROUP, str(reader.pid)]
    drain(engine.exec(container_id, kill, user=user, env=TOOL_ENV))
