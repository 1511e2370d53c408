"""Everyday tools under gVisor: one untrusted worker, through the production path.

gVisor serves a worker's system calls with its own kernel, and an old runsc refuses some
that ordinary tools make (Debian 12's 0.0~20221219: coreutils' ``statx`` with
``AT_NO_AUTOMOUNT``, so ``ls DIR`` and ``stat FILE`` fail with "Invalid argument"). The
doctor writes a throw-away project with a read-only zone (:data:`.everyday.FILES`), an
``untrusted_output`` zone and, when the host has git, a read-only copy of it (the default
worker image has none; the host's binary runs in the image of the same release), and runs
ONE untrusted gVisor worker through :class:`~orchestrator.Orchestrator`: it runs
:mod:`.everyday`, which reports each operation's result. A failure names the operations,
the runsc version and the fix.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from orchestrator.doctor import everyday
from orchestrator.doctor.checks import Check
from orchestrator.errors import OrchestratorError

NAME = "everyday tools (gvisor)"
RUN_TIMEOUT = 120
WORKER = "everyday"

Progress = Callable[[str], None]


def everyday_check(*, image: str, runsc_version: str, progress: Progress = lambda _: None) -> Check:
    """Run the operations in one gVisor worker; one row naming what failed."""
    from orchestrator.runner import Orchestrator

    folder = Path(tempfile.mkdtemp(prefix="orchestrator-doctor-tools-"))
    try:
        write_project(folder, image)
        progress("everyday tools: one untrusted worker under gvisor")
        try:
            with Orchestrator(folder) as orch:
                result = orch.run(WORKER)
        except OrchestratorError as exc:
            return Check(NAME, "fail", f"could not run: {exc}", None)
        return judge(parse(result.stdout), runsc_version, result.stderr or result.error or "")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_project(folder: Path, image: str, *, isolation: str = "gvisor") -> None:
    """The throw-away project: zones ``data`` (ro), ``out`` (rw, untrusted output) and
    ``tools`` (ro: the host's git, if any), and the worker ``everyday``."""
    for rel, text in everyday.FILES.items():
        path = folder / "data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (folder / "out").mkdir()
    (folder / "tools").mkdir()
    host_git = shutil.which("git")
    if host_git:
        shutil.copy(host_git, folder / "tools" / "git")
    (folder / "workers").mkdir()
    (folder / "orchestrator.yaml").write_text(
        "# Written by orchestrator doctor to try everyday tools; removed afterwards.\n"
        "zones:\n"
        "  data: {path: data, mode: ro}\n"
        "  out: {path: out, mode: rw, untrusted_output: true}\n"
        "  tools: {path: tools, mode: ro}\n"
        f"defaults: {{image: {json.dumps(image)}}}\n"
    )
    (folder / "workers" / f"{WORKER}.worker").write_text(worker_file(isolation))


def worker_file(isolation: str) -> str:
    source = resources.files("orchestrator.doctor").joinpath("everyday.py").read_text("utf-8")
    args = {"data": "/data", "out": "/out", "git": ["git", "/tools/git"]}
    command = ["python3", "-c", source, json.dumps(args)]
    return (
        "---\n"
        f"name: {WORKER}\n"
        "description: orchestrator doctor's everyday tools\n"
        f"command: {json.dumps(command)}\n"
        "trust: untrusted\n"
        f"isolation: {isolation}\n"
        "network: none\n"
        "sandbox:\n"
        "  zones:\n"
        "    - {name: data, mode: ro}\n"
        "    - {name: out, mode: rw}\n"
        "    - {name: tools, mode: ro}\n"
        f"resources: {{timeout: {RUN_TIMEOUT}}}\n"
        "---\n"
    )


def parse(stdout: str) -> list[list[str]] | None:
    """The probe's report: ``[[operation, verdict, output]]``, or None."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            data: Any = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, list) and all(isinstance(row, list) and len(row) == 3 for row in data):
            return [[str(cell) for cell in row] for row in data]
    return None


def judge(rows: list[list[str]] | None, runsc_version: str, stderr: str = "") -> Check:
    fix = (
        "sudo orchestrator engine setup --gvisor (it installs a runsc that works, "
        f"{_minimum()} or later, from the release's backports)"
    )
    if rows is None:
        tail = stderr.strip()[-300:].replace("\n", " | ") or "no output"
        return Check(NAME, "fail", f"the probe did not report ({runsc_version}): {tail}", fix)
    failed = [
        f"{name} ({verdict[len('failed: ') :]})"
        for name, verdict, _ in rows
        if verdict != "ok" and not verdict.startswith("skipped")
    ]
    skipped = [
        f"{name} ({verdict[len('skipped: ') :]})"
        for name, verdict, _ in rows
        if verdict.startswith("skipped")
    ]
    worked = [name for name, verdict, _ in rows if verdict == "ok"]
    also = f"; skipped: {', '.join(skipped)}" if skipped else ""
    if failed:
        return Check(
            NAME,
            "fail",
            f"fail under {runsc_version}: {'; '.join(failed)}; worked: "
            f"{', '.join(worked) or 'none'}{also}",
            fix,
        )
    return Check(
        NAME, "pass", f"{len(worked)} work under {runsc_version}: {', '.join(worked)}{also}"
    )


def _minimum() -> str:
    from orchestrator.docker.runsc import MINIMUM

    return f"runsc {MINIMUM}"
