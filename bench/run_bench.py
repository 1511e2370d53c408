"""Run overhead: `orchestrator run` of a trivial worker against plain `docker run --rm`.

Both run the same image with the same hardening, interleaved, N times each, under runc
(the project opts its untrusted worker into runc) and, when the engine has the gVisor
runtimes, under gVisor too (the default for untrusted workers); the script prints the
medians, their ratios, gVisor's cost over runc, and the start-up time of
`orchestrator --help`. The plain command as a user types it starts a server on first use
(docs/server.md), so it is measured three ways, each in a private XDG_RUNTIME_DIR: the
first command (no server yet: it runs by itself, then starts one; a fresh folder each
time, its server stopped after it is up, outside the timing), the command typed right
after it (its server still loading), and the later commands (through that server). The
"alone" column sets ORCHESTRATOR_NO_SERVER=1. Targets: ratio <= 1.5 for the plain
command (first and later), <= 1.2 through the server; --help under 150 ms. Every command
runs with its bytecode written (the warm-up run writes it; PYTHONDONTWRITEBYTECODE is
dropped): an installed package has it.

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


ORCHESTRATOR = [sys.executable, "-m", "orchestrator"]


def as_typed(runtime: Path) -> dict[str, str]:
    """The environment of a command as a user types it (no opt-out), in ``runtime``."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"ORCHESTRATOR_NO_SERVER", "ORCHESTRATOR_NO_AUTOSTART"}}  # fmt: skip
    return {**env, "XDG_RUNTIME_DIR": str(runtime)}


def stop_started_server(env: dict[str, str]) -> None:
    """Wait until the server a first command started listens, then stop it (and wait)."""
    sock = Path(env["XDG_RUNTIME_DIR"]) / "orchestrator" / "server.sock"
    deadline = time.monotonic() + 60
    while not sock.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no server was started in {sock.parent}")
        time.sleep(0.05)
    subprocess.run([*ORCHESTRATOR, "serve", "--stop"], env=env, check=True,
                   stderr=subprocess.DEVNULL)  # fmt: skip


@contextmanager
def started_on_first_use(runtime: Path) -> Iterator[dict[str, str]]:
    """A server started by a first command in ``runtime``; the environment that reaches it."""
    env = as_typed(runtime)
    subprocess.run([*ORCHESTRATOR, "--version"], env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    sock = runtime / "orchestrator" / "server.sock"
    deadline = time.monotonic() + 60
    while not sock.exists():
        if time.monotonic() > deadline:
            raise SystemExit("the first command started no server")
        time.sleep(0.05)
    try:
        yield env
    finally:
        stop_started_server(env)


def first_and_next(command: list[str], runtime: Path) -> tuple[float, float]:
    """The first command in a fresh folder (it starts a server) and the one typed right
    after it (that server still loading); the server is stopped afterwards, untimed."""
    runtime.mkdir()
    env = as_typed(runtime)
    first = timed(command, env)
    after = timed(command, env)
    stop_started_server(env)
    return first, after


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
        (Path(tmp) / "served").mkdir()
        served_env = stack.enter_context(started_on_first_use(Path(tmp) / "served"))
        alone = {**os.environ, "ORCHESTRATOR_NO_SERVER": "1"}
        project = Path(tmp) / "runc"
        sandboxed = Path(tmp) / "gvisor"
        for folder, extra in ((project, "isolation: {untrusted: runc}\n"), (sandboxed, "")):
            (folder / "workers").mkdir(parents=True)
            (folder / "orchestrator.yaml").write_text("zones: {}\n" + extra)
            (folder / "workers" / "noop.worker").write_text('---\ncommand: ["true"]\n---\n')
        orchestrator = ORCHESTRATOR
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
        firsts: list[float] = []
        nexts: list[float] = []
        first_and_next(ours, Path(tmp) / "first-warm")
        for run in range(args.runs):
            for (command, env), seen in zip(commands, times, strict=True):
                seen.append(timed(command, env))
            first, after = first_and_next(ours, Path(tmp) / f"first-{run}")
            firsts.append(first)
            nexts.append(after)
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
    print(f"ratio orchestrator/docker:   {med_b / med_a:.2f}  (ORCHESTRATOR_NO_SERVER=1)")
    for label, seen in (("first (starts a server)", firsts),
                        ("typed right after (server loading)", nexts),
                        ("later (through that server)", served)):  # fmt: skip
        med = statistics.median(seen)
        print(f"orchestrator run, {label}: median {med * 1000:7.1f} ms  "
              f"(min {min(seen) * 1000:.1f}, max {max(seen) * 1000:.1f}); ratio to docker run "
              f"{med / med_a:.2f}")  # fmt: skip
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
    print(f"  the same through the started server: median {med_sg * 1000:7.1f} ms  "
          f"(min {min(e) * 1000:.1f}, max {max(e) * 1000:.1f}); ratio to docker run under "
          f"gVisor {med_sg / med_pg:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
