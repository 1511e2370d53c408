"""The triage example: its program on hostile input, and its declarations.

No Docker here: ``tools/triage.py`` runs as a plain subprocess on a copy of the shipped
downloads, plus entries that cannot live in a repository (a symlink to a host file, a
directory symlink, a FIFO, a file name that is not UTF-8), which are made at run time.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.tracked import copy_tracked

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "triage"
SCRIPT = EXAMPLE / "tools" / "triage.py"
SECRET = "HOST-SECRET-7f3a9c"
NON_UTF8_NAME = b"caf\xe9-menu.txt"


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    entries: dict[str, dict[str, Any]]
    json_text: str
    md_text: str
    output: Path
    host: Path


def run_triage(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--input", str(src), "--output", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO opened for reading would block: the timeout turns that into a failure
        check=False,
    )


def marker_ids(entry: dict[str, Any]) -> set[str]:
    return {marker["id"] for marker in entry["markers"]}


@pytest.fixture(scope="module")
def triaged(tmp_path_factory: pytest.TempPathFactory) -> Run:
    base = tmp_path_factory.mktemp("triage")
    host = base / "host"
    host.mkdir()
    (host / "secret.txt").write_text(f"{SECRET}\n")

    src = base / "downloads"
    copy_tracked("examples/triage/downloads", src)
    (src / "passwords.txt").symlink_to(host / "secret.txt")
    (src / "hostdir").symlink_to(host, target_is_directory=True)
    os.mkfifo(src / "pipe.fifo")
    with open(os.path.join(os.fsencode(src), NON_UTF8_NAME), "wb") as handle:
        handle.write(b"Soup of the day: leek and potato.\n")
    (src / "nested" / "deeper").mkdir(parents=True)
    (src / "nested" / "deeper" / "todo.txt").write_text("water the plants\n")
    (src / "holiday.jpg").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    (src / "smuggled.txt").write_text(
        "Nothing to see\u200b here." + "".join(chr(0xE0000 + ord(c)) for c in "hidden note") + "\n",
        encoding="utf-8",
    )
    with zipfile.ZipFile(src / "archive.zip", "w") as archive:
        archive.writestr("../../outside/job.txt", "harmless\n")
        archive.writestr("docs/report.pdf.exe", "harmless placeholder\n")

    out = base / "output"
    proc = run_triage(src, out)
    json_text = (out / "report.json").read_text() if (out / "report.json").exists() else ""
    md_text = (out / "report.md").read_text() if (out / "report.md").exists() else ""
    report = json.loads(json_text) if json_text else {"entries": []}
    entries = {entry["path"]: entry for entry in report["entries"]}
    return Run(proc, report, entries, json_text, md_text, out, host)


def test_exits_zero_and_writes_both_reports(triaged: Run) -> None:
    assert triaged.proc.returncode == 0, triaged.proc.stderr
    assert triaged.json_text
    assert triaged.md_text.startswith("# Triage report")
    # Atomic writes leave no temporary files behind.
    assert sorted(p.name for p in triaged.output.iterdir()) == ["report.json", "report.md"]
    assert "triage: " in triaged.proc.stdout.splitlines()[-1]


def test_every_entry_is_listed_with_its_kind_and_type(triaged: Run) -> None:
    expected = {
        "invoice.pdf.exe": ("file", "text"),
        "invoice_2024-03.html": ("file", "html"),
        "meeting-notes.txt": ("file", "text"),
        "scan_0042.pdf": ("file", "html"),
        "statement.pdf": ("file", "pdf"),
        "support-article.html": ("file", "html"),
        "passwords.txt": ("symlink", None),
        "hostdir": ("symlink", None),
        "pipe.fifo": ("other", None),
        "caf\\xe9-menu.txt": ("file", "text"),
        "nested": ("dir", None),
        "nested/deeper": ("dir", None),
        "nested/deeper/todo.txt": ("file", "text"),
        "holiday.jpg": ("file", "elf"),
        "smuggled.txt": ("file", "text"),
        "archive.zip": ("file", "zip"),
    }
    assert set(triaged.entries) == set(expected)
    for path, (kind, kind_of_content) in expected.items():
        entry = triaged.entries[path]
        assert entry["kind"] == kind, path
        assert entry.get("type") == kind_of_content, path
    summary = triaged.report["summary"]
    assert summary["entries"] == len(expected)
    assert summary["complete"] is True
    assert summary["by_kind"] == {"dir": 2, "file": 11, "other": 1, "symlink": 2}
    assert summary["suspicious"] == sum(e["suspicious"] for e in triaged.entries.values())


def test_files_are_hashed_completely(triaged: Run) -> None:
    notes = triaged.entries["meeting-notes.txt"]
    data = (EXAMPLE / "downloads" / "meeting-notes.txt").read_bytes()
    assert notes["sha256"] == hashlib.sha256(data).hexdigest()
    assert notes["hash_complete"] is True
    assert notes["size"] == len(data)
    assert notes["suspicious"] is False


def test_symlinks_are_reported_never_followed(triaged: Run) -> None:
    link = triaged.entries["passwords.txt"]
    assert link["symlink_target"] == str(triaged.host / "secret.txt")
    assert "symlink-escapes" in marker_ids(link)
    assert "sha256" not in link
    assert "hostdir/secret.txt" not in triaged.entries
    for text in (triaged.json_text, triaged.md_text, triaged.proc.stdout, triaged.proc.stderr):
        assert SECRET not in text


def test_fifo_is_reported_without_being_opened(triaged: Run) -> None:
    fifo = triaged.entries["pipe.fifo"]
    assert fifo["other_type"] == "fifo"
    assert "special-file" in marker_ids(fifo)


def test_non_utf8_name_is_escaped(triaged: Run) -> None:
    entry = triaged.entries["caf\\xe9-menu.txt"]
    assert entry["raw_path_hex"] == NON_UTF8_NAME.hex()
    assert "leek and potato" in entry["excerpt"]
    triaged.json_text.encode("ascii")  # the JSON report stays plain ASCII


def test_fake_pdf_actions_and_text(triaged: Run) -> None:
    pdf = triaged.entries["statement.pdf"]
    assert {"pdf-open-action", "pdf-javascript", "pdf-js"} <= marker_ids(pdf)
    assert "Account statement - March 2024" in pdf["excerpt"]
    assert "Balance due: EUR 0.00" in pdf["excerpt"]


def test_html_pages_are_flagged(triaged: Run) -> None:
    invoice = triaged.entries["invoice_2024-03.html"]
    assert {
        "script-tag",
        "hidden-iframe",
        "inline-event-handler",
        "eval-call",
        "atob-call",
        "cookie-access",
        "javascript-url",
        "long-base64",
    } <= marker_ids(invoice)
    assert "Amount due: \u20ac 1,284.00" in invoice["excerpt"]  # entities decoded
    assert "eval" not in invoice["excerpt"]  # script bodies are not text

    article = triaged.entries["support-article.html"]
    assert "prompt-injection" in marker_ids(article)
    assert "ignore previous instructions" in next(
        m["evidence"] for m in article["markers"] if m["id"] == "prompt-injection"
    )


def test_disguised_names_and_contents_are_flagged(triaged: Run) -> None:
    fake_pdf = triaged.entries["scan_0042.pdf"]
    assert {"suffix-mismatch", "password-field"} <= marker_ids(fake_pdf)
    assert "double-extension" in marker_ids(triaged.entries["invoice.pdf.exe"])
    elf = triaged.entries["holiday.jpg"]
    assert {"executable-magic", "suffix-mismatch"} <= marker_ids(elf)
    archive = triaged.entries["archive.zip"]
    assert {"zip-path-traversal", "zip-double-extension"} <= marker_ids(archive)
    smuggled = triaged.entries["smuggled.txt"]
    assert {"invisible-unicode", "unicode-tag-smuggling"} <= marker_ids(smuggled)
    assert "\u200b" not in smuggled["excerpt"]  # invisible characters are shown escaped


def test_markdown_lists_files_and_markers(triaged: Run) -> None:
    assert "| Path |" in triaged.md_text
    assert "statement.pdf" in triaged.md_text
    assert "pdf-open-action" in triaged.md_text
    assert "prompt-injection" in triaged.md_text


def test_caps_are_reported(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(10_000))
    for index in range(5):
        (src / f"f{index}.txt").write_text("x\n")
    proc = run_triage(src, tmp_path / "out", "--read-cap", "1024", "--hash-cap", "4096")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    big = next(e for e in report["entries"] if e["path"] == "big.bin")
    assert big["hash_complete"] is False
    assert big["hashed_bytes"] == 4096
    assert any("first 4096 bytes" in note for note in big["notes"])

    proc = run_triage(src, tmp_path / "out2", "--max-files", "3")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out2" / "report.json").read_text())
    assert len(report["entries"]) == 3
    assert report["summary"]["complete"] is False


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert run_triage(tmp_path / "missing", tmp_path / "out").returncode == 2
    (tmp_path / "in").mkdir()
    assert run_triage(tmp_path / "in", tmp_path / "in" / "out").returncode == 2
    assert not (tmp_path / "in" / "out").exists()  # refused before anything was created


def test_declarations_load() -> None:
    from orchestrator.config import load_project, load_worker

    project = load_project(EXAMPLE)
    assert {name: zone.mode for name, zone in project.zones.items()} == {
        "input": "ro",
        "tools": "ro",
        "output": "rw",
    }
    worker = load_worker(project, "triage")
    assert worker.config.network == "none"
    assert worker.config.command is not None
    assert worker.config.command[1] == "/tools/triage.py"
    assert worker.instructions
