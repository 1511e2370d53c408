"""The broker's request channel, with a fake child runner (no Docker)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project, load_worker
from orchestrator.prepare import prepare
from orchestrator.runtime.broker import Broker
from orchestrator.runtime.host_folders import make_host_folders
from orchestrator.runtime.run import RunResult


@pytest.fixture
def broker(project):
    project.zone("data", "ro", files={"in.txt": "x"})
    project.worker("main", "trust: session\nchildren: [kid]\nsandbox: {zones: [{name: data}]}")
    project.worker("kid", "sandbox: {zones: [{name: data}]}")
    loaded = load_project(project.root)
    parent = prepare(loaded, load_worker(loaded, "main"))
    make_host_folders(parent)
    calls = []
    b_cancelled: list[str] = []
    gate = threading.Event()
    gate.set()

    def run_child(child, depth):
        calls.append((child, depth))
        gate.wait(30)
        return RunResult(child.spec.run_id, child.spec.worker, 3, "exited", 0.1, "out", "err", True)

    audit = AuditLog(loaded.sandbox_root / "audit.jsonl")

    def cancel(run_id):  # like removing the child's container: its run ends at once
        b_cancelled.append(run_id)
        gate.set()

    b = Broker(parent, depth=0, run_child=run_child, cancel_child=cancel, audit=audit)
    b.start()
    b.calls = calls
    b.log = audit
    b.gate = gate
    b.cancelled = b_cancelled
    yield b
    b.close()


def ask(broker, payload: bytes) -> dict:
    folder = os.open(broker.path.parent, os.O_PATH)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(f"/proc/self/fd/{folder}/{broker.path.name}")  # tmp paths are long
        os.close(folder)
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return json.loads(data)


def test_runs_a_listed_child_with_its_attachments(broker):
    answer = ask(broker, b'{"child": "kid", "attach": ["/data/in.txt"]}\n')
    assert answer["ok"] is True
    assert (answer["exit_code"], answer["stdout"]) == (3, "out")
    ((child, depth),) = broker.calls
    assert depth == 1
    assert child.spec.env["ORCHESTRATOR_ATTACHMENTS"] == '["/data/in.txt"]'
    assert child.spec.env["ORCHESTRATOR_PARENT_RUN"] == broker.parent.spec.run_id
    assert child.session_id == broker.parent.session_id
    assert [
        e.metadata["child"] for e in broker.log.query(AuditFilter(operation="broker.call"))
    ] == ["kid"]


def refusals(broker) -> list:
    return broker.log.query(AuditFilter(operation="broker.refused", denied_only=True))


@pytest.mark.parametrize(
    ("payload", "error", "child"),
    [
        (
            b'{"child": "../../etc/x.worker"}\n',
            "may not call '../../etc/x.worker'",
            "../../etc/x.worker",
        ),
        (b'{"child": "kid", "attach": ["/data/../../etc/passwd"]}\n', "'..' is not allowed", "kid"),
        (b'{"child": "kid", "attach": ["/workspace/x"]}\n', "not readable by child 'kid'", "kid"),
        (b"not json\n", "bad request: request is not JSON (Expecting value at byte 0)", None),
        (b"\xff\xfe\n", "bad request: request is not UTF-8", None),
        (b'["a list"]\n', "bad request: request must be a JSON object", None),
        (b'{"child": 5}\n', "request needs 'child'", None),
        (b'{"child": ["kid", "kid"]}\n', "request needs 'child' (a name)", None),
        (b'{"child": "kid", "attach": "/data/in.txt"}\n', "'attach' (a list of paths)", "kid"),
        (b'{"child": "kid", "attach": [{"p": 1}]}\n', "'attach' (a list of paths)", "kid"),
        (b'{"child": "kid", "n": ' + b"9" * 5000 + b"}\n", "an integer too long to read", None),
        (b"[" * 60000 + b"\n", "bad request: request nested too deeply", None),
    ],
)
def test_refusals_are_answered_and_audited(broker, payload, error, child):
    answer = ask(broker, payload)
    assert answer["ok"] is False
    assert error in answer["error"]
    assert broker.calls == []
    (entry,) = refusals(broker)
    assert (entry.reason, entry.metadata["child"]) == (answer["error"], child)
    assert entry.run_id == broker.parent.spec.run_id and entry.worker == "main"


def test_oversized_requests_are_cut_off_and_audited(broker):
    try:
        answer = ask(broker, b'{"child": "kid", "pad": "' + b"x" * (1 << 20) + b'"}\n')
    except (ConnectionResetError, BrokenPipeError):
        answer = {"ok": False, "error": "bad request: request larger than 64 KiB"}
    assert answer == {"ok": False, "error": "bad request: request larger than 64 KiB"}
    assert broker.calls == []
    assert [e.reason for e in refusals(broker)] == [answer["error"]]


def test_a_request_that_never_ends_is_refused_and_audited(broker, monkeypatch):
    import orchestrator.runtime.broker as module

    monkeypatch.setattr(module, "READ_TIMEOUT", 0.2)
    folder = os.open(broker.path.parent, os.O_PATH)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(f"/proc/self/fd/{folder}/{broker.path.name}")
        os.close(folder)
        conn.sendall(b'{"child": "kid"')  # and no more, no end of line
        answer = json.loads(conn.makefile("rb").readline())
    assert answer == {"ok": False, "error": "bad request: timed out"}
    assert [e.reason for e in refusals(broker)] == [answer["error"]]


def test_socket_is_private_and_removed_on_close(broker):
    assert broker.path.stat().st_mode & 0o777 == 0o600
    broker.close()
    assert not broker.path.exists()


def test_concurrent_calls_are_bounded_and_cancelled_with_the_parent(broker):
    from orchestrator.runtime.broker import MAX_CONCURRENT

    broker.gate.clear()  # children now block until released
    waiting = [
        threading.Thread(target=ask, args=(broker, b'{"child": "kid"}\n'))
        for _ in range(MAX_CONCURRENT)
    ]
    for thread in waiting:
        thread.start()
    deadline = time.monotonic() + 10
    while len(broker.calls) < MAX_CONCURRENT and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(broker.calls) == MAX_CONCURRENT
    refused = ask(broker, b'{"child": "kid"}\n')
    assert refused == {"ok": False, "error": "more than 4 child calls at once; wait for one"}
    ((entry),) = refusals(broker)
    assert (entry.reason, entry.metadata["child"]) == (refused["error"], "kid")
    bad = ask(broker, b"not json\n")  # while busy, what is wrong with it is not even read
    assert bad == refused
    assert [e.metadata["child"] for e in refusals(broker)] == ["kid", None]
    broker.close(cancel=True)
    assert sorted(broker.cancelled) == sorted(c.spec.run_id for c, _ in broker.calls)
    for thread in waiting:
        thread.join(5)


def test_a_child_gets_only_what_is_left_of_its_parents_time(broker):
    broker.deadline -= broker.parent.grant.limits.timeout - 5  # the parent has 5 s left
    answer = ask(broker, b'{"child": "kid"}\n')
    assert answer["ok"] is True
    ((child, _),) = broker.calls
    assert child.spec.limits.timeout_s <= 5


def test_a_deeply_nested_child_file_is_one_refusal_not_a_traceback(broker, project):
    (project.root / "workers" / "kid.worker").write_text(
        "---\nenv: " + "[" * 1000 + "]" * 1000 + "\n---\n"
    )
    answer = broker.handle({"child": "kid", "attach": []})
    assert answer["ok"] is False
    assert "kid.worker:2: invalid YAML: nested deeper than 32 levels" in answer["error"]
    assert "\n" not in answer["error"]
    assert broker.calls == []


def test_a_flood_of_refusals_is_counted_not_recorded_one_by_one(broker, monkeypatch):
    import orchestrator.runtime.broker as module

    monkeypatch.setattr(module, "MAX_AUDITED_REFUSALS", 5)
    for _ in range(8):
        assert ask(broker, b"not json\n")["ok"] is False
    assert ask(broker, b'{"child": "kid"}\n')["ok"] is True  # a good call still runs
    assert len(refusals(broker)) == 5
    broker.close()
    (flood,) = broker.log.query(AuditFilter(operation="broker.flood"))
    assert (flood.metadata["refused"], flood.metadata["recorded"], flood.allowed) == (8, 5, False)
    assert flood.reason.startswith("8 requests refused; the first 5 are recorded one by one")
    assert flood.run_id == broker.parent.spec.run_id


def test_the_parent_s_strings_are_bounded_in_the_audit_log(broker):
    name = "k" * 5000
    attach = [f"/data/{i}" + "x" * 1000 for i in range(50)]
    answer = ask(broker, json.dumps({"child": name, "attach": attach}).encode() + b"\n")
    assert answer["ok"] is False and name in answer["error"]  # the answer is whole
    (entry,) = refusals(broker)
    assert entry.metadata["child"] == "k" * 256 + "... (5000 characters)"
    assert len(entry.metadata["attach"]) == 20 and entry.metadata["attachments"] == 50
    assert all(len(path) < 300 for path in entry.metadata["attach"])
    assert len(entry.reason) < 1100
