"""The warm pool's budget (``total``) and its created-only runs, over the fake engine: a
batch's pool opens no run beyond its inputs, a retry still gets one, and a worker without
an outbox runs as its container's own process, with no gc list and no attach per run."""

from __future__ import annotations

import pytest

from orchestrator import Orchestrator
from orchestrator.runtime.pool import PoolError
from tests.unit.fake_engine import FakeEngine


@pytest.fixture
def orch(project):
    project.worker("w", 'command: ["true"]')
    return Orchestrator(project.root, engine=FakeEngine())


def _use(pool):
    run = pool.take(timeout=10)
    try:
        run.run_worker()
        run.collect()
    finally:
        result = run.close()
    return result


def test_a_pool_with_a_total_opens_no_run_beyond_it_and_serves_a_retry(orch):
    engine = orch.engine
    pool = orch.pool("w", size=2, total=3, keep_alive=False, gc=False, output=False)
    try:
        results = [_use(pool) for _ in range(3)]
        assert pool.ready == 0 and engine.calls.count("create") == 3
        assert [r.status for r in results] == ["exited"] * 3
        assert _use(pool).status == "exited"  # one more take than announced (a retry)
    finally:
        pool.close()
    assert engine.calls.count("create") == 4 == engine.calls.count("remove")
    # created, not started, ahead; then start, wait, exit state, remove: no exec, no
    # attach, no gc list per run
    assert "exec" not in engine.calls and "attach" not in engine.calls
    assert "list" not in engine.calls
    assert engine.containers == set()
    with pytest.raises(PoolError, match="not kept alive"):
        pool.open_session()


def test_a_pool_without_a_total_keeps_its_size_ready(orch):
    with orch.pool("w", size=2) as pool:
        assert pool.wait_ready(10)
        _use(pool)
        assert pool.wait_ready(10)
    assert orch.engine.calls.count("create") == 3
