"""Benchmark how soon ``orchestrator mcp`` answers its client: initialize, tools/list and
the first tool call, counted from the moment the process is started.

Run with ``python bench/mcp_bench.py`` (``--help`` for options). Each round starts the real
console entry point (``orchestrator``, next to this Python; ``--module`` for ``python -m
orchestrator``) on a temporary project, as a stdio client would, and speaks JSON-RPC to it
over pipes (standard library only, so the client costs nothing to speak of):

1. ``initialize`` (sent at once), then ``notifications/initialized``;
2. ``tools/list``;
3. the first tool call, ``list /``: it waits for the session's container;
4. stdin closed: the session closes, the container is removed, the process exits.

It prints p50 and max of each, in seconds since the process was started, and the target:
initialize and tools/list well under 0.5 s. The same rounds also time the floor: a bare
interpreter (``python -S``, standard library only) that answers ``initialize`` as soon as
it reads it, so that a figure on a loaded machine can be read against what any Python
server would get there. ``--isolation gvisor`` runs the worker under
gVisor. The project is removed at the end; every session removes its own container.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.5
CLIENT_INFO = {"name": "mcp-bench", "version": "1"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def make_project(root: Path, isolation: str | None) -> None:
    (root / "workers").mkdir(parents=True)
    (root / "input").mkdir()
    (root / "input" / "notes.txt").write_text("alpha\n")
    lines = ["zones:", f"  input: {{path: {root / 'input'}, mode: ro}}"]
    if isolation:
        levels = ", ".join(
            f"{t}: {isolation}" for t in ("untrusted", "session", "workspace", "full")
        )
        lines.append(f"isolation: {{{levels}}}")
    (root / "orchestrator.yaml").write_text("\n".join(lines) + "\n")
    (root / "workers" / "w.worker").write_text(
        "---\ntrust: session\nsandbox: {zones: [{name: input}]}\n---\n"
    )


class Client:
    """A JSON-RPC client over the server's pipes; each answer timed from ``started``."""

    def __init__(self, command: list[str]) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.next_id = 0

    def send(
        self, method: str, params: dict[str, object] | None = None, *, notify: bool = False
    ) -> int:
        message: dict[str, object] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if not notify:
            self.next_id += 1
            message["id"] = self.next_id
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()
        return self.next_id

    def answer(self, ident: int) -> tuple[dict[str, object], float]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the server ended: {self.proc.stderr.read().decode()}")  # type: ignore[union-attr]
            message = json.loads(line)
            if message.get("id") == ident:
                return message, time.perf_counter() - self.started

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


FLOOR = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    m = json.loads(line)\n"
    "    if 'id' in m:\n"
    "        print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': {}}), flush=True)\n"
)


def floor_round() -> float:
    """A bare interpreter's answer to ``initialize``, since its start."""
    client = Client([sys.executable, "-S", "-c", FLOOR])
    try:
        params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": CLIENT_INFO}
        _, answered = client.answer(client.send("initialize", params))
    finally:
        client.close()
    return answered


def one_round(command: list[str]) -> tuple[float, float, float, float]:
    client = Client(command)
    try:
        init = client.send(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": CLIENT_INFO},
        )
        _, t_init = client.answer(init)
        client.send("notifications/initialized", notify=True)
        _, t_list = client.answer(client.send("tools/list"))
        call, t_call = client.answer(
            client.send("tools/call", {"name": "list", "arguments": {"path": "/"}})
        )
        result = call.get("result")
        if not isinstance(result, dict) or result.get("isError"):
            raise RuntimeError(f"list / failed: {call}")
    finally:
        closed_at = time.perf_counter()
        code = client.close()
    if code != 0:
        raise RuntimeError(f"the server exited {code}")
    return t_init, t_list, t_call, time.perf_counter() - closed_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10, help="rounds (default 10)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--isolation", choices=["runc", "gvisor"], help="the worker's runtime")
    parser.add_argument(
        "--module", action="store_true", help="start `python -m orchestrator` instead"
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="mcp-bench-"))
    entry = Path(sys.executable).with_name("orchestrator")
    base = [sys.executable, "-m", "orchestrator"] if args.module else [str(entry)]
    command = [*base, "mcp", "w", "--project", str(root)]
    env_note = "ORCHESTRATOR_NO_SERVER" if os.environ.get("ORCHESTRATOR_NO_SERVER") else ""
    try:
        make_project(root, args.isolation)
        rows, floors = [], []
        for i in range(args.warmup + args.iterations):
            row = one_round(command)
            floor = floor_round()
            if i >= args.warmup:
                rows.append(row)
                floors.append(floor)
        names = ("initialize", "tools/list", "first call (list /)", "close and exit")
        print(f"orchestrator mcp, {args.iterations} rounds, {' '.join(base)} {env_note}".rstrip())
        print(f"{'answer':<22}{'p50 s':>8}{'max s':>8}   (since the process started)")
        for index, name in enumerate(names):
            values = [row[index] for row in rows]
            print(f"{name:<22}{statistics.median(values):>8.3f}{max(values):>8.3f}")
        floor_name = "floor: bare initialize"
        print(f"{floor_name:<22}{statistics.median(floors):>8.3f}{max(floors):>8.3f}")
        worst = max(max(row[0], row[1]) for row in rows)
        verdict = "met" if worst < TARGET_S else "MISSED"
        print(
            f"target: initialize and tools/list under {TARGET_S} s: {verdict} (max {worst:.3f} s)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
