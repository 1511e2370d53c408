"""Review helpers: escaping, the diff a hostile file cannot subvert, scanners, audit entries."""

from __future__ import annotations

import base64
import io
import os
import re
from pathlib import Path

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config.models import OutboxLimits
from orchestrator.errors import AuditError
from orchestrator.staging import (
    DEFAULT_SCANNERS,
    ChangeMeta,
    ChangeSet,
    ChangeStore,
    ChangeTarget,
    ContentScanner,
    Scanner,
    ScanResult,
    SecretScanner,
    SensitivePathScanner,
    SizeScanner,
    SuffixScanner,
    blocking,
    collect_dir,
    collect_tar,
    create_and_audit,
    describe_type,
    escape,
    render_diff,
    run_scanners,
)
from tests.unit.test_staging_support import END, LIMITS, header, member

META = ChangeMeta(worker="w", trust="untrusted", target=ChangeTarget.repo(), run_id="r")
OUR_CODES = re.compile(r"\x1b\[(?:0|1|31|32|33|36)m")


@pytest.fixture
def store(tmp_path: Path) -> ChangeStore:
    return ChangeStore(tmp_path / "changes")


def change_of(
    store: ChangeStore,
    tmp_path: Path,
    files: dict[str, bytes],
    *,
    base: Path | None = None,
    limits: OutboxLimits = LIMITS,
) -> ChangeSet:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    with collect_dir(out, base=base, limits=limits, tmp_dir=tmp_path) as found:
        return store.create(found, META)


def test_escape_makes_every_terminal_trick_visible() -> None:
    hostile = "a\x1b[2Jb\rc\x07d\x9be\u202ef\u200bg\\h\udcffi\x00j\u2028k"
    shown = escape(hostile)
    assert shown == "a\\x1b[2Jb\\rc\\x07d\\x9be\\u202ef\\u200bg\\\\h\\xffi\\x00j\\u2028k"
    assert shown.isprintable()
    assert escape("tab\there\n", keep="\t") == "tab\there\\n"


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"%PDF-1.7\n", "PDF document"),
        (b"\x89PNG\r\n\x1a\n\0\0", "PNG image"),
        (b"PK\x03\x04\x14\0", "ZIP archive"),
        (b"\x7fELF\x02\x01", "ELF executable"),
        (b"MZ\x90\0", "Windows executable"),
        (b"\x1f\x8b\x08\0", "gzip"),
        (b"\0\x01\x02", "binary data"),
        (b"plain words\n", "text"),
    ],
)
def test_describe_type(data: bytes, kind: str) -> None:
    assert describe_type(data).startswith(kind)


def test_the_diff_escapes_control_characters(store: ChangeStore, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "notes.md").write_bytes(b"line one\nline two\n")
    hostile = b"line one\n\x1b]0;owned\x07\x1b[2J\rfake clean line\nbidi \xe2\x80\xae txt\n"
    change = change_of(store, tmp_path, {"notes.md": hostile})
    for color in (False, True):
        text = render_diff(change, store, repo, color=color)
        assert "\x1b" not in OUR_CODES.sub("", text)
        assert "\r" not in text and "\x07" not in text and "\u202e" not in text
        assert "\\x1b]0;owned\\x07\\x1b[2J\\rfake clean line" in text
        assert "bidi \\u202e txt" in text
    plain = render_diff(change, store, repo, color=False)
    assert "-line two" in plain and "+bidi \\u202e txt" in plain
    assert "\x1b" not in plain
    coloured = render_diff(change, store, repo, color=True)
    assert "\x1b[31m-line two\x1b[0m" in coloured and "\x1b[32m+" in coloured


def test_binary_files_are_summarised(store: ChangeStore, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "doc.pdf").write_bytes(b"%PDF-1.4 old" + bytes(range(256)))
    # A real PNG's first chunk length holds NUL bytes (a file without any is shown as text).
    png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + os.urandom(292)
    change = change_of(store, tmp_path, {"doc.pdf": b"%PDF-1.7\n\0\x1b[2J", "img.png": png})
    text = render_diff(change, store, repo, color=False)
    assert "- was: PDF document, 268 bytes, sha256 " in text
    assert "+ now: PDF document, 14 bytes, sha256 " in text
    assert "+ now: PNG image, 308 bytes" in text
    assert "\x1b" not in text and "@@" not in text


def test_deletions_updates_modes_and_missing_newlines(store: ChangeStore, tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "old.md").write_bytes(b"gone\nfor good\n")
    (base / "run.sh").write_bytes(b"echo hi\n")
    (base / "tail.md").write_bytes(b"a\nb")
    change = change_of(store, tmp_path, {"run.sh": b"echo hi\n", "tail.md": b"a\nc"}, base=base)
    os.chmod(tmp_path / "out" / "run.sh", 0o755)
    change = change_of(store, tmp_path, {}, base=base)
    text = render_diff(change, store, base, color=False)
    assert "delete, 0 bytes" in text and "-gone\n-for good\n" in text
    assert "mode changes from 0644 to 0755" in text
    assert "-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n" in text


def test_a_symlinked_target_is_flagged_and_never_read(store: ChangeStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"TOP-SECRET-VALUE\n")
    repo = tmp_path / "repo"
    (repo / "real").mkdir(parents=True)
    os.symlink(secret, repo / "notes.md")
    os.symlink(tmp_path, repo / "sub")
    os.mkfifo(repo / "pipe.md")
    change = change_of(
        store, tmp_path, {"notes.md": b"new\n", "sub/secret.txt": b"x\n", "pipe.md": b"p\n"}
    )
    text = render_diff(change, store, repo, color=False)
    assert "TOP-SECRET-VALUE" not in text
    assert "'notes.md' is a symbolic link to" in text
    assert "'sub' is a symbolic link to" in text
    assert "'pipe.md' is a FIFO" in text


def test_the_diff_notices_a_target_changed_since_collection(
    store: ChangeStore, tmp_path: Path
) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "a.md").write_bytes(b"v1\n")
    change = change_of(store, tmp_path, {"a.md": b"v2\n"}, base=base)
    (base / "a.md").write_bytes(b"v1 edited meanwhile\n")
    assert "the target changed since this change set was made" in render_diff(
        change, store, base, color=False
    )
    assert "the target is not in the project" in render_diff(change, store, None, color=False)


def scan(
    scanner: Scanner, store: ChangeStore, tmp_path: Path, files: dict[str, bytes]
) -> ScanResult:
    return scanner.scan(change_of(store, tmp_path, files), store)


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"x\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n", "private key (PEM) on line 2"),
        (b"-----BEGIN PGP PRIVATE KEY BLOCK-----", "private key (PEM) on line 1"),
        (b"aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n", "AWS access key id on line 1"),
        (b"token: ghp_" + b"a1B2" * 9 + b"\n", "GitHub token on line 1"),
        (b"github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "GitHub fine-grained token"),
        (b"SLACK=xoxb-1234567890-abcdefghij\n", "Slack token"),
        (b"url https://hooks.slack.com/services/T000/B000/XXXX", "Slack webhook"),
        (b'db_password = "correct-horse-battery"\n', "password or key assignment"),
        (b"API_KEY: 0123456789abcdef0123\n", "password or key assignment"),
    ],
)
def test_the_secret_scanner_finds_and_never_repeats_the_secret(
    store: ChangeStore, tmp_path: Path, content: bytes, what: str
) -> None:
    result = scan(SecretScanner(), store, tmp_path, {"config.txt": content})
    assert not result.ok
    assert what in result.findings[0].message
    assert all(
        b"AKIA" not in f.message.encode() and "horse" not in f.message for f in result.findings
    )


def test_the_secret_scanner_sees_across_chunk_borders(store: ChangeStore, tmp_path: Path) -> None:
    content = b"a\n" * 524_287 + b"xx" + b"AKIAIOSFODNN7EXAMPLE\n"  # straddles the 1 MiB read
    big = OutboxLimits(size=4 << 20, max_files=10, max_file_size=2 << 20)
    result = SecretScanner().scan(
        change_of(store, tmp_path, {"big.txt": content}, limits=big), store
    )
    assert [f.message for f in result.findings] == ["AWS access key id on line 524288"]


def test_clean_content_passes_every_default_scanner(store: ChangeStore, tmp_path: Path) -> None:
    files = {
        "README.md": b"# Title\n\nSome prose about passwords in general.\npassword = short\n",
        "data.json": b'{"api_key": null, "items": [1, 2, 3]}\n',
    }
    change = change_of(store, tmp_path, files)
    results = run_scanners(change, store)
    assert [r.name for r in results] == [s.name for s in DEFAULT_SCANNERS]
    assert blocking(results) == [] and all(r.ok for r in results)


def test_content_scanner(store: ChangeStore, tmp_path: Path) -> None:
    encoded = base64.b64encode(os.urandom(6000))
    result = scan(
        ContentScanner(), store, tmp_path,
        {"a.bin": b"\x7fELF\x02\0\0", "b.txt": encoded, "c.md": b"words " * 500},
    )  # fmt: skip
    assert {f.path: f.message.split(" (")[0] for f in result.findings} == {
        "a.bin": "binary content: ELF executable or library",
        "b.txt": "high-entropy text",
    }


def test_size_suffix_and_sensitive_path_scanners(store: ChangeStore, tmp_path: Path) -> None:
    files = {
        "big.md": b"x" * 2000,
        "tool.exe": b"MZ",
        "notes.txt": b"n",
        ".github/workflows/ci.yml": b"on: push",
        "sub/.gitattributes": b"* filter=evil",
    }
    change = change_of(store, tmp_path, files)
    size = SizeScanner(max_file_size=1000, max_total=2000).scan(change, store)
    assert {f.path for f in size.findings} == {"big.md", ""}
    suffix = SuffixScanner(allowed=(".md", ".exe", ".yml", ".gitattributes")).scan(change, store)
    assert {f.path: f.message for f in suffix.findings} == {
        "notes.txt": "suffix is not in this target's allowlist",
        "tool.exe": "executable or script file type",
    }
    assert SuffixScanner().scan(change, store).findings[0].path == "tool.exe"
    sensitive = SensitivePathScanner().scan(change, store)
    assert {f.path for f in sensitive.findings} == {
        ".github/workflows/ci.yml",
        "sub/.gitattributes",
    }


def test_a_crashing_scanner_fails_closed(store: ChangeStore, tmp_path: Path) -> None:
    class Broken:
        name = "broken"

        def scan(self, change, store):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    change = change_of(store, tmp_path, {"a.md": b"a"})
    [result] = run_scanners(change, store, [Broken()])
    assert not result.ok and "RuntimeError: boom" in result.findings[0].message
    assert blocking([result, ScanResult("ok", True)]) == [result]


def test_create_and_audit_records_the_change_and_every_rejection(
    store: ChangeStore, tmp_path: Path
) -> None:
    raw = (
        member(b"a.md", b"a")
        + header(b"link", kind=b"2", linkname=b"/etc/shadow")
        + member(b"../up", b"u")
        + END
    )
    log = AuditLog(tmp_path / "audit.jsonl")
    with collect_tar(io.BytesIO(raw), limits=LIMITS, tmp_dir=tmp_path) as found:
        change = create_and_audit(store, found, META, log)
    entries = list(log.query(AuditFilter()))
    assert [e.operation for e in entries] == [
        "change.created",
        "change.entry_rejected",
        "change.entry_rejected",
    ]
    assert entries[0].metadata["change_id"] == change.id and entries[0].metadata["files"] == 1
    assert [(e.allowed, e.path) for e in entries[1:]] == [(False, "link"), (False, "../up")]
    assert "symbolic link" in (entries[1].reason or "")
    assert log.verify().ok


def test_an_unauditable_change_set_is_discarded(
    store: ChangeStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AuditError("cannot write audit log: disk full")

    monkeypatch.setattr(log, "record", refuse)
    with (
        collect_tar(
            io.BytesIO(member(b"a.md", b"a") + END), limits=LIMITS, tmp_dir=tmp_path
        ) as found,
        pytest.raises(AuditError),
    ):
        create_and_audit(store, found, META, log)
    [change] = store.list()
    assert change.status == "discarded"


def test_hooks_and_executables_are_sensitive_findings():
    from orchestrator.staging.scanners import SensitivePathScanner

    class Change:
        files = ()

    from orchestrator.staging.manifest import ChangeFile

    change = Change()
    change.files = (
        ChangeFile(".githooks/pre-commit", "create", 10, "0" * 64, 0o755),
        ChangeFile("tools/run", "create", 10, "1" * 64, 0o755),
        ChangeFile(".devcontainer.json", "create", 10, "2" * 64, 0o644),
        ChangeFile("report.md", "create", 10, "3" * 64, 0o644),
    )
    result = SensitivePathScanner().scan(change, store=None)
    assert not result.ok
    assert {f.path for f in result.findings} == {
        ".githooks/pre-commit",
        "tools/run",
        ".devcontainer.json",
    }


def test_binary_hidden_behind_text_is_found(store: ChangeStore, tmp_path: Path) -> None:
    prose = b"A long and harmless report line.\n" * 3000  # ~100 KB of text first
    big = OutboxLimits(size=1 << 20, max_files=10, max_file_size=1 << 20)
    files = {"report.md": prose + b"\x7fELF\x02\x01\x01\0\0\0payload"}
    change = change_of(store, tmp_path, files, limits=big)
    results = {r.name: r for r in run_scanners(change, store)}
    assert not results["binary"].ok
    assert "binary content from byte" in results["binary"].findings[0].message


def test_invisible_characters_are_shown_and_refused_in_names() -> None:
    from orchestrator.staging.content import escape
    from orchestrator.staging.names import UnsafeName, safe_path

    hidden = "Summary\U000e0049\U000e0067\U000e006e\u00ad."  # tag characters spell hidden text
    assert escape(hidden) == "Summary\\U000e0049\\U000e0067\\U000e006e\\xad."
    for name in ("notes\u00ad.md", "x\U000e0041.md", "a\ufe0f.md", "p\ue000.md"):
        with pytest.raises(UnsafeName, match="invisible"):
            safe_path(name)
