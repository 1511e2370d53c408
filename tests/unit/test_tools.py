"""LLM tools over a session: schemas, approval decisions and refused calls.

The session is a fake over a real :class:`SandboxFiles` (real grant, real folders, real
audit log) with a fake exec and stage, so every file operation is the real one.
"""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.audit import AuditFilter
from orchestrator.tools import SPECS, InvalidArguments, Toolset, decide, validate
from tests.unit.tools_support import toolset_for


@pytest.fixture
def tools(project):
    yield from toolset_for(project)


def refusals(toolset):
    return [e for e in toolset.audit_log.query(AuditFilter(operation="tool.refused"))]


# -- definitions ------------------------------------------------------------------------------


def test_definitions_are_plain_json_schemas_in_both_common_shapes():
    plain = Toolset.definitions()
    names = [d["name"] for d in plain]
    assert names == [
        "list",
        "read",
        "write",
        "delete",
        "stat",
        "exec",
        "stage",
        "context",
        "checkpoint",
        "branch",
    ]
    for d in plain:
        assert set(d) == {"name", "description", "input_schema"}
        assert d["input_schema"]["type"] == "object"
        assert d["input_schema"]["additionalProperties"] is False
        json.dumps(d)  # JSON-ready
    openai = Toolset.openai_definitions()
    assert openai[1] == {
        "type": "function",
        "function": {
            "name": "read",
            "description": plain[1]["description"],
            "parameters": plain[1]["input_schema"],
        },
    }


def test_descriptions_never_name_a_zone():
    text = json.dumps([s.to_dict() for s in SPECS])
    for zone in ("/input", "/session", "/workspace", "/repo", "/staged", "/workers", "/output"):
        assert zone not in text
    assert "list '/'" in text


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("nope", {}, "Unknown tool 'nope'. Tools: list, read"),
        ("read", {}, "Tool 'read': 'path' is required"),
        ("read", {"path": 3}, "Tool 'read': 'path' must be a string, not an integer"),
        ("read", {"path": "/a", "offset": 0}, "'offset' must be at least 1"),
        ("read", {"path": "/a", "offset": True}, "'offset' must be an integer, not a boolean"),
        (
            "read",
            {"path": "/a", "lines": 3},
            "unknown argument 'lines' (known: path, offset, limit)",
        ),
        ("write", {"path": "/a"}, "'content' is required"),
        ("exec", {"command": []}, "'command' must hold at least 1 item(s)"),
        (
            "exec",
            {"command": 3},
            "'command' must be a string or an array of strings, not an integer",
        ),
        ("exec", {"command": "x", "timeout": 0}, "'timeout' must be more than 0"),
        ("exec", {"command": "x", "timeout": 1e12}, "'timeout' must be at most 604800"),
        ("exec", {"command": "x", "timeout": float("nan")}, "'timeout' must be a finite number"),
        ("exec", {"command": "x", "timeout": float("inf")}, "'timeout' must be a finite number"),
        (
            "exec",
            {"command": "x", "env": {"A": 1}},
            "Tool 'exec': 'env.A' must be a string, not an integer",
        ),
        ("stage", {"files": [], "message": "m"}, "'files' must hold at least 1 item(s)"),
        ("stage", {"files": ["/a"], "message": ""}, "'message' must not be empty"),
        ("list", [], "arguments must be an object, not an array"),
    ],
)
def test_arguments_are_validated_with_one_clear_line(name, args, message):
    with pytest.raises(InvalidArguments) as info:
        validate(name, args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_defaults_are_filled_in():
    assert validate("list", {}) == {"path": "/"}
    assert validate("write", {"path": "/a", "content": ""})["append"] is False


# -- approval decisions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "status", "text"),
    [
        ("list", {"path": "/"}, "pre_approved", "list /"),
        ("read", {"path": "/input/a.txt"}, "pre_approved", "read /input/a.txt"),
        ("stat", {"path": "/data/kept.txt"}, "pre_approved", "stat /data/kept.txt"),
        ("read", {"path": "/etc/passwd"}, "blocked", "outside the sandbox. Readable: /data,"),
        ("read", {"path": "/input/../etc"}, "blocked", "absolute path without '..'"),
        ("read", {"path": "input/a.txt"}, "blocked", "absolute path"),
        ("read", {"path": "/staged/x"}, "blocked", "write-only outbox"),
        ("write", {"path": "/output/r.md", "content": "abc"}, "pre_approved", "write 3 bytes"),
        ("write", {"path": "/input/x", "content": ""}, "blocked", "/input is read-only. Writable:"),
        (
            "write",
            {"path": "/data/x", "content": "ab"},
            "needs_approval",
            "/data asks before writes",
        ),
        ("write", {"path": "/staged/x", "content": "a"}, "blocked", "use 'stage'"),
        ("write", {"path": "/output", "content": "a"}, "blocked", "name a file in it"),
        ("delete", {"path": "/output/r.md"}, "pre_approved", "delete /output/r.md"),
        ("delete", {"path": "/data/kept.txt"}, "needs_approval", "/data asks before deletes"),
        ("delete", {"path": "/notes/n.txt"}, "blocked", "deletes in /notes are blocked"),
        ("delete", {"path": "/input/a.txt"}, "blocked", "/input is read-only"),
        ("delete", {"path": "/session"}, "blocked", "it is the root of /session"),
        ("exec", {"command": "rm -rf /data"}, "pre_approved", "run in the sandbox: rm -rf /data"),
        ("stage", {"files": ["/session/a"], "message": "m"}, "pre_approved", "change set"),
        ("context", {}, "pre_approved", "allows"),
    ],
)
def test_decisions_follow_zone_approvals(tools, name, args, status, text):
    decision = tools.needs_approval(name, args)
    assert decision.status == status, decision
    assert text in (decision.reason or decision.description), decision
    if status == "needs_approval":
        assert decision.reason is None
        assert "\n" not in decision.description


def test_the_description_names_the_operation_for_a_person(tools):
    decision = tools.needs_approval("delete", {"path": "/data/kept.txt"})
    assert decision.description == "delete /data/kept.txt (zone /data asks before deletes)"


def test_host_staging_makes_outbox_writes_pre_approved():
    context = {
        "host_staging": True,
        "zones": [{"path": "/staged", "kind": "outbox", "read": False, "write": True}],
    }
    args = {"path": "/staged/r.md", "content": "x", "append": False}
    assert decide("write", args, context).status == "pre_approved"
    assert decide("read", {"path": "/staged/r.md"}, context).status == "blocked"


# -- calls ------------------------------------------------------------------------------------


def test_pre_approved_calls_run_and_answer_json(tools):
    listing = tools.call("list", {"path": "/"})
    assert listing["ok"] is True
    assert [e["name"] for e in listing["result"]["entries"]][:2] == ["data", "input"]
    read = tools.call("read", {"path": "/input/a.txt"})
    assert read["result"]["text"] == "one\ntwo\n"
    assert read["result"]["total_lines"] == 2
    wrote = tools.call("write", {"path": "/output/deep/r.md", "content": "# R\n"})
    assert wrote["result"]["created"] is True
    assert (tools.root / "output" / "deep" / "r.md").read_text() == "# R\n"
    ran = tools.call("exec", {"command": ["echo", "hi"], "cwd": "/session", "timeout": 5})
    assert ran["result"]["stdout"] == "hi\n"
    assert tools.session.execs == [(["echo", "hi"], "/session", None, 5, None)]
    staged = tools.call("stage", {"files": ["/output/deep/r.md"], "message": "report"})
    assert staged == {"ok": True, "result": {"change_set": "cs-1"}}
    assert tools.call("context")["result"]["trust"] == "session"
    json.dumps([listing, read, wrote, ran, staged])


def test_blocked_calls_are_refused_with_guidance_and_audited(tools):
    answer = tools.call("write", {"path": "/input/x.txt", "content": "x"})
    assert answer["ok"] is False
    assert answer["status"] == "blocked"
    assert answer["error"].startswith("Cannot write '/input/x.txt': /input is read-only. Writable:")
    assert not (tools.root / "input" / "x.txt").exists()
    # approved=True never overrides a block
    assert tools.call("delete", {"path": "/notes/n.txt"}, approved=True)["status"] == "blocked"
    assert (tools.root / "notes" / "n.txt").exists()
    entries = refusals(tools)
    assert [e.metadata["tool"] for e in entries] == ["write", "delete"]
    assert entries[0].session_id == tools.session.id
    assert entries[0].allowed is False
    assert entries[0].path == "/input/x.txt"
    assert "read-only" in entries[0].reason


def test_calls_needing_approval_run_only_when_approved(tools):
    answer = tools.call("delete", {"path": "/data/kept.txt"})
    assert answer["status"] == "needs_approval"
    assert (
        answer["error"] == "needs approval: delete /data/kept.txt (zone /data asks before deletes)"
    )
    assert answer["approval"]["status"] == "needs_approval"
    assert tools.call("delete", {"path": "/data/kept.txt"}, approved=True)["ok"] is True
    entries = refusals(tools)
    assert len(entries) == 1
    assert entries[0].metadata["status"] == "needs_approval"
    assert entries[0].reason.startswith("needs approval: delete /data/kept.txt")


def test_invalid_arguments_are_answers_not_exceptions(tools):
    answer = tools.call("read", {"path": "/input/a.txt", "offset": "2"})
    assert answer == {
        "ok": False,
        "error": "Tool 'read': 'offset' must be an integer, not a string",
        "status": "invalid_arguments",
    }
    assert refusals(tools)[0].metadata["status"] == "invalid_arguments"


def test_refusals_of_the_session_itself_come_back_as_tool_errors(tools):
    missing = tools.call("read", {"path": "/input/none.txt"})
    assert missing["ok"] is False
    assert missing["status"] == "failed"
    assert "Cannot read '/input/none.txt'" in missing["error"]
    (tools.root / "output" / "dir").mkdir()
    folder = tools.call("read", {"path": "/output/dir"})
    assert "list it instead" in folder["error"]


def test_call_never_raises_and_its_answers_are_always_utf8(tools, monkeypatch):
    (tools.root / "output").joinpath(os.fsdecode(b"bad\xff.md")).write_text("x")
    listed = tools.call("list", {"path": "/output"})
    assert [e["name"] for e in listed["result"]["entries"]] == ["bad\\xff.md"]
    json.dumps(listed, ensure_ascii=False).encode("utf-8")
    long = tools.call("write", {"path": "/output/" + "a" * 300 + ".md", "content": "x"})
    assert long["ok"] is False and long["status"] == "failed" and "too long" in long["error"]

    def broken(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(tools.session.files, "_listing", broken)
    answer = tools.call("list", {"path": "/output"})
    assert answer == {
        "ok": False,
        "error": "list failed unexpectedly: RuntimeError: a bug",
        "status": "failed",
    }
    (last,) = tools.audit_log.query(AuditFilter(operation="sandbox.list", denied_only=True))
    assert "RuntimeError('a bug')" in last.reason
    monkeypatch.setattr(tools.session, "security_context", broken)
    assert tools.call("read", {"path": "/input/a.txt"})["status"] == "failed"


# -- branch -----------------------------------------------------------------------------------


def test_branch_takes_a_count_of_one_to_four_and_an_optional_snapshot():
    assert validate("branch", {}) == {"count": 1}
    assert validate("branch", {"count": 4, "snapshot": "snap-0123456789ab"}) == {
        "count": 4,
        "snapshot": "snap-0123456789ab",
    }
    for args, message in (
        ({"count": 0}, "'count' must be at least 1"),
        ({"count": 5}, "'count' must be at most 4"),
        ({"count": 2.5}, "'count' must be an integer, not a number"),
        ({"snapshot": ""}, "'snapshot' must not be empty"),
        ({"session": "x"}, "unknown argument 'session' (known: count, snapshot)"),
    ):
        with pytest.raises(InvalidArguments) as raised:
            validate("branch", args)
        assert str(raised.value) == f"Tool 'branch': {message}"


def test_branch_is_blocked_unless_the_worker_declares_checkpoints():
    allowed = {"session": {"checkpoints": True}, "zones": []}
    decision = decide("branch", {"count": 3}, allowed)
    assert decision.status == "pre_approved"
    assert decision.description == "start 3 sandbox(es) from a checkpoint taken now"
    mine = decide("branch", {"count": 1, "snapshot": "snap-0123456789ab"}, allowed)
    assert mine.description == "start 1 sandbox(es) from snap-0123456789ab"
    for context in ({"session": {"checkpoints": False}, "zones": []}, {"zones": []}):
        blocked = decide("branch", {"count": 1}, context)
        assert blocked.status == "blocked"
        assert blocked.reason is not None
        assert "checkpoints: true in its worker file" in blocked.reason
        assert "`orchestrator session fork`" in blocked.reason


def test_a_blocked_branch_never_reaches_the_session_and_is_audited(tools):
    called = []
    tools.session.branch = lambda count, snapshot: called.append((count, snapshot))
    answer = tools.call("branch", {"count": 2}, approved=True)
    assert answer["ok"] is False
    assert answer["status"] == "blocked"
    assert "checkpoints: true" in answer["error"]
    assert called == []
    (refused,) = refusals(tools)
    assert refused.metadata["tool"] == "branch"
    assert refused.metadata["status"] == "blocked"


def test_an_allowed_branch_answers_the_sessions_forks(tools, monkeypatch):
    called = []

    def branch(count, snapshot):
        called.append((count, snapshot))
        return {"sessions": ["a1", "b2"], "snapshot": "snap-0123456789ab", "seconds": 1.5}

    context = tools.session.security_context()
    monkeypatch.setattr(
        tools.session, "security_context", lambda: {**context, "session": {"checkpoints": True}}
    )
    tools.session.branch = branch
    answer = tools.call("branch", {"count": 2})
    assert answer == {
        "ok": True,
        "result": {"sessions": ["a1", "b2"], "snapshot": "snap-0123456789ab", "seconds": 1.5},
    }
    assert tools.call("branch", {"snapshot": "snap-0123456789ab"})["ok"] is True
    assert called == [(2, None), (1, "snap-0123456789ab")]
    assert refusals(tools) == []
