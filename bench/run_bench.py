"""Run overhead: `orchestrator run` of a trivial worker against plain `docker run --rm`.

Both run the same image with the same hardening, interleaved, N times each; the script
prints the medians and their ratio, and the start-up time of `orchestrator --help`.
Targets: ratio <= 1.05; --help under 150 ms.

    python bench/run_bench.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMAGE = "orchestrator/worker:latest"


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def library_runs(project: Path, runs: int) -> list[float]:
    """The same run through the Python API in one process: no interpreter start, no imports."""
    from orchestrator import DockerEngine, execute, load_project, load_worker, prepare

    engine = DockerEngine()
    loaded = load_project(project)
    worker = load_worker(loaded, "noop")
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        result = execute(engine, prepare(loaded, worker))
        times.append(time.perf_counter() - started)
        assert result.exit_code == 0 and result.container_removed
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "workers").mkdir()
        (project / "orchestrator.yaml").write_text("zones: {}\n")
        (project / "workers" / "noop.worker").write_text('---\ncommand: ["true"]\n---\n')
        orchestrator = [sys.executable, "-m", "orchestrator"]
        uid = os.getuid() or 65534
        plain = [
            "docker", "run", "--rm", "--network", "none", "--read-only",
            "--tmpfs", "/tmp:rw,nosuid,nodev,size=67108864,mode=1777",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
            "--pids-limit", "256", "--memory", "512m", "--memory-swap", "512m",
            "--cpus", "1", "--init", "--user", f"{uid}:{uid}", "--ipc", "private",
            IMAGE, "true",
        ]  # fmt: skip
        ours = [*orchestrator, "run", "noop", "--project", str(project)]
        for command in (plain, ours):  # warm caches once
            timed(command)
        a, b = [], []
        for _ in range(args.runs):
            a.append(timed(plain))
            b.append(timed(ours))
        help_times = [timed([*orchestrator, "--help"]) for _ in range(args.runs)]
        library = library_runs(project, args.runs)

    med_a, med_b = statistics.median(a), statistics.median(b)
    med_c = statistics.median(library)
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}")  # fmt: skip
    print(f"runs: {args.runs} each, interleaved")
    print(f"docker run --rm (hardened):  median {med_a * 1000:7.1f} ms  "
          f"(min {min(a) * 1000:.1f}, max {max(a) * 1000:.1f})")  # fmt: skip
    print(f"orchestrator run:            median {med_b * 1000:7.1f} ms  "
          f"(min {min(b) * 1000:.1f}, max {max(b) * 1000:.1f})")  # fmt: skip
    print(f"ratio orchestrator/docker:   {med_b / med_a:.2f}  (target <= 1.05)")
    print(f"  of which interpreter start + imports: ~{(med_b - med_c) * 1000:.0f} ms")
    print(f"library execute() in-process: median {med_c * 1000:7.1f} ms  "
          f"ratio to docker run {med_c / med_a:.2f}")  # fmt: skip
    print(f"orchestrator --help:         median {statistics.median(help_times) * 1000:7.1f} ms"
          "  (target < 150 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
