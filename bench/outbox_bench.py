"""Benchmark collecting an outbox against a plain ``cp -a`` of the same tree.

Run with ``python bench/outbox_bench.py`` (``--help`` for sizes). It builds a tree of
10,000 files (about 500 MB, sizes spread from a few bytes to several MB) in a temporary
folder, then times, each on a warm page cache:

a. ``cp -a`` of the tree (the baseline);
b. ``collect_dir`` of the tree (walk without following links, checks, SHA-256, blobs);
c. ``collect_tar`` of the same tree streamed by ``tar -cf -`` through a pipe;
d. ``ChangeStore.create`` of (b)'s result (link, re-hash, fsync every blob).

The target is collection at least half as fast as ``cp -a`` (time ratio <= 2). Everything
is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from orchestrator.config.models import OutboxLimits
from orchestrator.staging import ChangeMeta, ChangeStore, ChangeTarget, collect_dir, collect_tar

TARGET_RATIO = 2.0


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


def timed(label: str, action, size: int, baseline: float | None = None) -> float:  # type: ignore[no-untyped-def]
    os.sync()  # start each step with no write-back of the previous one in flight
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    ratio = f"  {seconds / baseline:5.2f}x cp time" if baseline else ""
    print(f"  {label:<34} {seconds:7.2f} s  {size / seconds / 1e6:8.1f} MB/s{ratio}")
    return seconds


def warm(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            path.read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--mb", type=int, default=500, help="total size in MB")
    parser.add_argument("--tmp", type=Path, default=None, help="where to build (default: /tmp)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="outbox-bench-", dir=args.tmp) as tmp:
        work = Path(tmp)
        tree = work / "tree"
        size = build_tree(tree, args.files, args.mb * 1_000_000)
        print(f"tree: {args.files} files, {size / 1e6:.1f} MB in {work}")
        limits = OutboxLimits(size=4 * size, max_files=2 * args.files, max_file_size=size)
        store = ChangeStore(work / "changes")
        warm(tree)

        copy = work / "copy"
        cp = timed("a. cp -a", lambda: subprocess.run(["cp", "-a", str(tree), str(copy)], check=True), size)
        shutil.rmtree(copy)

        found = []

        def run_dir() -> None:
            found.append(collect_dir(tree, limits=limits, tmp_dir=work))

        by_dir = timed("b. collect_dir", run_dir, size, cp)
        assert len(found[0].files) == args.files and not found[0].rejected

        def run_tar() -> None:
            with subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."], stdout=subprocess.PIPE) as tar:
                assert tar.stdout is not None
                result = collect_tar(tar.stdout, limits=limits, tmp_dir=work)
                tar.stdout.close()
            assert len(result.files) == args.files and not result.rejected, result.rejected[:3]
            result.cleanup()

        by_tar = timed("c. collect_tar (tar -cf - | pipe)", run_tar, size, cp)
        meta = ChangeMeta(worker="bench", trust="untrusted", target=ChangeTarget.repo())
        timed("d. ChangeStore.create of (b)", lambda: store.create(found[0], meta), size, cp)
        found[0].cleanup()

        worst = max(by_dir, by_tar) / cp
        verdict = "meets" if worst <= TARGET_RATIO else "MISSES"
        print(f"collection {verdict} the target: worst {worst:.2f}x cp time (target <= {TARGET_RATIO}x)")


if __name__ == "__main__":
    main()
