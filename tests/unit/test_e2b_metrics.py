"""What E2B's metrics are made of: the engine's one-shot stats of a container."""

from __future__ import annotations

import pytest


class _Stats:
    """The engine API's one-shot stats of a container (cgroup v1 or v2 fields)."""

    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer

    def stats(self, container_id: str, stream: bool, one_shot: bool) -> dict[str, object]:
        assert (stream, one_shot) == (False, True)
        return self.answer


@pytest.mark.parametrize(
    ("detail", "used", "cache"),
    [
        ({"total_inactive_file": 100, "cache": 300}, 900, 300),  # cgroup v1
        ({"inactive_file": 200, "file": 400}, 800, 400),  # cgroup v2
        ({}, 1000, 0),
    ],
)
def test_the_engines_usage_of_a_container(detail, used, cache):
    from orchestrator.docker import DockerEngine

    answer = {
        "cpu_stats": {"cpu_usage": {"total_usage": 5_000_000_000}},
        "memory_stats": {"usage": 1000, "limit": 4096, "stats": detail},
    }
    engine = DockerEngine(client=_Stats(answer))
    assert engine.usage("c") == {
        "cpu_ns": 5_000_000_000,
        "mem_used": used,
        "mem_cache": cache,
        "mem_limit": 4096,
    }
