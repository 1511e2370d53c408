"""Calls waiting for a person (orchestrator.tools.waiting): listed while they wait, answered
once, declined when nobody answers in time or the session closes."""

from __future__ import annotations

import threading
import time

from orchestrator.tools.waiting import Answered, PendingApprovals


def in_thread(approvals: PendingApprovals, timeout: float) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(
        target=lambda: got.append(
            approvals.ask("write", {"path": "/notes/\udcff"}, "write 2 bytes", timeout=timeout)
        )
    )
    thread.start()
    return thread, got


def wait_listed(approvals: PendingApprovals) -> str:
    for _ in range(200):
        if approvals.waiting():
            return approvals.waiting()[0].id
        time.sleep(0.01)
    raise AssertionError("the call was never listed")


def test_a_waiting_call_is_listed_then_answered_once() -> None:
    approvals = PendingApprovals()
    thread, got = in_thread(approvals, 30)
    request = wait_listed(approvals)
    [shown] = [p.to_dict() for p in approvals.waiting()]
    assert shown["tool"] == "write" and shown["args"] == {"path": "/notes/\\xff"}
    assert shown["description"] == "write 2 bytes" and shown["asked_at"]
    answer = Answered(True, "alice", "review console")
    assert approvals.answer(request, answer) is not None
    thread.join(5)
    [(pending, said)] = got
    assert said == answer and pending.id == request
    assert approvals.waiting() == []
    assert approvals.answer(request, Answered(False, "bob", "x")) is None  # answered already


def test_nobody_answering_in_time_is_no_answer() -> None:
    approvals = PendingApprovals()
    started = time.monotonic()
    pending, said = approvals.ask("delete", {}, "delete /a", timeout=0.2)
    assert said is None and time.monotonic() - started < 5
    assert (
        approvals.waiting() == [] and approvals.answer(pending.id, Answered(True, "a", "b")) is None
    )


def test_closing_declines_every_waiting_call() -> None:
    approvals = PendingApprovals()
    thread, got = in_thread(approvals, 30)
    wait_listed(approvals)
    approvals.cancel_all()
    thread.join(5)
    [(_, said)] = got
    assert said is not None and said.approve is False and said.via == "the session closed"


def test_a_call_whose_caller_went_away_stops_waiting() -> None:
    approvals = PendingApprovals()
    started = time.monotonic()
    _, said = approvals.ask("write", {}, "write", timeout=60, still_wanted=lambda: False)
    assert said is None and time.monotonic() - started < 5
    assert approvals.waiting() == []
