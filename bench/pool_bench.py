"""Warm pool: request → the worker's first instruction, p50/p95, against a cold start.

The worker's first instruction prints the clock (``date +%s%N``; the container reads the
host's clock). A request is timed from just before :meth:`WarmPool.take` (warm) or
:meth:`Orchestrator.run` (cold) to that printed time. Rounds are interleaved so drift in
the engine's load hits each kind the same; before each warm request the pool is full again
(its refill runs while the previous run is used and removed, as it would between requests).

- cold: ``Orchestrator.run`` of a trivial worker, ``network: none``;
- warm, ``network: none``: ``pool.take()`` then ``run.run_worker()``;
- warm, allowlist: the same worker with an allowlist (its own network and the proxy attached
  ahead of need, by the pool).

Targets: warm p50 ≤ 100 ms; warm allowlisted minus warm ``none`` ≤ +150 ms. Everything the
bench makes (containers, networks, the allowlist's proxy, the project) is removed at the end.

    python bench/pool_bench.py [--rounds 30] [--size 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator import DockerEngine, Orchestrator
from orchestrator.docker import egress as eg
from orchestrator.docker import egress_gc
from orchestrator.runtime.pool import WarmPool
from orchestrator.runtime.run import RunResult

WORKER = '---\ncommand: ["/bin/sh", "-c", "date +%s%N"]\ntrust: session\nsandbox: {}\n'
TARGET_WARM_MS = 100.0
TARGET_ALLOWLIST_MS = 150.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_ms(started_ns: int, result: RunResult) -> float:
    assert result.exit_code == 0, result
    return (int(result.stdout.split()[0]) - started_ns) / 1e6


def warm(pool: WarmPool) -> float:
    assert pool.wait_ready(120), "the pool did not fill"
    started = time.time_ns()
    run = pool.take()
    try:
        run.run_worker()
        run.collect()
    finally:
        result = run.close()
    return latency_ms(started, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="requests of each kind")
    parser.add_argument("--size", type=int, default=2, help="pool size (default 2)")
    args = parser.parse_args()
    engine = DockerEngine()
    host = f"bench-{os.getpid()}.test"  # an allowlist (and so a proxy) of the bench's own
    key = eg.allowlist_key(eg.validate_allowlist([host]))
    root = Path(tempfile.mkdtemp(prefix="pool-bench-"))
    try:
        (root / "workers").mkdir()
        (root / "orchestrator.yaml").write_text("zones: {}\n")
        (root / "workers" / "closed.worker").write_text(WORKER + "---\n")
        (root / "workers" / "listed.worker").write_text(
            WORKER + f"network: {{allow: [{host}]}}\n---\n"
        )
        orch = Orchestrator(root, engine=engine)
        with (
            orch.pool("closed", size=args.size) as closed,
            orch.pool("listed", size=args.size) as listed,
        ):
            kinds: dict[str, Callable[[], float]] = {
                "cold": lambda: latency_ms(time.time_ns(), orch.run("closed")),
                "warm none": lambda: warm(closed),
                "warm allowlist": lambda: warm(listed),
            }
            for measure in kinds.values():  # warm up: image cache, proxy, first imports
                measure()
            times: dict[str, list[float]] = {name: [] for name in kinds}
            for _ in range(args.rounds):
                for name, measure in kinds.items():
                    times[name].append(measure())
    finally:
        egress_gc.remove_egress(engine, key)
        shutil.rmtree(root, ignore_errors=True)
    print(f"request -> worker's first instruction, {args.rounds} interleaved rounds each")
    for name, values in times.items():
        p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
        print(f"{name:16} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")
    warm_p50 = percentile(times["warm none"], 0.5)
    extra = percentile(times["warm allowlist"], 0.5) - warm_p50
    print(f"warm none p50 {warm_p50:.1f} ms (target <= {TARGET_WARM_MS:.0f} ms)")
    print(f"allowlist - none, warm, p50: {extra:+.1f} ms (target <= +{TARGET_ALLOWLIST_MS:.0f} ms)")
    cold = percentile(times["cold"], 0.5)
    print(f"cold / warm p50: {cold / warm_p50:.1f}x")


if __name__ == "__main__":
    main()
