"""Egress credential cost: a trivial allowlisted worker with and without an egress credential.

Runs through the Python API in one process, interleaved, N cold runs each (runc; the
allowlist proxy is started once before measuring), then the hand-out of a pooled run with
the credential. Target (issue 18): cold ≤ +300 ms, pooled ≈ 0. See docs/performance.md.

    python bench/credproxy_bench.py [--runs 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator import DockerEngine, Orchestrator

PROJECT = """zones: {}
isolation: {untrusted: runc}
credentials:
  llm: {source: env, env: BENCH_CREDENTIAL, egress: {hosts: [bench.example.org]}}
"""
ALLOW = "network: {allow: [bench.example.org]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    os.environ["BENCH_CREDENTIAL"] = "sk-bench-" + os.urandom(12).hex()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "workers").mkdir()
        (root / "orchestrator.yaml").write_text(PROJECT)
        for name, extra in (("plain", ""), ("credential", "\nsecrets: [llm]")):
            front = f'command: ["true"]\n{ALLOW}{extra}\n'
            (root / "workers" / f"{name}.worker").write_text(f"---\n{front}---\n")
        with Orchestrator(root, engine=DockerEngine()) as orch:
            times: dict[str, list[float]] = {"plain": [], "credential": []}
            for name in times:  # warm up: image caches, the allowlist's proxy
                orch.run(name)
            for _ in range(args.runs):
                for name, seen in times.items():
                    start = time.monotonic()
                    result = orch.run(name)
                    seen.append(time.monotonic() - start)
                    assert result.exit_code == 0, result.error
            for name, seen in times.items():
                print(f"{name:<11} cold  median {statistics.median(seen) * 1000:6.0f} ms")
            with orch.pool("credential", size=1) as pool:
                time.sleep(10)  # let the pool open its run, proxy included
                start = time.monotonic()
                run = pool.take()
                took = time.monotonic() - start
                run.run_worker()
                run.collect()
                run.close()
            print(f"credential  pooled take()  {took * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
