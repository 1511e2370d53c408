"""Benchmark a session's exec of ``true`` against raw ``docker exec`` on the same container.

Run with ``python bench/session_bench.py`` (``--help`` for options). It starts one hardened
worker container as a session does (a temporary project, ``prepare``, an outbox so the
container's own process only idles), then times, interleaved round by round so that drift
in the engine's load hits each the same:

a. the Docker SDK's low-level ``exec_create`` + ``exec_start`` + ``exec_inspect`` (the
   baseline: what any client needs to learn an exit code);
b. the ``docker exec`` command line;
c. :func:`orchestrator.runtime.execs.run_exec` (its ``/bin/sh`` wrapper, both streams
   captured, the exit code read).

It prints p50/p95 of each and the ratios to the SDK baseline; the target is run_exec's p50
at most 1.3x the baseline's.

Then, through the public API (:meth:`orchestrator.Orchestrator.open_session`):

- session open: ``open_session`` then ``close`` of a small worker, against the raw
  create + start + remove of a container of the same image through the SDK;
- 1 MB ``Session.write`` and ``Session.read`` of a file in a rw zone, against a plain
  Python write and read of 1 MB on the host.

Every container, session and the project are removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator import Orchestrator
from orchestrator.config import load_project, load_worker
from orchestrator.docker import DockerEngine
from orchestrator.policy import worker_identity
from orchestrator.prepare import prepare
from orchestrator.runtime.execs import run_exec
from orchestrator.runtime.host_folders import make_host_folders

TARGET_RATIO = 1.3
MB = 1 << 20


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50, help="rounds (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument(
        "--open-iterations", type=int, default=10, help="session opens timed (default 10)"
    )
    args = parser.parse_args()

    engine = DockerEngine()
    root = Path(tempfile.mkdtemp(prefix="session-bench-"))
    container_id: str | None = None
    try:
        (root / "workers").mkdir()
        (root / "orchestrator.yaml").write_text("zones: {}\n")
        (root / "workers" / "w.worker").write_text('---\ncommand: ["true"]\nsandbox: {}\n---\n')
        loaded = load_project(root)
        prepared = prepare(loaded, load_worker(loaded, "w"))
        spec = prepared.spec
        make_host_folders(prepared)
        container_id = engine.create(spec)
        engine.start(container_id)
        cid = container_id
        api = engine.api

        def sdk() -> None:
            exec_id = api.exec_create(cid, ["true"], user=spec.user)["Id"]
            api.exec_start(exec_id)
            assert api.exec_inspect(exec_id)["ExitCode"] == 0

        def cli() -> None:
            subprocess.run(["docker", "exec", "-u", spec.user, cid, "true"], check=True)

        def ours() -> None:
            result = run_exec(engine, cid, ["true"], user=spec.user, base_env=spec.env)
            assert result.exit_code == 0, result.stderr

        ways: dict[str, Callable[[], None]] = {
            "docker SDK exec": sdk,
            "docker exec CLI": cli,
            "run_exec": ours,
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for round_ in range(args.warmup + args.iterations):
            for name, way in ways.items():
                started = time.perf_counter()
                way()
                if round_ >= args.warmup:
                    times[name].append(time.perf_counter() - started)

        base = statistics.median(times["docker SDK exec"])
        base95 = percentile(times["docker SDK exec"], 0.95)
        print(f"exec of `true`, {args.iterations} iterations each (ms)")
        print(f"{'':18} {'p50':>8} {'p95':>8} {'p50 ratio':>10} {'p95 ratio':>10}")
        for name, values in times.items():
            p50, p95 = statistics.median(values), percentile(values, 0.95)
            ms = f"{p50 * 1e3:8.1f} {p95 * 1e3:8.1f}"
            print(f"{name:18} {ms} {p50 / base:9.2f}x {p95 / base95:9.2f}x")
        ratio = statistics.median(times["run_exec"]) / base
        verdict = "meets" if ratio <= TARGET_RATIO else "misses"
        print(
            f"run_exec p50 is {ratio:.2f}x the SDK baseline: {verdict} the {TARGET_RATIO}x target"
        )
    finally:
        if container_id is not None:
            engine.remove(container_id)
            container_id = None
        shutil.rmtree(root, ignore_errors=True)
    bench_session(engine, args.open_iterations, args.iterations)
    print("\nA text read returns at most 256 KiB (the default cap) but counts every line.")


def table(title: str, times: dict[str, list[float]], base_name: str) -> None:
    base = statistics.median(times[base_name])
    base95 = percentile(times[base_name], 0.95)
    print(f"\n{title} (ms)")
    print(f"{'':32} {'p50':>8} {'p95':>8} {'p50 ratio':>10} {'p95 ratio':>10}")
    for name, values in times.items():
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        ms = f"{p50 * 1e3:8.1f} {p95 * 1e3:8.1f}"
        print(f"{name:32} {ms} {p50 / base:9.2f}x {p95 / base95:9.2f}x")


def bench_session(engine: DockerEngine, opens: int, iterations: int) -> None:
    """Session open, and 1 MB read/write through the Session API, against raw baselines."""
    root = Path(tempfile.mkdtemp(prefix="session-bench-"))
    try:
        (root / "workers").mkdir()
        (root / "work").mkdir()
        (root / "orchestrator.yaml").write_text("zones:\n  work: {path: work, mode: rw}\n")
        (root / "workers" / "w.worker").write_text(
            '---\ncommand: ["true"]\ntrust: session\n'
            "sandbox: {zones: [{name: work, mode: rw}]}\n---\n"
        )
        if os.geteuid() == 0:  # as root, the worker runs as a uid of the project's own
            os.chown(root / "work", *worker_identity(root))
        orch = Orchestrator(root, engine=engine)
        image = orch.prepare("w").spec.image
        api = engine.api

        def raw_open() -> None:
            config = api.create_host_config(network_mode="none")
            cid = api.create_container(
                image, ["sleep", "600"], user="65534:65534", host_config=config
            )["Id"]
            try:
                api.start(cid)
            finally:
                api.remove_container(cid, force=True)

        def session_open() -> None:
            orch.open_session("w").close()

        opening: dict[str, list[float]] = {"docker create+start+rm": [], "open_session+close": []}
        for round_ in range(1 + opens):  # one untimed round first
            for name, way in zip(opening, (raw_open, session_open), strict=True):
                started = time.perf_counter()
                way()
                if round_:
                    opening[name].append(time.perf_counter() - started)
        table(f"session open, {opens} iterations each", opening, "docker create+start+rm")

        data = os.urandom(MB)
        host_file = root / "host.bin"
        files: dict[str, list[float]] = {
            "host write 1 MB": [],
            "Session.write 1 MB": [],
            "host read 1 MB": [],
            "Session.read 1 MB": [],
        }
        with orch.open_session("w") as session:

            def host_write() -> None:
                host_file.write_bytes(data)

            def host_read() -> None:
                assert len(host_file.read_bytes()) == MB

            def session_write() -> None:
                session.write("/work/bench.bin", data)

            def session_read() -> None:
                session.read("/work/bench.bin")  # binary: answered with its size and a note

            ways = (host_write, session_write, host_read, session_read)
            for round_ in range(5 + iterations):
                for name, way in zip(files, ways, strict=True):
                    started = time.perf_counter()
                    way()
                    if round_ >= 5:
                        files[name].append(time.perf_counter() - started)
        text = "x" * 99 + "\n"
        text_times: dict[str, list[float]] = {
            "host read 1 MB": [],
            "Session.read 1 MB (256 KiB back)": [],
        }
        with orch.open_session("w") as session:
            session.write("/work/text.txt", text * (MB // len(text)))
            text_file = root / "work" / "text.txt"
            for round_ in range(5 + iterations):
                started = time.perf_counter()
                text_file.read_text()
                middle = time.perf_counter()
                session.read("/work/text.txt", limit=100_000)
                if round_ >= 5:
                    text_times["host read 1 MB"].append(middle - started)
                    text_times["Session.read 1 MB (256 KiB back)"].append(
                        time.perf_counter() - middle
                    )
        writes = {k: v for k, v in files.items() if "write" in k}
        reads = {k: v for k, v in files.items() if "read" in k}
        table(f"1 MB write, {iterations} iterations each", writes, "host write 1 MB")
        table(f"1 MB read of random bytes, {iterations} iterations each", reads, "host read 1 MB")
        table(
            f"1 MB text (10486 lines), {iterations} iterations each", text_times, "host read 1 MB"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
