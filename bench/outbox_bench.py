"""Benchmark collecting an outbox against a plain ``cp -a`` of the same tree.

Run with ``python bench/outbox_bench.py`` (``--help`` for sizes). It builds a tree of
10,000 files (about 500 MB, sizes spread log-normally from a few bytes to 8 MB) in a
temporary folder, then times, on a warm page cache:

a. ``cp -a`` of the tree (the baseline);
b. ``collect_dir`` of the tree (walk without following links, checks, SHA-256, blobs);
c. ``collect_tar`` of the same tree streamed by ``tar -cf -`` through a pipe;
d. ``ChangeStore.create`` of (b)'s result (link, re-hash, fsync every blob).

Each step runs ``--repeat`` times after an ``os.sync()`` (so the write-back of one step
does not slow the next) and the median is printed. The tar pipe gets 1 MiB of buffer, as a
socket from the container engine would have. The target is collection at least half as
fast as ``cp -a`` (time ratio <= 2). Everything is removed at the end.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.config.models import OutboxLimits
from orchestrator.staging import (
    ChangeMeta,
    ChangeStore,
    ChangeTarget,
    Collected,
    collect_dir,
    collect_tar,
)

TARGET_RATIO = 2.0
F_SETPIPE_SZ = 1031  # Linux fcntl: set a pipe's capacity


def build_tree(root: Path, files: int, total: int, seed: int = 7) -> int:
    """Write ``files`` files summing to about ``total`` bytes; return the bytes written."""
    rng = random.Random(seed)
    weights = [rng.lognormvariate(0, 2.0) for _ in range(files)]
    scale = total / sum(weights)
    pool = rng.randbytes(8 << 20)
    written = 0
    for number, weight in enumerate(weights):
        size = min(int(weight * scale), len(pool) - 1)
        folder = root / f"d{number % 100:02d}" / f"s{number % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        start = rng.randrange(0, len(pool) - size)
        (folder / f"f{number:05d}.dat").write_bytes(pool[start : start + size])
        written += size
    return written


def timed(
    label: str,
    action: Callable[[], Any],
    size: int,
    repeat: int,
    baseline: float | None = None,
    after: Callable[[Any], object] | None = None,
) -> float:
    """Run ``action`` ``repeat`` times (``after`` cleans up each); print and return the median."""
    times = []
    for _ in range(repeat):
        os.sync()
        started = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - started)
        if after is not None:
            after(result)
    seconds = statistics.median(times)
    ratio = f"  {seconds / baseline:5.2f}x cp" if baseline else "          "
    runs = "/".join(f"{t:.2f}" for t in times)
    print(f"  {label:<34} {seconds:6.2f} s {size / seconds / 1e6:7.1f} MB/s{ratio}  [{runs}]")
    return seconds


def warm(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            path.read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mb", type=int, default=500, help="total size in MB")
    parser.add_argument("--tmp", type=Path, default=None, help="where to build (default: /tmp)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per step (median shown)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="outbox-bench-", dir=args.tmp) as tmp:
        work = Path(tmp)
        tree, copy = work / "tree", work / "copy"
        size = build_tree(tree, args.files, args.mb * 1_000_000)
        print(f"tree: {args.files} files, {size / 1e6:.1f} MB in {work}; median of {args.repeat}")
        limits = OutboxLimits(size=4 * size, max_files=2 * args.files, max_file_size=size)
        store = ChangeStore(work / "changes")
        warm(tree)

        def run_cp() -> None:
            subprocess.run(["cp", "-a", str(tree), str(copy)], check=True)

        def run_dir() -> Collected:
            return collect_dir(tree, limits=limits, tmp_dir=work)

        def run_tar() -> Collected:
            command = ["tar", "-C", str(tree), "-cf", "-", "."]
            with subprocess.Popen(command, stdout=subprocess.PIPE) as tar:
                assert tar.stdout is not None
                fcntl.fcntl(tar.stdout.fileno(), F_SETPIPE_SZ, 1 << 20)
                result = collect_tar(tar.stdout, limits=limits, tmp_dir=work)
                tar.stdout.close()
            return result

        def check(result: Collected) -> None:
            assert len(result.files) == args.files and not result.rejected, result.rejected[:3]
            result.cleanup()

        n = args.repeat
        cp = timed("a. cp -a", run_cp, size, n, after=lambda _: shutil.rmtree(copy))
        by_dir = timed("b. collect_dir", run_dir, size, n, cp, after=check)
        by_tar = timed("c. collect_tar (tar -cf - | pipe)", run_tar, size, n, cp, after=check)
        found = run_dir()
        meta = ChangeMeta(worker="bench", trust="untrusted", target=ChangeTarget.repo())

        def run_create() -> Path:
            return store.folder(store.create(found, meta).id)

        timed("d. ChangeStore.create of (b)", run_create, size, n, cp, after=shutil.rmtree)
        found.cleanup()

        for label, seconds in (("collect_dir", by_dir), ("collect_tar", by_tar)):
            ratio = seconds / cp
            verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
            print(f"{label} {verdict} the target: {ratio:.2f}x cp time (target <= {TARGET_RATIO}x)")


if __name__ == "__main__":
    main()
