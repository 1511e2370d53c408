"""Benchmark the review console: the change-set list with 500 change sets, and the page of
a change set whose diff is 10,000 lines.

Run with ``python bench/review_bench.py`` (needs the 'review' extra). The change sets are
made with the real staging package in a temporary project; the pages are fetched through
Starlette's TestClient, token and cookie included, as a browser would. The baseline is
what ``orchestrator staged show`` does for the same change set (scanners, then
``staging.render_diff``), timed in the same run; the ratio is the page's time over it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from starlette.testclient import TestClient

from orchestrator.config.models import OutboxLimits
from orchestrator.review.app import LINES_PER_PAGE, make_app
from orchestrator.review.guard import Secrets
from orchestrator.staging import (
    ChangeMeta,
    ChangeStore,
    ChangeTarget,
    collect_dir,
    render_diff,
    run_scanners,
    scanners_for,
)

LIST_TARGET = 1.0  # seconds, at most
DIFF_TARGET = 2.0  # seconds, at most


def stage(store: ChangeStore, work: Path, name: str, files: dict[str, bytes]) -> str:
    out = work / name
    for rel, content in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(content)
    meta = ChangeMeta(
        worker="bench", trust="workspace", target=ChangeTarget.repo(), run_id=name, message=name
    )
    with (
        store.scratch() as scratch,
        collect_dir(out, limits=OutboxLimits(), tmp_dir=scratch) as collected,
    ):
        return store.create(collected, meta).id


def timed(web: TestClient, path: str) -> float:
    started = time.perf_counter()
    answer = web.get(path)
    elapsed = time.perf_counter() - started
    assert answer.status_code == 200, answer.text[:200]
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=500)
    parser.add_argument("--lines", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "orchestrator.yaml").write_text("zones: {}\nrepo: .\n")
        store = ChangeStore(root / ".sandbox" / "changes")
        with tempfile.TemporaryDirectory() as work_tmp:
            work = Path(work_tmp)
            for number in range(args.changes):
                stage(store, work, f"run-{number:04d}", {f"notes/{number}.md": b"note\n"})
            body = "".join(f"line {n} <b>&amp;</b>\n" for n in range(args.lines)).encode()
            big = stage(store, work, "run-big", {"big.md": body})
            twin = stage(store, work, "run-twin", {"big.md": body})
        started = time.perf_counter()
        change = store.get(twin)
        run_scanners(change, store, scanners_for())
        render_diff(change, store, root, color=False)
        baseline = time.perf_counter() - started
        keys = Secrets(48999)
        base_url = f"http://127.0.0.1:{keys.port}{keys.base}/"  # paths below are under it
        web = TestClient(make_app(root, keys), base_url=base_url)
        web.get(f"/?token={keys.token}")
        listed = min(timed(web, "/") for _ in range(3))
        shown = timed(web, f"/changes/{big}")  # the first view: scanners run, too
        pages = -(-(args.lines + 10) // LINES_PER_PAGE)
        last = min(timed(web, f"/changes/{big}?page={pages}") for _ in range(3))
        split = min(timed(web, f"/changes/{big}?view=split") for _ in range(3))
    print(f"list of {args.changes + 2} change sets: {listed:.3f} s (target {LIST_TARGET} s)")
    print(
        f"change set with a {args.lines}-line diff, first view (page 1 of {pages}): "
        f"{shown:.3f} s (target {DIFF_TARGET} s); `staged show` of the same: {baseline:.3f} s "
        f"(ratio {shown / baseline:.2f}x)"
    )
    print(f"its last page, scanned already: {last:.3f} s; page 1 side by side: {split:.3f} s")
    return 0 if listed <= LIST_TARGET and shown <= DIFF_TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
