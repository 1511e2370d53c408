"""``Sandbox.get_metrics``: one sample of the session's container, from the engine's
one-shot stats (blocking; an engine call). E2B keeps a series sampled every few seconds;
this server keeps none, so each call answers one sample, taken now: the CPU used as an
average since the sandbox started, the memory in use as ``docker stats`` shows it, no
disk figures (0: the root is the image's, and the tmpfs folders count as memory)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from orchestrator.e2b.sandboxes import Refused, Sandboxes
from orchestrator.errors import OrchestratorError
from orchestrator.integrations.projects import one_line

__all__ = ["metrics"]


@runtime_checkable
class UsageEngine(Protocol):
    """What metrics need of an engine (Docker's: :meth:`DockerEngine.usage`)."""

    def usage(self, container_id: str) -> dict[str, int]: ...


def metrics(sandboxes: Sandboxes, sandbox_id: str, query: dict[str, str]) -> list[dict[str, Any]]:
    """``GET /sandboxes/{id}/metrics``: E2B's ``SandboxMetric`` list: one sample, or none
    when ``start``/``end`` (unix seconds) leave now out."""
    sandbox = sandboxes.get(sandbox_id)
    bounds = []
    for name in ("start", "end"):
        raw = query.get(name)
        try:
            bounds.append(int(raw) if raw else None)
        except ValueError:
            raise Refused(400, f"{name}: {raw!r} is not a unix time in seconds") from None
    now = time.time()
    start, end = bounds
    if (start is not None and start > now) or (end is not None and end < int(now)):
        return []
    launch = sandbox.session._run.live
    engine = getattr(launch, "engine", None)
    container = getattr(launch, "container_id", None)
    if not isinstance(engine, UsageEngine) or not container:
        raise Refused(501, "metrics: this backend gives no resource use (use the docker backend)")
    try:
        used = engine.usage(str(container))
    except OrchestratorError as exc:
        raise Refused(500, f"metrics: {one_line(exc)}") from None
    detail = sandbox.detail()
    cpus = int(detail["cpuCount"])
    elapsed = max(now - sandbox.started, 1e-3)
    return [
        {
            "timestamp": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "timestampUnix": int(now),
            "cpuCount": cpus,
            "cpuUsedPct": round(min(100.0, used["cpu_ns"] / 1e9 / elapsed / cpus * 100), 2),
            "memUsed": used["mem_used"],
            "memTotal": used["mem_limit"] or detail["memoryMB"] << 20,
            "memCache": used["mem_cache"],
            "diskUsed": 0,
            "diskTotal": 0,
        }
    ]
