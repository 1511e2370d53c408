"""Egress cost: median run time of a trivial worker with an allowlist (warm proxy) vs `none`.

Runs through the Python API in one process, interleaved, N times each; the proxy is started
once before measuring. Target: allowlist ≤ none + 150 ms.

    python bench/network_bench.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator import DockerEngine, Orchestrator, load_project, load_worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    engine = DockerEngine()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "workers").mkdir()
        (root / "orchestrator.yaml").write_text("zones: {}\n")
        (root / "workers" / "closed.worker").write_text('---\ncommand: ["true"]\n---\n')
        (root / "workers" / "listed.worker").write_text(
            '---\ncommand: ["true"]\nnetwork: {allow: [bench.example.org]}\n---\n'
        )
        project = load_project(root)
        orch = Orchestrator(project, engine=engine)
        workers = {name: load_worker(project, name) for name in ("closed", "listed")}
        times: dict[str, list[float]] = {"closed": [], "listed": []}
        for name in workers:  # warm up: image cache, and the proxy for the allowlist
            orch.run(workers[name])
        for _ in range(args.runs):
            for name, worker in workers.items():
                started = time.perf_counter()
                result = orch.run(worker)
                times[name].append(time.perf_counter() - started)
                assert result.exit_code == 0
        engine.collect_shared(idle_seconds=0)
    none, listed = statistics.median(times["closed"]), statistics.median(times["listed"])
    print(f"runs: {args.runs} each, interleaved, in-process")
    print(f"network none:               median {none * 1000:7.1f} ms")
    print(f"allowlist (warm proxy):     median {listed * 1000:7.1f} ms")
    print(f"difference:                 {(listed - none) * 1000:+7.1f} ms  (target <= +150 ms)")


if __name__ == "__main__":
    main()
