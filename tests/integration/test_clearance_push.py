"""Pushing after clearance: to a bare repository over file://, and to an HTTP remote that
wants a token, served on loopback by this test through git's own http-backend CGI.

Nothing here leaves the machine: the HTTP server listens on 127.0.0.1 only, on a port the
kernel picks.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.clearance import ClearanceError, PushFailed, clear, resolve
from orchestrator.config.models import CredentialConfig
from orchestrator.staging import ChangeStore
from tests.unit.test_clearance_fakes import git, isolate_git, make_repo, stage_real

USER = "x-access-token"


def _http_backend_available() -> bool:
    exec_path = subprocess.run(
        ["git", "--exec-path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return os.access(Path(exec_path) / "git-http-backend", os.X_OK)


# Under CI the HTTP remote test must run: a missing http-backend fails there, never skips.
needs_http_backend = pytest.mark.skipif(
    not _http_backend_available() and os.environ.get("CI", "").lower() not in {"1", "true", "yes"},
    reason="git-http-backend is not installed with this git",
)


class GitHTTPServer:
    """Smart-HTTP git on 127.0.0.1, every request requiring Basic auth with one token."""

    def __init__(self, project_root: Path, token: str) -> None:
        self.project_root = project_root
        self.expected = "Basic " + base64.b64encode(f"{USER}:{token}".encode()).decode()
        self.seen: list[tuple[str, str, bool]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.handle(self)

            def do_POST(self):
                outer.handle(self)

            def log_message(self, *args):  # nothing on stderr, certainly no headers
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def url(self, name: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/{name}"

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        authorised = request.headers.get("Authorization") == self.expected
        self.seen.append((request.command, request.path, authorised))
        if not authorised:
            request.send_response(401)
            request.send_header("WWW-Authenticate", 'Basic realm="test"')
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        body = self._body(request)
        path, _, query = request.path.partition("?")
        env = {
            "PATH": os.environ["PATH"],
            "GIT_PROJECT_ROOT": str(self.project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "REQUEST_METHOD": request.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": request.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": USER,
            "REMOTE_ADDR": "127.0.0.1",
        }
        if request.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = request.headers["Content-Encoding"]
        if request.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = request.headers["Git-Protocol"]
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60
        )
        head, sep, payload = done.stdout.partition(b"\r\n\r\n")
        if not sep:
            head, _, payload = done.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key:
                headers.append((key, value.strip()))
        request.send_response(status)
        for key, value in headers:
            request.send_header(key, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    @staticmethod
    def _body(request: BaseHTTPRequestHandler) -> bytes:
        if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(request.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    request.rfile.readline()
                    return data
                data += request.rfile.read(size)
                request.rfile.readline()
        return request.rfile.read(int(request.headers.get("Content-Length") or 0))


@pytest.fixture
def setup(tmp_path, monkeypatch):
    isolate_git(monkeypatch, tmp_path / "home")
    started = time.time()
    repo = make_repo(tmp_path / "repo", {"README.md": "v1\n"})
    sandbox = repo / ".sandbox"
    (repo / ".git" / "info" / "exclude").write_text(".sandbox/\n")
    store = ChangeStore(sandbox / "changes")
    audit = AuditLog(sandbox / "audit.jsonl")
    served = tmp_path / "served"
    served.mkdir()
    git(served, "init", "-q", "--bare", "project.git")
    git(served / "project.git", "config", "http.receivepack", "true")

    def stage(name="report.md", content=b"findings\n"):
        return stage_real(store.root, tmp_path / "work", new={name: content})

    return {
        "tmp": tmp_path,
        "repo": repo,
        "sandbox": sandbox,
        "store": store,
        "audit": audit,
        "served": served,
        "stage": stage,
        "started": started,
    }


def token_credential(monkeypatch, value: str, audit=None, name="forge"):
    monkeypatch.setenv("FORGE_TOKEN", value)
    config = CredentialConfig(source="env", env="FORGE_TOKEN", mode="explicit")
    return resolve(name, config, audit=audit)


def files_holding(needle: bytes, roots, since: float) -> list[str]:
    """Every regular file under ``roots`` containing ``needle`` (tmp: only recent files)."""
    hits = []
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                path = Path(folder) / name
                try:
                    info = path.lstat()
                    if not path.is_file() or path.is_symlink() or info.st_size > 50 << 20:
                        continue
                    if str(root) == tempfile.gettempdir() and info.st_mtime < since - 1:
                        continue
                    if needle in path.read_bytes():
                        hits.append(str(path))
                except OSError:
                    continue
    return hits


def test_push_to_a_bare_repository_over_file_url(setup):
    remote = setup["tmp"] / "remote.git"
    git(setup["tmp"], "init", "-q", "--bare", str(remote))
    git(setup["repo"], "remote", "add", "origin", f"file://{remote}")
    change_id = setup["stage"]()
    result = clear(setup["store"], change_id, setup["repo"], push=True, audit=setup["audit"])
    assert result.pushed
    assert git(remote, "rev-parse", "refs/heads/main") == result.commit
    operations = [e.operation for e in setup["audit"].query(AuditFilter(operation="clearance.*"))]
    assert operations == ["clearance.committed", "clearance.pushed"]


def test_a_missing_remote_is_refused_before_anything_is_committed(setup):
    change_id = setup["stage"]()
    head = git(setup["repo"], "rev-parse", "HEAD")
    with pytest.raises(ClearanceError, match="no remote named 'origin'"):
        clear(setup["store"], change_id, setup["repo"], push=True)
    assert git(setup["repo"], "rev-parse", "HEAD") == head
    assert setup["store"].get(change_id).status == "pending"


def test_an_explicit_credential_is_never_sent_over_ssh_or_beside_a_url_password(setup, monkeypatch):
    credential = token_credential(monkeypatch, "tok-" + secrets.token_hex(8))
    change_id = setup["stage"]()
    git(setup["repo"], "remote", "add", "origin", "git@forge.invalid:team/project.git")
    with pytest.raises(ClearanceError, match="not an HTTP"):
        clear(setup["store"], change_id, setup["repo"], push=True, credential=credential)
    git(setup["repo"], "remote", "set-url", "origin", "https://me:pw@forge.invalid/p.git")
    with pytest.raises(ClearanceError, match="password in its URL"):
        clear(setup["store"], change_id, setup["repo"], push=True, credential=credential)
    assert setup["store"].get(change_id).status == "pending"


@needs_http_backend
def test_http_push_with_the_right_token(setup, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    token = "tok-" + secrets.token_hex(16)
    marker = setup["tmp"] / "helper-ran"
    with GitHTTPServer(setup["served"], token) as server:
        git(setup["repo"], "remote", "add", "origin", server.url("project.git"))
        # Helpers configured for that URL must not be asked (nor told to store the token).
        helper = f"!f() {{ echo ran >> {marker}; }}; f"
        git(setup["repo"], "config", f"credential.{server.url('')}.helper", helper)
        git(setup["repo"], "config", "credential.helper", helper)
        credential = token_credential(monkeypatch, token, audit=setup["audit"])
        assert token not in repr(credential)
        assert token not in str(credential)
        change_id = setup["stage"]()
        result = clear(
            setup["store"],
            change_id,
            setup["repo"],
            push=True,
            credential=credential,
            audit=setup["audit"],
        )
        assert any(authorised for _, _, authorised in server.seen)
    assert result.pushed
    served = setup["served"] / "project.git"
    assert git(served, "rev-parse", "refs/heads/main") == result.commit
    assert not marker.exists()
    assert git(setup["repo"], "remote", "get-url", "origin") == server.url("project.git")
    used = setup["audit"].query(AuditFilter(operation="credential.used"))
    assert [e.metadata["credential"] for e in used] == ["forge"]
    monkeypatch.delenv("FORGE_TOKEN")
    roots = [setup["sandbox"], setup["repo"] / ".git", setup["tmp"], tempfile.gettempdir()]
    assert files_holding(token.encode(), roots, setup["started"]) == []
    assert token not in caplog.text


@needs_http_backend
def test_http_push_with_a_wrong_token_fails_safely_and_can_be_retried(setup, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    token, wrong = "tok-" + secrets.token_hex(16), "bad-" + secrets.token_hex(16)
    with GitHTTPServer(setup["served"], token) as server:
        git(setup["repo"], "remote", "add", "origin", server.url("project.git"))
        change_id = setup["stage"]()
        bad = token_credential(monkeypatch, wrong, audit=setup["audit"])
        with pytest.raises(PushFailed) as failed:
            clear(
                setup["store"],
                change_id,
                setup["repo"],
                push=True,
                credential=bad,
                audit=setup["audit"],
            )
        message = str(failed.value)
        assert wrong not in message
        assert "the commit is safe" in message
        assert f"orchestrator clear {change_id} --push" in message
        assert len(message.splitlines()) == 1
        commit = failed.value.commit
        # The commit is local and marked; nothing reached the remote.
        assert git(setup["repo"], "rev-parse", "HEAD") == commit
        assert setup["store"].get(change_id).status == "committed"
        assert (
            git(
                setup["served"] / "project.git",
                "rev-parse",
                "--verify",
                "-q",
                "refs/heads/main",
                check=False,
            )
            == ""
        )
        # Inherit mode without any helper: no prompt, a clear failure.
        with pytest.raises(PushFailed):
            clear(setup["store"], change_id, setup["repo"], push=True, audit=setup["audit"])
        # The retry only pushes.
        good = token_credential(monkeypatch, token, audit=setup["audit"])
        again = clear(
            setup["store"],
            change_id,
            setup["repo"],
            push=True,
            credential=good,
            audit=setup["audit"],
        )
    assert again.already
    assert again.pushed
    assert again.commit == commit
    assert git(setup["served"] / "project.git", "rev-parse", "refs/heads/main") == commit
    assert git(setup["repo"], "rev-list", "--count", "HEAD") == "2"
    failures = setup["audit"].query(AuditFilter(operation="clearance.push_failed"))
    assert failures
    assert all(not e.allowed for e in failures)
    monkeypatch.delenv("FORGE_TOKEN")
    roots = [setup["sandbox"], setup["repo"] / ".git", setup["tmp"], tempfile.gettempdir()]
    for secret in (token, wrong):
        assert files_holding(secret.encode(), roots, setup["started"]) == []
        assert secret not in caplog.text
