"""``engine setup --gvisor``'s first step without apt or runsc: the backports suite derived
from the host's own sources (deb822 and one-line), and the check/install/re-check sequence
against a scripted stand-in for the commands it runs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.docker import backports, runsc
from orchestrator.docker.backports import SourcesFile
from orchestrator.errors import EngineError

ARCHIVE = "http://archive.example/debian"
SECURITY = "http://archive.example/debian-security"
DEB822 = f"""Types: deb deb-src
# a comment
URIs: {ARCHIVE}
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
ONE_LINE = f"""# deb cdrom:[Debian]/ bookworm main
deb {ARCHIVE} bookworm main non-free-firmware
deb-src {ARCHIVE} bookworm main
deb [arch=amd64 signed-by=/k.gpg] {ARCHIVE}/mirror bookworm main # trailing
deb {SECURITY} bookworm-security main
deb {ARCHIVE} bookworm-updates main
"""


def test_deb822_sources_give_a_deb822_backports_paragraph_for_the_same_archive():
    made = backports.backports_source([SourcesFile("debian.sources", DEB822)], "bookworm")
    assert made is not None and made.name == "orchestrator-bookworm-backports.sources"
    body = [line for line in made.text.splitlines() if not line.startswith("#")]
    assert body == [
        "Types: deb",
        f"URIs: {ARCHIVE}",
        "Suites: bookworm-backports",
        "Components: main contrib",
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg",
    ]


def test_one_line_sources_give_one_line_backports_entries_with_their_options():
    made = backports.backports_source([SourcesFile("sources.list", ONE_LINE)], "bookworm")
    assert made is not None and made.name == "orchestrator-bookworm-backports.list"
    body = [line for line in made.text.splitlines() if not line.startswith("#")]
    assert body == [
        f"deb {ARCHIVE} bookworm-backports main non-free-firmware",
        f"deb [arch=amd64 signed-by=/k.gpg] {ARCHIVE}/mirror bookworm-backports main",
    ]


def test_an_existing_backports_suite_is_seen_in_either_format():
    files = [SourcesFile("debian.sources", DEB822)]
    assert not backports.has_backports(files, "bookworm")
    listed = SourcesFile("b.list", f"deb {ARCHIVE} bookworm-backports main\n")
    assert backports.has_backports([*files, listed], "bookworm")
    paragraph = f"Types: deb\nURIs: {ARCHIVE}\nSuites: bookworm-backports\nComponents: main\n"
    assert backports.has_backports([SourcesFile("b.sources", paragraph)], "bookworm")
    disabled = SourcesFile("b.sources", paragraph + "Enabled: no\n")
    assert not backports.has_backports([disabled], "bookworm")
    commented = SourcesFile("b.list", f"# deb {ARCHIVE} bookworm-backports main\n")
    assert not backports.has_backports([commented], "bookworm")


def test_no_source_for_the_release_gives_nothing():
    files = [SourcesFile("debian.sources", DEB822)]
    assert backports.backports_source(files, "trixie") is None


# -- check, install, re-check -------------------------------------------------------------


class Host:
    """The commands ``ensure_working`` runs, answered from a script: runsc works once
    ``fixed`` (after apt installed it), apt commands succeed unless told otherwise."""

    def __init__(self, *, works: bool, apt_fails: bool = False) -> None:
        self.works = works
        self.apt_fails = apt_fails
        self.commands: list[list[str]] = []

    def __call__(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command = list(command)
        self.commands.append(command)
        if command[0] == "apt-get":
            if self.apt_fails:
                return subprocess.CompletedProcess(command, 100, "", "E: Unable to locate runsc")
            if command[1] == "install":
                self.works = True
            return subprocess.CompletedProcess(command, 0, "", "")
        if command[1] == "--version":
            release = "20240729" if self.works else "20221219"
            return subprocess.CompletedProcess(command, 0, f"runsc version 0.0~{release}.0\n", "")
        if self.works:
            return subprocess.CompletedProcess(command, 0, "total 0\n", "")
        return subprocess.CompletedProcess(
            command, 2, "", f"ls: cannot access '{command[-1]}': Invalid argument\n"
        )


@pytest.fixture
def apt_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    (tmp_path / "os-release").write_text('NAME="Debian"\nVERSION_CODENAME=bookworm\n')
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    return {
        "os_release": tmp_path / "os-release",
        "sources_list": tmp_path / "sources.list",
        "sources_d": tmp_path / "sources.list.d",
        "locate": lambda: "/usr/bin/runsc",
    }


def test_a_working_runsc_is_left_alone(apt_host):
    host = Host(works=True)
    outcome = runsc.ensure_working(run=host, **apt_host)
    assert (outcome.installed, outcome.source_written) == (False, None)
    assert outcome.version == "runsc version 0.0~20240729.0"
    assert not [c for c in host.commands if c[0] == "apt-get"]
    checks = [c[1:] for c in host.commands if "do" in c]
    assert checks == [
        ["--network=none", "do", "ls", "-l", "/etc/apt"],
        ["--network=none", "do", "stat", "/etc/hostname"],
    ]


def test_a_broken_runsc_is_replaced_from_backports_added_for_the_host_archive(apt_host):
    host = Host(works=False)
    said: list[str] = []
    outcome = runsc.ensure_working(run=host, say=said.append, **apt_host)
    assert outcome.installed and outcome.version == "runsc version 0.0~20240729.0"
    written = apt_host["sources_d"] / "orchestrator-bookworm-backports.sources"
    assert outcome.source_written == written
    assert f"URIs: {ARCHIVE}\nSuites: bookworm-backports\n" in written.read_text()
    assert [c for c in host.commands if c[0] == "apt-get"] == [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "-t", "bookworm-backports", "runsc"],
    ]
    assert "Invalid argument" in said[0] and "0.0~20221219" in said[0]
    again = runsc.ensure_working(run=host, **apt_host)  # the suite is there now
    assert not again.installed and again.source_written is None


def test_a_host_with_backports_gets_no_second_source(apt_host):
    (apt_host["sources_d"] / "bpo.list").write_text(f"deb {ARCHIVE} bookworm-backports main\n")
    outcome = runsc.ensure_working(run=Host(works=False), **apt_host)
    assert outcome.installed and outcome.source_written is None


def test_no_working_runsc_is_one_line_naming_the_failure_and_the_fix(apt_host):
    with pytest.raises(EngineError) as failed:
        runsc.ensure_working(run=Host(works=False, apt_fails=True), **apt_host)
    message = str(failed.value)
    assert "\n" not in message
    assert "0.0~20221219" in message and "Invalid argument" in message
    assert "Unable to locate runsc" in message
    assert "apt-get install -t bookworm-backports runsc" in message
    assert "engine setup --gvisor" in message


def test_backports_that_do_not_help_are_not_kept_silently(apt_host):
    class StillBroken(Host):
        def __call__(self, command):
            done = super().__call__(command)
            self.works = False
            return done

    with pytest.raises(EngineError, match="bookworm-backports's runsc fails too"):
        runsc.ensure_working(run=StillBroken(works=False), **apt_host)


def test_not_root_is_refused_before_anything_runs(apt_host, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    host = Host(works=True)
    with pytest.raises(EngineError, match="need root"):
        runsc.ensure_working(run=host, **apt_host)
    assert host.commands == []
