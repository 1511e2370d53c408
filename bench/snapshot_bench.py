"""Benchmark pause/resume, snapshots and forks of live sessions (issue #36).

Run with ``python bench/snapshot_bench.py`` (``--help`` for sizes). For each isolation
(runc, gVisor) it opens a session in a throw-away project and measures, through the Python
API (:class:`orchestrator.Orchestrator`):

- ``pause`` and ``resume``: each call, ``--rounds`` times;
- a snapshot of a session holding ``--mib`` MiB of changes in its session folder;
- a fork from that snapshot: from the request to the first command answered in it;
- under gVisor, ``--mib`` MiB written to the root of an ``image_user`` session opened for
  snapshots (root in an image built on the fly), its snapshot (a commit) and a fork.

Figures: median and worst. Targets (the issue's): snapshot of 100 MiB under 3 s; fork p50
under 1 s (gVisor) and 0.6 s (runc); pause and resume under 100 ms each.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator import Orchestrator

WORKER = 'command: ["sleep", "1000"]\ntrust: session\nsandbox: {zones: []}\n'


def _project(folder: Path, isolation: str) -> Path:
    (folder / "workers").mkdir(parents=True)
    levels = ", ".join(f"{t}: {isolation}" for t in ("untrusted", "session", "workspace", "full"))
    (folder / "orchestrator.yaml").write_text(f"zones: {{}}\nisolation: {{{levels}}}\n")
    (folder / "workers" / "w.worker").write_text(f"---\n{WORKER}---\n")
    return folder


def _ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


def bench(isolation: str, rounds: int, mib: int, forks: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        orch = Orchestrator(_project(Path(tmp) / "p", isolation))
        with orch.open_session("w") as session:
            pauses, resumes = [], []
            session.exec("nohup sleep 1000 >/dev/null 2>&1 &")
            for _ in range(rounds):
                started = time.perf_counter()
                session.pause()
                pauses.append(time.perf_counter() - started)
                started = time.perf_counter()
                session.resume()
                resumes.append(time.perf_counter() - started)
            session.exec(f"head -c {mib << 20} /dev/urandom > /session/blob")
            started = time.perf_counter()
            snap = session.snapshot()
            took = time.perf_counter() - started
        opened = []
        for _ in range(forks):
            started = time.perf_counter()
            [fork] = snap.fork(1)
            fork.exec("true")
            opened.append(time.perf_counter() - started)
            fork.close()
        orch.remove_snapshot(snap.id)
        print(f"{isolation}: pause {_ms(pauses)}; resume {_ms(resumes)}")
        print(f"{isolation}: snapshot of {mib} MiB: {took:.2f} s ({snap.bytes >> 20} MiB kept)")
        print(f"{isolation}: fork to first command: {_ms(opened)} ({forks} forks)")


def bench_root(mib: int) -> None:
    """gVisor, ``image_user`` (root) opened for snapshots: ``mib`` MiB written to the root,
    then a snapshot (a commit of the container's layer)."""
    import io
    import tarfile

    from orchestrator.docker import DockerEngine

    engine = DockerEngine()
    tag = "orchestrator-bench/snap-root:latest"
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        data = b"FROM orchestrator/worker:latest\nUSER root\n"
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    for _ in engine.api.build(fileobj=context, custom_context=True, tag=tag, rm=True):
        pass
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = _project(Path(tmp) / "p", "gvisor")
            worker = WORKER + f"image: {tag}\nimage_user: true\n"
            (folder / "workers" / "w.worker").write_text(f"---\n{worker}---\n")
            orch = Orchestrator(folder, engine=engine)
            with orch.open_session("w", snapshots=True) as session:
                session.exec(f"head -c {mib << 20} /dev/urandom > /opt/blob")
                started = time.perf_counter()
                snap = session.snapshot()
                took = time.perf_counter() - started
            started = time.perf_counter()
            [fork] = snap.fork(1)
            fork.exec("true")
            forked = time.perf_counter() - started
            fork.close()
            orch.remove_snapshot(snap.id)
        print(f"gvisor image_user: snapshot of {mib} MiB in the root: {took:.2f} s "
              f"({snap.bytes >> 20} MiB kept); fork to first command {forked:.2f} s")  # fmt: skip
    finally:
        engine.api.remove_image(tag, force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--forks", type=int, default=7)
    parser.add_argument("--isolation", choices=["runc", "gvisor", "both"], default="both")
    args = parser.parse_args()
    for isolation in ("runc", "gvisor") if args.isolation == "both" else (args.isolation,):
        bench(isolation, args.rounds, args.mib, args.forks)
    if args.isolation != "runc":
        bench_root(args.mib)


if __name__ == "__main__":
    main()
