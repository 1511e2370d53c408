"""Setuid and setgid files: never honoured inside a worker, never left on the host.

The attack (issue 22): a root-owned, mode-4755 program in a read-only zone or given as an
input stands for any vulnerable setuid program. The worker (a non-root uid) runs it to
copy itself into a writable zone and make the copy 4755; the copy must never be root's
inside, and after the run no set-id bit the run added is left in the zone (stripped and
audited). On a swarm, which can set neither no-new-privileges nor nosuid, the run is
refused before anything exists, naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from orchestrator.config import load_project, load_worker
from orchestrator.docker.swarm.engine import SWARM
from orchestrator.prepare import prepare
from orchestrator.runtime import execute, open_audit
from orchestrator.runtime.container import ContainerBackend
from tests.integration.conftest import cli, script_worker, unavailable
from tests.integration.conftest import swarm_docker as _docker

pytestmark = pytest.mark.docker

WORKER = r"""
import os, stat, subprocess

def mounts():
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] in ("/tools", "/out", "/inputs", "/session", "/workspace"):
            print("mount", fields[4], fields[5])

def attack(prog, tag):
    # cp reads its own /proc/self/status: the ids the setuid program really ran with.
    subprocess.run([prog, "/proc/self/status", f"/out/status-{tag}"], check=True)
    uids = [l.split()[1:] for l in open(f"/out/status-{tag}") if l.startswith("Uid:")][0]
    print("uids", tag, " ".join(uids))
    subprocess.run([prog, prog, f"/out/cp-{tag}"], check=True)
    os.chmod(f"/out/cp-{tag}", 0o4755)
    info = os.stat(f"/out/cp-{tag}")
    print("copy", tag, info.st_uid, oct(stat.S_IMODE(info.st_mode)))

mounts()
print("me", os.getuid())
info = os.stat("/inputs/cp")
print("input", info.st_uid, oct(stat.S_IMODE(info.st_mode)))
attack("/tools/cp", "zone")
attack("/inputs/cp", "input")
os.mkdir("/out/d")
os.chmod("/out/d", 0o2755)
open("/out/f", "w").write("x")
os.chmod("/out/f", 0o2755)
open("/out/shared/new", "w").write("x")
print("done")
"""


def setuid_cp(path: Path) -> Path:
    """A root-owned, mode-4755 copy of the host's cp at ``path``."""
    shutil.copyfile("/bin/cp", path)
    os.chown(path, 0, 0)
    os.chmod(path, 0o4755)
    return path


def audited(project_root: Path, operation: str) -> list[dict]:
    log = project_root / ".sandbox" / "audit.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    entries = [json.loads(line) for line in lines if line.strip()]
    return [e for e in entries if e["operation"] == operation]


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        unavailable("a setuid-root file is made for the attack: run as root")


def attack_project(project, tmp_path: Path) -> tuple[Path, Path]:
    tools = project.zone("tools", "ro")
    setuid_cp(tools / "cp")
    out = project.zone("out", "rw")
    (out / "shared").mkdir()
    os.chmod(out / "shared", 0o2777)  # a shared setgid folder, there before the run
    given = tmp_path / "given"
    given.mkdir()
    return out, setuid_cp(given / "cp")


def test_a_setuid_program_in_a_zone_or_an_input_never_gives_root_and_leaves_nothing(
    as_root, engine, project, isolation, tmp_path
):
    out, given = attack_project(project, tmp_path)
    command = json.dumps(["python3", "-c", textwrap.dedent(WORKER)])
    zones = "[{name: tools, mode: ro}, {name: out, mode: rw}]"
    project.worker("w", f"command: {command}\ntrust: workspace\nsandbox: {{zones: {zones}}}")
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"), inputs=[given])
    result = execute(ContainerBackend(engine), prepared, audit=open_audit(loaded), staging=None)
    out_text = result.stdout
    assert result.exit_code == 0, (out_text, result.stderr, result.error)
    assert "done" in out_text
    me = next(line.split()[1] for line in out_text.splitlines() if line.startswith("me "))
    # The setuid bit was not honoured: real, effective, saved and fs uid stay the worker's.
    assert f"uids zone {me} {me} {me} {me}" in out_text
    assert f"uids input {me} {me} {me} {me}" in out_text
    assert f"copy zone {me} 0o4755" in out_text and f"copy input {me} 0o4755" in out_text
    # The input was copied, not linked: the worker's own, without the bit.
    assert f"input {me} 0o555" in out_text
    # As root, every bind is made from a pinned nosuid,nodev mount (gVisor shows its own
    # mounts). runc 1.1 remounts a read-only bind with MS_RDONLY alone, which resets its
    # other flags: /tools and /inputs lose nosuid,nodev there; no-new-privileges (above)
    # is what stops the bit (docs/security.md).
    if isolation == "runc":
        mounts = dict(line.split()[1:] for line in out_text.splitlines() if line[:6] == "mount ")
        assert {"/tools", "/out", "/inputs", "/session"} <= set(mounts), mounts
        for target in ("/out", "/session"):
            assert {"nosuid", "nodev"} <= set(mounts[target].split(",")), mounts
        assert "ro" in mounts["/tools"].split(",") and "ro" in mounts["/inputs"].split(",")
    # Nothing set-id left in the zone but the shared folder that was there.
    for name in ("cp-zone", "cp-input", "d", "f"):
        assert not (out / name).lstat().st_mode & (stat.S_ISUID | stat.S_ISGID), name
    assert stat.S_IMODE((out / "shared").stat().st_mode) == 0o2777
    stripped = {
        Path(e["path"]).name: e["metadata"] for e in audited(project.root, "zone.setid_stripped")
    }
    assert set(stripped) == {"cp-zone", "cp-input", "d", "f"}
    assert stripped["d"]["old_mode"] == "2755" and stripped["d"]["new_mode"] == "755"
    # The originals are as they were.
    assert stat.S_IMODE((project.root / "tools" / "cp").stat().st_mode) == 0o4755
    assert stat.S_IMODE(given.stat().st_mode) == 0o4755


ZONES = "trust: workspace\nsandbox: {zones: [{name: tools, mode: ro}, {name: out, mode: rw}]}"


# -- swarm ------------------------------------------------------------------------------


@pytest.fixture
def swarm_project(swarm, project):
    project.extra = "isolation: {untrusted: runc, session: runc}\n"
    project.write_project()
    return project


def _services() -> set[str]:
    listed = _docker("service", "ls", "--format", "{{.Name}}", "--filter", f"label={SWARM}")
    return set(listed.stdout.split())


@pytest.mark.parametrize("where", ["zone", "input"])
def test_on_swarm_a_setuid_file_mounted_is_refused_before_any_service(
    as_root, swarm_project, tmp_path, where
):
    _, given = attack_project(swarm_project, tmp_path)
    script_worker(swarm_project, "print('ran')", ZONES)
    if where == "input":
        os.chmod(swarm_project.root / "tools" / "cp", 0o755)  # only the input is set-id
    before = _services()
    args = ["run", "w", "--project", str(swarm_project.root), "--engine", "swarm"]
    done = cli(*args, "--input", str(given))
    assert done.returncode != 0
    named = given if where == "input" else swarm_project.root / "tools" / "cp"
    line = next(x for x in done.stderr.splitlines() if "setuid" in x)
    assert f"{named} is setuid root" in line, done.stderr
    assert "no-new-privileges" in line and f"chmod u-s,g-s {named}" in line
    assert "ran" not in done.stdout
    assert _services() <= before
    assert audited(swarm_project.root, "run.started") == []


def test_on_swarm_set_id_bits_a_task_leaves_are_stripped_and_audited(swarm_project):
    out = swarm_project.zone("out", "rw")
    (out / "shared").mkdir()
    os.chmod(out / "shared", 0o2777)
    script_worker(
        swarm_project,
        """
        import os
        os.mkdir("/out/d")
        os.chmod("/out/d", 0o2755)
        open("/out/f", "w").write("x")
        os.chmod("/out/f", 0o6755)
        open("/out/shared/new", "w").write("x")
        os.mkfifo("/out/pipe")
        """,
        "trust: workspace\nsandbox: {zones: [{name: out, mode: rw}]}",
    )
    done = cli("run", "w", "--project", str(swarm_project.root), "--engine", "swarm", "--json")
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((out / "d").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "f").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "shared").stat().st_mode) == 0o2777
    stripped = {Path(e["path"]).name for e in audited(swarm_project.root, "zone.setid_stripped")}
    assert stripped == {"d", "f"}
    special = [Path(e["path"]).name for e in audited(swarm_project.root, "zone.special_file")]
    assert special == ["pipe"]


def test_setid_files_in_the_worker_image_are_none(engine):
    # The swarm's own gap (no no-new-privileges) needs an image without set-id files too.
    found = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "find", "orchestrator/worker", "/",
         "-xdev", "-perm", "/6000", "-type", "f"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert found.stdout.strip() == ""
