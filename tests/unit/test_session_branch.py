"""Session.branch's own rules, before any owner starts: whose snapshot, how many forks, a
paused session. The engine side (forks that exist, see the state, are independent) is
tests/integration/test_snapshots.py's."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from orchestrator.errors import PolicyError
from orchestrator.runtime import owners, snapshots
from orchestrator.runtime.session import Session, SessionPaused
from orchestrator.runtime.snapshots import SnapshotError


@pytest.fixture
def session(monkeypatch):
    """A Session with only what branch uses: its id, lock, state and audit records."""
    live = Session.__new__(Session)
    live.id = "me"
    live.orchestrator = SimpleNamespace(project=SimpleNamespace(root="/nowhere"))
    live._lock = threading.Lock()
    live._branched = 0
    live._closed_because = None
    live._paused = False
    live._in_flight = 0
    live._last_used = time.monotonic()
    live.records = []
    live._record = lambda op, allowed, **meta: live.records.append((op, allowed, meta))
    live.snapshot = lambda: SimpleNamespace(id="snap-000000000000", session="me", worker="w")
    live.started = []

    def start_forks(project, worker, snap_id, count, options):
        live.started.append((worker, snap_id, count, options))
        return [f"fork{n}" for n in range(count)]

    def get(project, snap_id, orchestrator=None):
        return SimpleNamespace(id=snap_id, session=snap_id.split("-")[1], worker="w")

    monkeypatch.setattr(owners, "start_forks", start_forks)
    monkeypatch.setattr(snapshots, "get", get)
    return live


def test_a_branch_from_a_checkpoint_taken_now_starts_owned_forks(session):
    answer = session.branch(2)
    assert answer["sessions"] == ["fork0", "fork1"]
    assert answer["snapshot"] == "snap-000000000000"
    assert session.started == [
        ("w", "snap-000000000000", 2, {"idle_timeout": 900.0, "max_lifetime": 28800.0})
    ]
    op, allowed, meta = session.records[-1]
    assert (op, allowed, meta["sessions"], meta["count"]) == (
        "session.branch",
        True,
        answer["sessions"],
        2,
    )


def test_only_its_own_checkpoint(session):
    assert session.branch(1, "snap-me")["snapshot"] == "snap-me"
    with pytest.raises(PolicyError) as refused:
        session.branch(1, "snap-other")
    assert str(refused.value) == (
        "snapshot snap-other is not a checkpoint of session me (it is session other's): give "
        "an id this session's checkpoint answered, or none to checkpoint now"
    )
    assert len(session.started) == 1
    assert session.records[-1][:2] == ("session.branch", False)


def test_at_most_the_limit_over_its_life(session):
    for _ in range(owners.BRANCH_LIMIT // 4):
        session.branch(4)
    with pytest.raises(PolicyError, match=f"may start at most {owners.BRANCH_LIMIT}"):
        session.branch(1)
    assert sum(count for _, _, count, _ in session.started) == owners.BRANCH_LIMIT


def test_a_failed_start_gives_its_share_back(session, monkeypatch):
    def failing(*_args):
        raise SnapshotError("no")

    monkeypatch.setattr(owners, "start_forks", failing)
    for _ in range(owners.BRANCH_LIMIT + 1):
        with pytest.raises(SnapshotError, match="no"):
            session.branch(1)
    assert session._branched == 0


def test_a_paused_session_is_refused_naming_resume(session):
    session._paused = True
    with pytest.raises(SessionPaused, match="resume it first"):
        session.branch(1, "snap-me")
    assert session.started == []


@pytest.mark.parametrize("count", [0, 5])
def test_a_count_out_of_range(session, count):
    with pytest.raises(SnapshotError, match=f"count {count}: give 1 to 4 forks"):
        session.branch(count)
