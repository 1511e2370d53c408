"""Execs under load (issue 28): sessions at once writing files through the file API and
reading them back with ``cat`` in the sandbox, every output checked byte for byte, under
runc and gVisor; and the cause of the lost output, made to happen every time: a client that
reads the exec's response late finds the command's whole output in the response's buffer.

``bench/exec_load_bench.py`` runs the full size (12 sessions x 120 rounds)."""

from __future__ import annotations

import http.client
import threading
import time

import pytest

from orchestrator import Orchestrator
from orchestrator.docker import execframes
from orchestrator.runtime.session import Session

pytestmark = pytest.mark.docker

SESSIONS = 6
#: Rounds per session at most, and the time the rounds may take (the whole suite runs on 2
#: cores in under 30 minutes; the forced test below catches the cause every time).
ROUNDS = 250
BUDGET_S = 15.0
#: Fewer execs than this and the load proved nothing (about 7 a second ran on a 2-core
#: machine shared with other work; many more on a quiet one).
MIN_EXECS = 40
#: File sizes cycled through: small ones (their output comes in one frame, with the pid
#: line), one past the HTTP response's 8 KiB buffer, one of several frames.
SIZES = (0, 1, 40, 300, 2000, 9000, 70000)


@pytest.fixture
def work_project(project, isolation):
    project.zone("work", "rw")
    project.worker(
        "w", 'command: ["true"]\ntrust: session\nsandbox: {zones: [{name: work, mode: rw}]}'
    )
    return project


def content(session: int, round_: int) -> str:
    """Unique per session and round (a stale view of an earlier file shows), any size."""
    head = f"session {session} round {round_}\n"
    size = SIZES[round_ % len(SIZES)]
    return head + "".join(chr(33 + (session * 7 + round_ + i) % 94) for i in range(size))


def test_every_exec_output_arrives_whole_under_load(engine, work_project):
    orch = Orchestrator(work_project.root, engine=engine)
    sessions: list[Session] = []
    problems: list[str] = []
    counts = [0] * SESSIONS
    deadline = time.monotonic() + BUDGET_S
    try:
        for _ in range(SESSIONS):
            sessions.append(orch.open_session("w"))

        def drive(n: int, session: Session) -> None:
            try:
                for r in range(ROUNDS):
                    if time.monotonic() > deadline:
                        return
                    path = f"/work/s{n}-{r % 3}.txt"
                    text = content(n, r)
                    session.write(path, text)
                    read = session.read_bytes(path, 1 << 20)
                    fed = r % 4 == 3  # the stdin path too: the same bytes fed to cat
                    result = session.exec("cat", stdin=text) if fed else session.exec(f"cat {path}")
                    counts[n] += 1
                    got = (result.exit_code, result.stdout, result.stderr)
                    if got != (0, text, "") or read != text.encode():
                        problems.append(
                            f"session {n} round {r}: exit {result.exit_code}, "
                            f"{len(result.stdout)} of {len(text)} bytes, stderr "
                            f"{result.stderr[:200]!r}"
                        )
            except Exception as exc:  # noqa: BLE001 - reported by the test below
                problems.append(f"session {n}: {type(exc).__name__}: {exc}")

        threads = [
            threading.Thread(target=drive, args=(n, s), name=f"load-{n}")
            for n, s in enumerate(sessions)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for session in sessions:
            session.close()
    print(f"{sum(counts)} execs in {SESSIONS} sessions")
    assert not problems, f"{len(problems)} of {sum(counts)} execs went wrong: {problems[:5]}"
    assert sum(counts) >= MIN_EXECS, f"only {sum(counts)} execs ran in {BUDGET_S:g} s"


def test_output_read_with_the_response_headers_is_kept(engine, work_project, monkeypatch):
    """The cause, every time: the client reads the start response's headers only after the
    command has written its output (a busy client; here a pause), so the HTTP response's
    buffer holds the output along with the headers. It was lost; it must be kept."""
    orch = Orchestrator(work_project.root, engine=engine)
    with orch.open_session("w") as session:
        session.write("/work/late.txt", "read late\n")
        begin = http.client.HTTPResponse.begin
        ahead: list[bytes] = []
        read_ahead = execframes.read_ahead

        def late(self: http.client.HTTPResponse) -> None:
            if self._method == "POST":  # type: ignore[attr-defined]
                time.sleep(1.0)
            begin(self)

        def counted(sock: object) -> bytes:
            got = read_ahead(sock)
            ahead.append(got)
            return got

        monkeypatch.setattr(http.client.HTTPResponse, "begin", late)
        monkeypatch.setattr(execframes, "read_ahead", counted)
        results = [session.exec("cat /work/late.txt") for _ in range(2)]
        fed = session.exec("cat", stdin="fed late\n")
        monkeypatch.undo()  # closing reads its responses in time
    assert [(r.exit_code, r.stdout, r.stderr) for r in results] == [(0, "read late\n", "")] * 2
    assert (fed.exit_code, fed.stdout, fed.stderr) == (0, "fed late\n", "")
    # the case really happened: the output (after the wrapper's pid line) was in the buffer
    assert any(b"read late\n" in got for got in ahead), ahead
