"""A runsc that runs everyday tools: checked, and if need be installed from backports.

gVisor's kernel has to serve what ordinary tools ask of it. Debian 12's own runsc
(0.0~20221219) refuses ``statx`` with ``AT_NO_AUTOMOUNT``, which coreutils use: ``ls DIR``
and ``stat FILE`` fail with "Invalid argument" in every untrusted worker. The release's
backports suite has 0.0~20240729, which serves them. So "working" is checked, never assumed
from a version: :func:`problem` runs ``runsc --network=none do ls -l /etc/apt`` and
``do stat /etc/hostname`` (``runsc do`` needs root, as the set-up does).

:func:`ensure_working` is the set-up's first step (``orchestrator engine setup --gvisor``,
run by ``scripts/ensure-engine.sh`` for ``make``): a runsc that works is left alone;
otherwise runsc alone is installed from ``RELEASE-backports`` through the host's own apt
configuration, the suite added (:mod:`.backports`) when the host lacks it, and checked
again. If no working runsc can be had it raises :class:`EngineError`, one line with the
fix: a broken runsc is never kept silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.docker import backports
from orchestrator.errors import EngineError

#: The first runsc known to serve coreutils' ``statx`` (Debian's bookworm-backports build).
MINIMUM = "0.0~20240729"
#: What the check runs under ``runsc --network=none do``: (what, command).
CHECKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ls -l /etc/apt", ("ls", "-l", "/etc/apt")),
    ("stat /etc/hostname", ("stat", "/etc/hostname")),
)
CHECK_TIMEOUT_S = 60
APT_TIMEOUT_S = 900
SOURCES_D = Path("/etc/apt/sources.list.d")
SOURCES_LIST = Path("/etc/apt/sources.list")
OS_RELEASE = Path("/etc/os-release")

Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
Say = Callable[[str], None]


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    apt = command[0] == "apt-get"
    return subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        timeout=APT_TIMEOUT_S if apt else CHECK_TIMEOUT_S,
        check=False,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def find() -> str | None:
    """runsc's path, or None when it is not installed."""
    found = shutil.which("runsc")
    if found:
        return found
    for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"):
        path = Path(folder) / "runsc"
        if os.access(path, os.X_OK):
            return str(path)
    return None


def version(path: str, run: Run = _run) -> str:
    """``runsc --version``'s first line (``runsc version 0.0~20240729.0``), or why not."""
    try:
        done = run([path, "--version"])
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else f"unknown (exit {done.returncode})"


def problem(path: str, run: Run = _run) -> str | None:
    """Why ``path`` cannot run everyday tools (the failing command and its message), or
    None when it can."""
    for what, command in CHECKS:
        try:
            done = run([path, "--network=none", "do", *command])
        except (OSError, subprocess.SubprocessError) as exc:
            return f"`runsc do {what}`: {exc}"
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            return f"`runsc do {what}` exited {done.returncode}: {said[-1] if said else ''}"
    return None


@dataclass
class Outcome:
    """What :func:`ensure_working` found and did."""

    path: str
    version: str
    installed: bool = False
    """runsc was installed or upgraded from backports."""
    source_written: Path | None = None
    """The backports sources file written (None: the host had the suite already)."""
    done: list[str] = field(default_factory=list)


def release(os_release: Path = OS_RELEASE) -> str | None:
    """The host's release code name (``VERSION_CODENAME``), or None."""
    try:
        text = os_release.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "VERSION_CODENAME":
            return value.strip().strip("\"'") or None
    return None


def host_sources(
    sources_list: Path = SOURCES_LIST, folder: Path = SOURCES_D
) -> list[backports.SourcesFile]:
    """The apt sources files apt reads (``sources.list``, ``*.list``, ``*.sources``)."""
    files = [sources_list] if sources_list.is_file() else []
    if folder.is_dir():
        files += sorted(p for p in folder.iterdir() if p.suffix in (".list", ".sources"))
    found = []
    for path in files:
        try:
            found.append(backports.SourcesFile(path.name, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return found


def ensure_working(
    *,
    run: Run = _run,
    say: Say = lambda _: None,
    os_release: Path = OS_RELEASE,
    sources_list: Path = SOURCES_LIST,
    sources_d: Path = SOURCES_D,
    locate: Callable[[], str | None] = find,
) -> Outcome:
    """A runsc that passes :func:`problem`: the installed one, or one from backports."""
    if os.geteuid() != 0:
        raise EngineError(
            "checking runsc (`runsc do`) and installing it need root: "
            "`sudo orchestrator engine setup --gvisor`"
        )
    path = locate()
    if path is not None:
        why = problem(path, run)
        if why is None:
            return Outcome(path, version(path, run))
        say(f"{version(path, run)} at {path} cannot run everyday tools ({why})")
    else:
        why = "runsc is not installed"
    code = release(os_release)
    if code is None:
        raise EngineError(_give_up(path, why, run, f"{os_release} names no release"))
    outcome = Outcome(path or "", "")
    files = host_sources(sources_list, sources_d)
    if not backports.has_backports(files, code):
        source = backports.backports_source(files, code)
        if source is None:
            raise EngineError(_give_up(path, why, run, f"no apt source names the release '{code}'"))
        target = sources_d / source.name
        _write(target, source.text)
        outcome.source_written = target
        say(f"added {backports.suite(code)} for the host's own archives: {target}")
    say(f"installing runsc from {backports.suite(code)} (apt-get install -t)")
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "-t", backports.suite(code), "runsc"],
    ):
        try:
            done = run(command)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EngineError(_give_up(path, why, run, f"`{command[0]}`: {exc}")) from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            failed = f"`{' '.join(command)}` failed: {said[-1] if said else ''}"
            raise EngineError(_give_up(path, why, run, failed))
    outcome.installed = True
    new = locate()
    if new is None:
        raise EngineError(_give_up(path, why, run, "apt installed no runsc"))
    after = problem(new, run)
    if after is not None:
        raise EngineError(_give_up(new, after, run, f"{backports.suite(code)}'s runsc fails too"))
    outcome.path, outcome.version = new, version(new, run)
    return outcome


def _write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.chmod(0o644)
    os.replace(temporary, path)


def _give_up(path: str | None, why: str, run: Run, reason: str) -> str:
    """One line: which runsc fails and how, why no better one came, the fix."""
    which = f"{version(path, run)} at {path}" if path else "runsc"
    return (
        f"{which} cannot run everyday tools under gVisor ({why}), and no working one could be "
        f"installed ({reason}): install runsc {MINIMUM} or later (Debian 12: `apt-get install "
        "-t bookworm-backports runsc`; or gVisor's own release), then run "
        "`sudo orchestrator engine setup --gvisor` again"
    )
