"""Batch throughput: `orchestrator batch --concurrency N` against `xargs -P N docker run --rm`.

Both run a trivial command once per input (60 small files by default) in the worker image
with the same hardening, N at a time, under the same runtime (`--runtime gvisor`: the
worker file says `isolation: gvisor`, and `docker run` gets `--runtime` set to the same
runsc runtime the orchestrator picks). The two are interleaved for `--rounds` rounds (the
order alternating), and we print each round's runs/s, the medians, their ratio (targets:
>= 1.1 under runc, >= 1.0 under gVisor) and the orchestrator's peak RSS (target <= 150 MB,
from wait4's rusage of the batch process alone).

    python bench/batch_bench.py [--inputs 60] [--concurrency 4] [--rounds 3]
                                [--runtime runc|gvisor]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMAGE = "orchestrator/worker:latest"
#: The engine runtime the orchestrator picks for gVisor with `network: none`.
GVISOR_NONE = "orchestrator-runsc"


def _timed(argv: list[str], stdin: str) -> tuple[float, int, str]:
    """Run ``argv`` with ``stdin``; (seconds, exit code, stderr tail)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _out, err = proc.communicate(stdin)
    elapsed = time.monotonic() - start
    return elapsed, proc.returncode, err[-2000:]


def _orchestrator(project: Path, inputs: Path, n: int) -> tuple[float, float]:
    """One `orchestrator batch` over ``inputs``: (seconds, peak RSS in MB)."""
    argv = [
        sys.executable, "-m", "orchestrator", "batch", "noop", "--inputs", str(inputs),
        "--concurrency", str(n), "--json", "--project", str(project),
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"orchestrator batch failed ({proc.returncode}): {err[-2000:].decode()}")
    return elapsed, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtime", choices=["runc", "gvisor"], default="runc")
    args = parser.parse_args()
    n, count, gvisor = args.concurrency, args.inputs, args.runtime == "gvisor"
    ours: list[float] = []
    bare: list[float] = []
    rss: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "p"
        (project / "workers").mkdir(parents=True)
        # An untrusted worker runs under gVisor by default: runc is the project's explicit
        # opt-out, so that both sides run the same runtime.
        runc = "" if gvisor else "isolation: {untrusted: runc}\n"
        (project / "orchestrator.yaml").write_text(f"zones: {{}}\n{runc}")
        isolation = "isolation: gvisor\n" if gvisor else ""
        (project / "workers" / "noop.worker").write_text(
            f'---\ncommand: ["true"]\n{isolation}---\n'
        )
        inputs = Path(tmp) / "in"
        inputs.mkdir()
        for i in range(count):
            (inputs / f"doc{i:04d}.txt").write_text(f"document {i}\n")
        uid = 65534
        runtime = f"--runtime {GVISOR_NONE} " if gvisor else ""
        docker = (
            f"docker run --rm {runtime}--network none --read-only "
            f"--tmpfs /tmp:rw,nosuid,nodev,size=67108864,mode=1777 --cap-drop ALL "
            f"--security-opt no-new-privileges:true --pids-limit 256 --memory 512m "
            f"--memory-swap 512m --cpus 1 --init --user {uid}:{uid} --ipc private "
            f"-v {shlex.quote(str(inputs))}:/inputs:ro {IMAGE} true"
        )
        files = "\n".join(str(p) for p in sorted(inputs.iterdir())) + "\n"
        xargs = ["xargs", "-P", str(n), "-I{}", "sh", "-c", docker]
        for round_ in range(args.rounds):
            for which in ("ours", "bare") if round_ % 2 == 0 else ("bare", "ours"):
                if which == "ours":
                    elapsed, peak = _orchestrator(project, inputs, n)
                    ours.append(count / elapsed)
                    rss.append(peak)
                else:
                    elapsed, code, err = _timed(xargs, files)
                    if code != 0:
                        sys.exit(f"xargs docker run failed ({code}): {err}")
                    bare.append(count / elapsed)
            print(
                f"round {round_ + 1}: orchestrator {ours[-1]:6.2f} runs/s, xargs {bare[-1]:6.2f} "
                f"runs/s, ratio {ours[-1] / bare[-1]:.2f}",
                flush=True,
            )
    target = 1.0 if gvisor else 1.1
    ours_m, bare_m = statistics.median(ours), statistics.median(bare)
    print(f"inputs {count}, concurrency {n}, runtime {args.runtime}, image {IMAGE}, ", end="")
    print(f"{os.cpu_count()} CPUs, {args.rounds} interleaved rounds (medians)")
    print(f"xargs -P {n} docker run --rm (hardened): {bare_m:6.2f} runs/s")
    print(f"orchestrator batch --concurrency {n}:    {ours_m:6.2f} runs/s")
    print(f"ratio orchestrator/xargs:               {ours_m / bare_m:.2f}  (target >= {target})")
    print(f"orchestrator peak RSS:                  {max(rss):.0f} MB  (target <= 150 MB)")


if __name__ == "__main__":
    main()
