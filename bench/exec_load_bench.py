"""Execs under load: sessions at once writing files and reading them back with ``cat``.

Run with ``python bench/exec_load_bench.py`` (``--help`` for options; the default is the
size of issue 28: 12 sessions x 120 rounds, under runc then gVisor). Each session, in its
own thread, repeats: write a file through the session's file API (a new content each round,
of a size from a few bytes to 70 KB), read it back from the host, and ``cat`` it in the
sandbox (every fourth round: feed it to ``cat`` on stdin instead). Every output is checked
byte for byte, with its exit code and an empty stderr.

Printed per isolation: execs, wall time and execs per second, outputs that went wrong, and
how many execs had output already in the HTTP response's buffer when its headers were read
(what the SDK's own exec stream lost: an exec with exit 0 and no output; these are kept now,
see ``orchestrator/docker/execframes.py``). Sessions and the project are removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from orchestrator import Orchestrator
from orchestrator.config.models import TRUST_ORDER
from orchestrator.docker import DockerEngine, execframes
from orchestrator.runtime.session import Session

SIZES = (0, 1, 40, 300, 2000, 9000, 70000)


def content(session: int, round_: int) -> str:
    head = f"session {session} round {round_}\n"
    size = SIZES[round_ % len(SIZES)]
    return head + "".join(chr(33 + (session * 7 + round_ + i) % 94) for i in range(size))


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.execs = 0
        self.ahead = 0
        self.ahead_bytes = 0
        self.problems: list[str] = []


def project(isolation: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix="exec-load-bench-"))
    (root / "workers").mkdir()
    (root / "work").mkdir()
    levels = ", ".join(f"{level}: {isolation}" for level in TRUST_ORDER)
    (root / "orchestrator.yaml").write_text(
        f"zones:\n  work: {{path: work, mode: rw}}\nisolation: {{{levels}}}\n"
    )
    (root / "workers" / "w.worker").write_text(
        '---\ncommand: ["true"]\ntrust: session\nsandbox: {zones: [{name: work, mode: rw}]}\n---\n'
    )
    return root


def drive(n: int, session: Session, rounds: int, counts: Counts) -> None:
    try:
        for r in range(rounds):
            path = f"/work/s{n}-{r % 3}.txt"
            text = content(n, r)
            session.write(path, text)
            read = session.read_bytes(path, 1 << 20)
            fed = r % 4 == 3  # the stdin path too: the same bytes fed to cat
            result = session.exec("cat", stdin=text) if fed else session.exec(f"cat {path}")
            got = (result.exit_code, result.stdout, result.stderr)
            with counts.lock:
                counts.execs += 1
                if got != (0, text, "") or read != text.encode():
                    counts.problems.append(
                        f"session {n} round {r}: exit {result.exit_code}, "
                        f"{len(result.stdout)} of {len(text)} bytes, "
                        f"stderr {result.stderr[:120]!r}, host read ok: {read == text.encode()}"
                    )
    except Exception as exc:  # noqa: BLE001 - counted and printed
        with counts.lock:
            counts.problems.append(f"session {n}: {type(exc).__name__}: {exc}")


def bench(engine: DockerEngine, isolation: str, sessions: int, rounds: int) -> None:
    root = project(isolation)
    counts = Counts()
    read_ahead = execframes.read_ahead

    def counted(sock: object) -> bytes:
        got = read_ahead(sock)
        if got:
            with counts.lock:
                counts.ahead += 1
                counts.ahead_bytes += len(got)
        return got

    execframes.read_ahead = counted
    opened: list[Session] = []
    try:
        orch = Orchestrator(root, engine=engine)
        for _ in range(sessions):
            opened.append(orch.open_session("w"))
        threads = [
            threading.Thread(target=drive, args=(n, s, rounds, counts))
            for n, s in enumerate(opened)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.monotonic() - started
    finally:
        execframes.read_ahead = read_ahead
        for session in opened:
            session.close()
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"{isolation:6} {sessions} sessions x {rounds} rounds: {counts.execs} execs in "
        f"{took:.1f} s ({counts.execs / took:.1f}/s); wrong outputs: {len(counts.problems)}; "
        f"output read with the headers (kept): {counts.ahead} execs, {counts.ahead_bytes} bytes"
    )
    for problem in counts.problems[:10]:
        print(f"  {problem}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12, help="sessions at once (12)")
    parser.add_argument("--rounds", type=int, default=120, help="rounds per session (120)")
    parser.add_argument(
        "--isolation",
        choices=["runc", "gvisor", "both"],
        default="both",
        help="runtime of the sessions (both: runc, then gVisor)",
    )
    args = parser.parse_args()
    engine = DockerEngine()
    for isolation in ["runc", "gvisor"] if args.isolation == "both" else [args.isolation]:
        bench(engine, isolation, args.sessions, args.rounds)


if __name__ == "__main__":
    main()
