"""Batch throughput: `orchestrator batch --concurrency N` against `xargs -P N docker run --rm`.

Both run a trivial command once per input (200 small files by default) in the worker image
with the same hardening, N at a time, and we print runs/s of each, their ratio (target
>= 1.0) and the orchestrator's peak RSS (target <= 150 MB, from getrusage
of the child, measured before the shell pipeline runs).

    python bench/batch_bench.py [--inputs 200] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMAGE = "orchestrator/worker:latest"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    n, count = args.concurrency, args.inputs
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "p"
        (project / "workers").mkdir(parents=True)
        (project / "orchestrator.yaml").write_text("zones: {}\n")
        (project / "workers" / "noop.worker").write_text('---\ncommand: ["true"]\n---\n')
        inputs = Path(tmp) / "in"
        inputs.mkdir()
        for i in range(count):
            (inputs / f"doc{i:04d}.txt").write_text(f"document {i}\n")
        uid = 65534
        docker = (
            f"docker run --rm --network none --read-only "
            f"--tmpfs /tmp:rw,nosuid,nodev,size=67108864,mode=1777 --cap-drop ALL "
            f"--security-opt no-new-privileges:true --pids-limit 256 --memory 512m "
            f"--memory-swap 512m --cpus 1 --init --user {uid}:{uid} --ipc private "
            f"-v {shlex.quote(str(inputs))}:/inputs:ro {IMAGE} true"
        )
        files = "\n".join(str(p) for p in sorted(inputs.iterdir())) + "\n"
        start = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "batch",
                "noop",
                "--inputs",
                str(inputs),
                "--concurrency",
                str(n),
                "--json",
                "--project",
                str(project),
            ],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        ours = count / (time.monotonic() - start)
        if done.returncode != 0:
            sys.exit(f"orchestrator batch failed ({done.returncode}): {done.stderr[-2000:]}")
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        start = time.monotonic()
        subprocess.run(
            ["xargs", "-P", str(n), "-I{}", "sh", "-c", docker],
            input=files,
            text=True,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        bare = count / (time.monotonic() - start)
    print(f"inputs {count}, concurrency {n}, image {IMAGE}, {os.cpu_count()} CPUs")
    print(f"xargs -P {n} docker run --rm (hardened): {bare:6.2f} runs/s")
    print(f"orchestrator batch --concurrency {n}:    {ours:6.2f} runs/s")
    print(f"ratio orchestrator/xargs:               {ours / bare:.2f}  (target >= 1.0)")
    print(f"orchestrator peak RSS:                  {rss_mb:.0f} MB  (target <= 150 MB)")


if __name__ == "__main__":
    main()
