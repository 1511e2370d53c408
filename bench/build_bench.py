"""Benchmark ``orchestrator build`` against the classic ``docker build`` of the same file.

Run with ``python bench/build_bench.py`` (``--rounds N``). A 10-step Dockerfile (Python
steps, file copies, no network) on ``orchestrator/worker`` is built, interleaved in one run:
``orchestrator build --no-cache`` (every RUN under gVisor's build runtime), ``docker build
--no-cache`` (classic builder, runc: no hardening), and a fully cached ``orchestrator
build``. Targets: the cold build at most 2x ``docker build``; the cached rebuild under 1 s.
Everything made is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from orchestrator.docker.images import WORKER_IMAGE

COLD_RATIO_TARGET = 2.0
CACHED_TARGET_S = 1.0

DOCKERFILE = """\
FROM {base}
USER root
LABEL bench.mark={mark}
COPY app /app
WORKDIR /app
RUN python3 -c "open('step1.txt', 'w').write('1')"
COPY data.txt /app/data/
ENV STAGE=two
RUN python3 -c "import os; open('step2.txt', 'w').write(os.environ['STAGE'])"
RUN python3 -c "import json; json.dump(list(range(1000)), open('numbers.json', 'w'))"
CMD ["python3", "/app/main.py"]
"""


def make_context(folder: Path, mark: str) -> None:
    (folder / "app").mkdir(parents=True)
    (folder / "app" / "main.py").write_text("print('hello')\n")
    for n in range(20):
        (folder / "app" / f"module{n}.py").write_text(f"VALUE = {n}\n" * 50)
    (folder / "data.txt").write_text("data\n" * 1000)
    (folder / "Dockerfile").write_text(DOCKERFILE.format(base=WORKER_IMAGE, mark=mark))


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          check=False)  # fmt: skip
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    mark = uuid.uuid4().hex[:12]
    ours, theirs = (
        f"orchestrator-bench/build-{mark}:ours",
        f"orchestrator-bench/build-{mark}:docker",
    )
    cold: list[float] = []
    classic: list[float] = []
    cached: list[float] = []
    with tempfile.TemporaryDirectory(prefix="build-bench-") as tmp:
        root = Path(tmp)
        context, project = root / "ctx", root / "project"
        project.mkdir()
        (project / "orchestrator.yaml").write_text("zones: {}\n")
        make_context(context, mark)
        build = [sys.executable, "-m", "orchestrator", "build", str(context), "-t", ours,
                 "--project", str(project), "--json"]  # fmt: skip
        try:
            for _ in range(options.rounds):
                seconds, _ = timed([*build, "--no-cache"])
                cold.append(seconds)
                seconds, _ = timed(["docker", "build", "-q", "--no-cache", "-t", theirs,
                                    str(context)], env={"DOCKER_BUILDKIT": "0"})  # fmt: skip
                classic.append(seconds)
                _, out = timed(build)
                result = json.loads(out)
                assert result["built_steps"] == 0, result
                cached.append(result["duration_s"])
        finally:
            subprocess.run(["docker", "rmi", "-f", ours, theirs], capture_output=True, check=False)
            made = subprocess.run(
                ["docker", "images", "-aq", "--filter", f"label=bench.mark={mark}"],
                capture_output=True, text=True, check=False,
            ).stdout.split()  # fmt: skip
            if made:
                subprocess.run(["docker", "rmi", "-f", *made], capture_output=True, check=False)
    ratio = statistics.median(cold) / statistics.median(classic)
    print(f"orchestrator build, cold (gVisor):  median {statistics.median(cold):.2f} s  {cold}")
    print(f"docker build, cold (classic, runc): median {statistics.median(classic):.2f} s")
    print(f"cold ratio: {ratio:.2f}x (target <= {COLD_RATIO_TARGET}x)")
    print(f"orchestrator build, all cached: median {statistics.median(cached):.3f} s in the "
          f"builder (target < {CACHED_TARGET_S} s)")  # fmt: skip
    if ratio > COLD_RATIO_TARGET or statistics.median(cached) >= CACHED_TARGET_S:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
