"""Run overhead: `orchestrator run` of a trivial worker against plain `docker run --rm`.

Both run the same image with the same hardening, interleaved, N times each, under runc
(the project opts its untrusted worker into runc) and, when the engine has the gVisor
runtimes, under gVisor too (the default for untrusted workers); the script prints the
medians, their ratios, gVisor's cost over runc, and the start-up time of
`orchestrator --help`. A third runc column runs the same command through a fork server
(`orchestrator serve`, started here in a private XDG_RUNTIME_DIR; docs/server.md); the
plain column sets ORCHESTRATOR_NO_SERVER=1. Targets: ratio <= 1.5 alone, <= 1.2 through
the server; --help under 150 ms. Every command runs with its bytecode written (the warm-up
run writes it; PYTHONDONTWRITEBYTECODE is dropped): an installed package has it.

    python bench/run_bench.py [--runs 20] [--no-gvisor]
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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

IMAGE = "orchestrator/worker:latest"


def timed(command: list[str], env: dict[str, str] | None = None) -> float:
    env = {k: v for k, v in (os.environ if env is None else env).items()
           if k != "PYTHONDONTWRITEBYTECODE"}  # fmt: skip
    started = time.perf_counter()
    subprocess.run(
        command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    return time.perf_counter() - started


@contextmanager
def fork_server(runtime: Path) -> Iterator[dict[str, str]]:
    """`orchestrator serve` in a private runtime folder; the environment that reaches it."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "ORCHESTRATOR_NO_SERVER": ""}
    server = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve"], env=env,
                              stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while not (runtime / "orchestrator" / "server.sock").exists():
            if server.poll() is not None:
                raise SystemExit("orchestrator serve did not start")
            time.sleep(0.05)
        yield env
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator", "serve", "--stop"], env=env,
                       check=False, stderr=subprocess.DEVNULL)  # fmt: skip
        server.wait(timeout=60)


def gvisor_ready() -> bool:
    """Whether the engine has the runtime `orchestrator engine setup --gvisor` declares."""
    from orchestrator.docker.client import DockerClient
    from orchestrator.docker.runtimes import GVISOR_ARGS, engine_runtimes

    return set(GVISOR_ARGS) <= set(engine_runtimes(DockerClient()))


def library_runs(project: Path, runs: int) -> list[float]:
    """The same run through the Python API in one process: no interpreter start, no imports."""
    from orchestrator import Orchestrator

    orch = Orchestrator(project)
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        result = orch.run("noop")
        times.append(time.perf_counter() - started)
        assert result.exit_code == 0 and result.container_removed
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-gvisor", action="store_true", help="Measure runc only.")
    args = parser.parse_args()
    gvisor = not args.no_gvisor and gvisor_ready()

    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="orch-bench-"))
        served_env = stack.enter_context(fork_server(Path(tmp)))
        alone = {**os.environ, "ORCHESTRATOR_NO_SERVER": "1"}
        project = Path(tmp) / "runc"
        sandboxed = Path(tmp) / "gvisor"
        for folder, extra in ((project, "isolation: {untrusted: runc}\n"), (sandboxed, "")):
            (folder / "workers").mkdir(parents=True)
            (folder / "orchestrator.yaml").write_text("zones: {}\n" + extra)
            (folder / "workers" / "noop.worker").write_text('---\ncommand: ["true"]\n---\n')
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
        # gVisor: the runtime and seccomp variant the adapter picks for `network: none`.
        from orchestrator.docker.runtimes import GVISOR_NONE
        from orchestrator.docker.seccomp import profile_text
        from orchestrator.plan import SECCOMP_PROFILE

        profile = Path(tmp) / "seccomp.json"
        profile.write_text(profile_text(SECCOMP_PROFILE, gvisor=True))
        plain_gvisor = [*plain[:3], "--runtime", GVISOR_NONE, "--security-opt",
                        f"seccomp={profile}", *plain[3:]]  # fmt: skip
        ours_gvisor = [*orchestrator, "run", "noop", "--project", str(sandboxed)]
        commands = [(plain, alone), (ours, alone), (ours, served_env)]
        commands += [(plain_gvisor, alone), (ours_gvisor, alone)] if gvisor else []
        commands += [(ours_gvisor, served_env)] if gvisor else []
        for command, env in commands:  # warm caches once
            timed(command, env)
        times: list[list[float]] = [[] for _ in commands]
        for _ in range(args.runs):
            for (command, env), seen in zip(commands, times, strict=True):
                seen.append(timed(command, env))
        a, b, served = times[0], times[1], times[2]
        help_times = [timed([*orchestrator, "--help"], alone) for _ in range(args.runs)]
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
    print(f"ratio orchestrator/docker:   {med_b / med_a:.2f}  (target <= 1.5)")
    med_s = statistics.median(served)
    print(f"orchestrator run, fork server: median {med_s * 1000:7.1f} ms  "
          f"(min {min(served) * 1000:.1f}, max {max(served) * 1000:.1f}); ratio to docker run "
          f"{med_s / med_a:.2f}  (target <= 1.2)")  # fmt: skip
    print(f"  of which interpreter start + imports: ~{(med_b - med_c) * 1000:.0f} ms")
    print(f"library Orchestrator.run() in-process: median {med_c * 1000:7.1f} ms  "
          f"ratio to docker run {med_c / med_a:.2f}")  # fmt: skip
    print(f"orchestrator --help:         median {statistics.median(help_times) * 1000:7.1f} ms"
          "  (target < 150 ms)")  # fmt: skip
    if not gvisor:
        print("gVisor: not measured (--no-gvisor, or no gVisor runtime: "
              "`sudo orchestrator engine setup --gvisor`)")  # fmt: skip
        return
    c, d, e = times[3], times[4], times[5]
    med_pg, med_og, med_sg = statistics.median(c), statistics.median(d), statistics.median(e)
    print(f"docker run --rm under gVisor: median {med_pg * 1000:7.1f} ms  "
          f"(min {min(c) * 1000:.1f}, max {max(c) * 1000:.1f}); +{(med_pg - med_a) * 1000:.0f} ms "
          "over runc")  # fmt: skip
    print(f"orchestrator run under gVisor: median {med_og * 1000:7.1f} ms  "
          f"(min {min(d) * 1000:.1f}, max {max(d) * 1000:.1f}); +{(med_og - med_b) * 1000:.0f} ms "
          f"over runc; ratio to docker run under gVisor {med_og / med_pg:.2f}")  # fmt: skip
    print(f"  the same through the fork server: median {med_sg * 1000:7.1f} ms  "
          f"(min {min(e) * 1000:.1f}, max {max(e) * 1000:.1f}); ratio to docker run under "
          f"gVisor {med_sg / med_pg:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
