"""Benchmark the audit log: fsynced appends per second and filtered queries over 1M entries.

Run with ``python bench/audit_bench.py`` (``--help`` for sizes). The large log is
generated directly with a valid chain (no fsync per line), then queried through
:class:`orchestrator.audit.AuditLog` as the CLI would.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator.audit import GENESIS_HASH, AuditFilter, AuditLog

APPEND_TARGET = 2_000.0  # appends per second, at least
QUERY_TARGET = 3.0  # seconds, at most
RUNS = 10_000
DENIED_EVERY = 100


def bench_appends(folder: Path, count: int) -> float:
    """Return fsynced appends per second for ``count`` appends from one process."""
    log = AuditLog(folder / "append" / "audit.jsonl", redact=["bench-secret-value"])
    log.record("bench.warmup")
    started = time.perf_counter()
    for number in range(count):
        log.record(
            "run.started",
            worker="reader",
            run_id=f"run-{number % RUNS:06d}",
            session_id="session-1",
            trust_level="untrusted",
            zone="inbox",
            path="/data/inbox",
            metadata={"image": "orchestrator/worker:latest", "n": number},
        )
    elapsed = time.perf_counter() - started
    log.close()
    return count / elapsed


# One entry in canonical form (keys sorted, no spaces): filled in with %-formatting, which
# is far quicker than json.dumps for a million lines. check_generator() proves it canonical.
_TEMPLATE = (
    '{"allowed":%s,"id":"%032x","metadata":{"exit_code":0,'
    '"image":"orchestrator/worker:latest"},"operation":"%s",'
    '"path":"/data/inbox/report.pdf","prev":"%s","reason":%s,"run_id":"run-%06d",'
    '"session_id":"session-%04d","timestamp":"%s.000000Z","trust_level":"%s",'
    '"worker":"worker-%d","zone":"%s"}'
)
_OPERATIONS = ("plan.compiled", "run.started", "run.ended", "gc.removed")


def generate(path: Path, entries: int) -> float:
    """Write ``entries`` chained entries straight to ``path``; return the seconds taken.

    One run id in :data:`RUNS` per line in turn, and every :data:`DENIED_EVERY`-th entry
    a denial.
    """
    started = time.perf_counter()
    base = int(time.time()) - entries
    prev = GENESIS_HASH
    with path.open("wb") as out:
        batch: list[str] = []
        for number in range(entries):
            denied = number % DENIED_EVERY == DENIED_EVERY - 1
            body = _TEMPLATE % (
                "false" if denied else "true",
                number,
                "policy.denied" if denied else _OPERATIONS[number % 4],
                prev,
                "\"zone 'secrets' is not granted\"" if denied else "null",
                number % RUNS,
                number % 1000,
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + number)),
                "untrusted" if number % 3 else "trusted",
                number % 50,
                "secrets" if denied else "inbox",
            )
            prev = hashlib.sha256((prev + body).encode()).hexdigest()
            batch.append(f'{body[:-1]},"hash":"{prev}"}}\n')
            if len(batch) >= 10_000:
                out.write("".join(batch).encode())
                batch.clear()
        out.write("".join(batch).encode())
    return time.perf_counter() - started


def check_generator(folder: Path) -> None:
    """Make sure generated lines are exactly what the log writes: canonical and chained.

    Verification hashes the canonical JSON of each parsed line, so it passes only if
    the template's text is that canonical JSON.
    """
    path = folder / "check.jsonl"
    generate(path, 2_000)
    result = AuditLog(path).verify()
    if not result.ok or result.count != 2_000:
        raise SystemExit(f"generated log does not verify: {result}")


def timed(action: Callable[[], int]) -> tuple[float, int]:
    """Return (seconds, result) of ``action``, best of three runs."""
    best = float("inf")
    result = 0
    for _ in range(3):
        started = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - started)
    return best, result


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--appends", type=int, default=5_000, help="fsynced appends to time")
    parser.add_argument("--entries", type=int, default=1_000_000, help="size of the query log")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the files")
    parser.add_argument("--verify", action="store_true", help="also time a full verify")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="audit-bench-") as name:
        folder = Path(name)
        rate = bench_appends(folder, args.appends)
        print(
            f"appends (fsync each), 1 process: {rate:10,.0f} /s   "
            f"target >= {APPEND_TARGET:,.0f} /s   {verdict(rate >= APPEND_TARGET)}"
        )

        check_generator(folder)
        path = folder / "big" / "audit.jsonl"
        path.parent.mkdir()
        seconds = generate(path, args.entries)
        size = path.stat().st_size / 2**20
        print(f"generated {args.entries:,} entries ({size:,.0f} MiB) in {seconds:.1f} s")

        log = AuditLog(path)
        queries: list[tuple[str, AuditFilter]] = [
            ("query --run (one run id)", AuditFilter(run="run-004242")),
            ("query --denied (all denials)", AuditFilter(denied_only=True)),
            ("query --denied --run", AuditFilter(run="run-004299", denied_only=True)),
            ("violations (last 50)", AuditFilter(denied_only=True, limit=50)),
            ("query --since 1h", AuditFilter(since=datetime.now(UTC) - timedelta(hours=1))),
        ]
        for label, flt in queries:

            def run(flt: AuditFilter = flt) -> int:
                return len(log.query(flt))

            seconds, found = timed(run)
            print(
                f"{label:<30} {seconds:7.3f} s  ({found:,} matches)   "
                f"target < {QUERY_TARGET:.0f} s   {verdict(seconds < QUERY_TARGET)}"
            )
        if args.verify:
            started = time.perf_counter()
            result = log.verify()
            print(
                f"verify (whole chain)           {time.perf_counter() - started:7.3f} s  "
                f"({result.count:,} entries, ok={result.ok})   no target"
            )


if __name__ == "__main__":
    main()
