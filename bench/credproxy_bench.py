"""Egress credential cost: a trivial allowlisted worker with and without an egress credential.

Runs through the Python API in one process, interleaved, N cold runs each (runc; the
allowlist proxy is started once before measuring), against the raw baseline measured in
the same rounds: the docker SDK's create, start, wait and remove of the same ``true`` in
the worker image. Each credential run starts as a new process would (the in-memory cache
of the worker image's CA bundle emptied: the on-disk one is what a new process finds).
The credential run is measured twice: as it goes when the run before left a spare proxy
ready (the usual case: here one started 3 s before the run), and with no spare (the
first run on a machine, or spares turned
off: ``ORCHESTRATOR_CREDPROXY_SPARES=0`` and none left). Also: how long getting the proxy
serving took (overlapped with the worker's creation), and the hand-out of a pooled run
with the credential. Target (issue 18): cold ≤ +300 ms over the run without the
credential, pooled ≈ 0. See docs/performance.md.

    python bench/credproxy_bench.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import DockerEngine, Orchestrator
from orchestrator.credproxy import proxy_ids
from orchestrator.docker import credproxy_spares
from orchestrator.docker.images import WORKER_IMAGE

PROJECT = """zones: {}
isolation: {untrusted: runc}
credentials:
  llm: {source: env, env: BENCH_CREDENTIAL, egress: {hosts: [bench.example.org]}}
"""
ALLOW = "network: {allow: [bench.example.org]}"


def raw_run(engine: DockerEngine) -> None:
    """The engine's floor: create, start, wait for and remove a container running true."""
    api = engine.api
    created = api.create_container(WORKER_IMAGE, command=["true"], network_disabled=True)
    try:
        api.start(created["Id"])
        api.wait(created["Id"])
    finally:
        api.remove_container(created["Id"], force=True)


def timed(seen: list[float], call: Callable[[], Any]) -> Any:
    start = time.monotonic()
    try:
        return call()
    finally:
        seen.append(time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ["BENCH_CREDENTIAL"] = "sk-bench-" + os.urandom(12).hex()
    engine = DockerEngine()
    proxy_starts: list[float] = []
    start_proxy = engine.start_credential_proxy

    def start_and_time(*a: Any, **k: Any) -> str:
        return str(timed(proxy_starts, lambda: start_proxy(*a, **k)))

    engine.start_credential_proxy = start_and_time  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "workers").mkdir()
        (root / "orchestrator.yaml").write_text(PROJECT)
        for name, extra in (("plain", ""), ("credential", "\nsecrets: [llm]")):
            front = f'command: ["true"]\n{ALLOW}{extra}\n'
            (root / "workers" / f"{name}.worker").write_text(f"---\n{front}---\n")
        with Orchestrator(root, engine=engine) as orch:
            times: dict[str, list[float]] = {k: [] for k in ("raw", "plain", "spare", "none")}
            starts: dict[str, list[float]] = {"spare": [], "none": []}
            user = "{}:{}".format(*proxy_ids())
            raw_run(engine)  # warm up: image caches, the allowlist's proxy
            for name in ("plain", "credential"):
                orch.run(name)
            for _ in range(args.runs):
                timed(times["raw"], lambda: raw_run(engine))
                for kind in ("plain", "spare", "none"):
                    engine.ca_bundles.clear()  # as a new process
                    engine.spares.wait()  # as the run before left it
                    if kind == "none":
                        os.environ[credproxy_spares.ENV_SPARES] = "0"
                        credproxy_spares.remove_spares(engine, 0)
                    if kind == "spare":  # as a run a few seconds before left it
                        credproxy_spares.SparePool.keep_ready(engine, user, 1)
                        time.sleep(3)
                    name = "plain" if kind == "plain" else "credential"
                    proxy_starts.clear()
                    result = timed(times[kind], lambda name=name: orch.run(name))
                    assert result.exit_code == 0, result.error
                    os.environ.pop(credproxy_spares.ENV_SPARES, None)
                    if kind != "plain":
                        starts[kind] += proxy_starts
            median = {name: statistics.median(seen) for name, seen in times.items()}
            print(f"{args.runs} interleaved rounds, medians (ratio to the raw baseline):")
            labels = {
                "raw": "raw docker create/start/wait/rm",
                "plain": "allowlisted run, no credential",
                "spare": "egress credential, a spare ready",
                "none": "egress credential, no spare",
            }
            for name, label in labels.items():
                ratio = median[name] / median["raw"]
                print(f"  {label:<36} {median[name] * 1000:6.0f} ms  {ratio:5.2f} x raw")
            for kind, label in (("spare", "a spare ready"), ("none", "no spare")):
                extra = median[kind] - median["plain"]
                proxy = statistics.median(starts[kind]) * 1000
                print(
                    f"  the credential's cost, {label:<14} {extra * 1000:+6.0f} ms "
                    f"(target +300); its proxy serving after {proxy:4.0f} ms"
                )
            with orch.pool("credential", size=1) as pool:
                time.sleep(10)  # let the pool open its run, proxy included
                start = time.monotonic()
                run = pool.take()
                took = time.monotonic() - start
                run.run_worker()
                run.collect()
                run.close()
            print(f"  pooled take() with the credential      {took * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
