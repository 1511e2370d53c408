"""State that root acts on is root's alone: every plant in the sandbox root, tried as written.

Whoever can write a project (its owner, the author of a checkout a CI runner clones, a
worker) tries to make a later root run of ``orchestrator gc`` or ``orchestrator run`` act for
them through the sandbox root: an access record naming a dead owner and a host folder (so
that root would "put back" an owner and mode 4777), ``audit.jsonl`` as a link to a
root-owned file, a ``.sandbox/`` committed to git and cloned, a sandbox root others may
write. Each goes through the real console entry point; each asserts that a root-owned
canary file keeps its owner, mode and bytes and that nothing appears beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.runtime.access_record import Record, Saved, Tree
from tests.integration.conftest import cli, unavailable
from tests.integration.test_planted_links import USER, Actor, test_user  # noqa: F401

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def as_root() -> None:
    if os.geteuid() != 0:
        unavailable("root acting on planted state is what is tested: run as root")


class Canary:
    """A root-owned folder outside the project holding one root-owned 0600 file."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(mode=0o700)
        self.folder = folder
        self.file = folder / "canary.txt"
        self.bytes = f"CANARY {uuid.uuid4().hex}\n".encode()
        self.file.write_bytes(self.bytes)
        os.chmod(self.file, 0o600)
        self.before = self.state()

    def state(self) -> tuple:
        info = os.lstat(self.file)
        return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), self.file.read_bytes()

    def untouched(self) -> None:
        assert self.state() == self.before == (0, 0, 0o600, self.bytes)
        assert sorted(os.listdir(self.folder)) == ["canary.txt"], "something appeared beside it"


@pytest.fixture
def canary(tmp_path) -> Canary:
    return Canary(tmp_path / "canary")


def refusal(done) -> str:
    """The one line of an orchestrator error (exit 125), without its prefix."""
    assert done.returncode == 125, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestrator: error: "), done.stderr
    return lines[0].removeprefix("orchestrator: error: ")


def dead_owner() -> dict[str, str]:
    """The labels of a process that is gone (in this pid namespace)."""
    return {**labels.current_owner().labels(), labels.OWNER_PID: "999999999"}


def planted_record(canary: Canary) -> dict:
    """An access record as the issue's attacker writes it: a dead owner, a tree outside
    the project, and the canary "put back" to the attacker's uid with mode 4777."""
    info = canary.file.stat()
    return {
        "version": 1,
        "uid": 4242,
        "gid": 4242,
        "owner": [4242, 4242],
        "process": dead_owner(),
        "trees": [{"path": str(canary.folder), "writable": True, "label": "x", "skip": []}],
        "saved": [[info.st_dev, info.st_ino, str(canary.file), 4242, 4242, 0o4777, {}]],
    }


def plant(sandbox: Path, record: dict) -> Path:
    run = sandbox / "runs" / "planted"
    run.mkdir(parents=True, exist_ok=True)
    (run / "access.json").write_text(json.dumps(record))
    return run / "access.json"


def zone_worker(project, isolation: str = "runc") -> None:
    """A worker with a zone root does not own: as root, the run opens it up (and so reads
    the access records of earlier runs first)."""
    out = project.zone("out", "rw", files={"a.txt": "a"})
    os.chmod(out, 0o700)
    project.isolation = isolation
    project.write_project()
    zones = "sandbox: {zones: [{name: out, mode: rw}]}"
    project.worker("w", f'command: ["true"]\ntrust: session\n{zones}')


@pytest.mark.usefixtures("test_user")
def test_a_planted_record_in_a_users_project_is_refused_before_anything_is_read(
    engine, project, canary
):
    """The issue's first reproduction: the project folder is a normal user's, who plants
    ``.sandbox/runs/X/access.json``. Root refuses the whole sandbox root: it is not root's."""
    zone_worker(project)
    record = plant(project.root / ".sandbox", planted_record(canary))
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(project.root)], check=True)
    for command in (["gc"], ["run", "w"]):
        line = refusal(cli(*command, "--project", str(project.root)))
        uid = (project.root / ".sandbox").stat().st_uid
        assert line.startswith(
            f"the sandbox root {project.root / '.sandbox'} belongs to uid {uid}, not to you "
            "(uid 0): another user or a checkout made it. Remove it"
        ), line
        canary.untouched()
    assert record.exists()  # left for a person to look at


@pytest.mark.parametrize("command", ["gc", "run"])
def test_a_record_the_orchestrator_did_not_sign_is_reported_never_applied(
    engine, project, canary, command, isolation
):
    """A record planted in root's own sandbox root (as a copied folder or an older
    version would leave it): not signed with root's key, so refused, audited, kept; the
    run itself goes on, under runc (ACL entries) and gVisor (lent ownership)."""
    zone_worker(project, isolation)
    cli("audit", "--project", str(project.root))  # the orchestrator makes its sandbox root
    record = plant(project.root / ".sandbox", planted_record(canary))
    args = ["gc", "--project", str(project.root)] if command == "gc" else ["run", "w"]
    done = cli(*args, *(["--project", str(project.root)] if command == "run" else []))
    assert done.returncode == 0, done.stderr
    assert f"refusing the access record {record}: not signed" in done.stderr
    canary.untouched()
    assert record.exists()
    audit = cli("audit", "--project", str(project.root), "--json", "--operation", "access.*")
    entries = [json.loads(line) for line in audit.stdout.splitlines()]
    refused = [e for e in entries if e["operation"] == "access.record_refused"]
    assert refused and refused[0]["path"] == str(record) and not refused[0]["allowed"]


def test_a_signed_record_naming_a_folder_outside_the_project_is_refused(engine, project, canary):
    """Even a record signed with the key (the orchestrator's own format) may only name
    trees of the project as loaded."""
    cli("audit", "--project", str(project.root))
    info = canary.file.stat()
    run = project.root / ".sandbox" / "runs" / "signed"
    run.mkdir(parents=True)
    Record(
        run / "access.json", 4242, 4242, (4242, 4242), dead_owner(),
        [Tree(canary.folder, True, "x")],
        {(info.st_dev, info.st_ino): Saved(str(canary.file), 4242, 4242, 0o4777, {})},
    ).write()  # fmt: skip
    done = cli("gc", "--project", str(project.root))
    assert done.returncode == 0, done.stderr
    assert f"it names {canary.folder}, which is no folder of the project" in done.stderr
    canary.untouched()


def test_an_audit_log_linked_to_a_root_file_is_refused(engine, project, canary):
    """``.sandbox/audit.jsonl`` as a link to a root-owned file: never appended to."""
    project.worker("w", 'command: ["true"]')
    cli("audit", "--project", str(project.root))
    link = project.root / ".sandbox" / "audit.jsonl"
    link.symlink_to(canary.file)
    for args in (
        ["run", "w", "--project", str(project.root)],
        ["gc", "--project", str(project.root)],
    ):
        assert refusal(cli(*args)) == (
            f"{link} is a symbolic link (to {canary.file}); the orchestrator never makes one "
            "in its state, so a checkout or another user planted it. Remove it "
            f"(`rm {link}`) and check what it pointed at"
        )
        canary.untouched()


def test_a_sandbox_committed_to_git_and_cloned_is_refused(engine, project, canary, tmp_path):
    """A repository that commits ``.sandbox/`` (an access record), cloned fresh by root."""
    project.worker("w", 'command: ["true"]')
    origin = tmp_path / "origin"
    shutil.copytree(project.root, origin)
    plant(origin / ".sandbox", planted_record(canary))
    git = ["git", "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "init", "-q", str(origin)], check=True)
    subprocess.run([*git, "-C", str(origin), "add", "-A", "-f"], check=True)
    subprocess.run([*git, "-C", str(origin), "commit", "-q", "-m", "x"], check=True)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True)
    assert (clone / ".sandbox" / "runs" / "planted" / "access.json").is_file()
    for args in (["gc"], ["audit"], ["run", "w"]):
        assert refusal(cli(*args, "--project", str(clone))) == (
            f"the sandbox root {clone / '.sandbox'} is tracked by git "
            "(.sandbox/runs/planted/access.json): a checkout chose its state. "
            f"`git -C {clone} rm -r --cached -q .sandbox`, commit, and remove the folder "
            f"(`rm -rf {clone / '.sandbox'}`) so that the orchestrator makes its own"
        )
        canary.untouched()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_sandbox_root_others_may_write_is_refused(engine, project, canary, mode):
    zone_worker(project)
    cli("audit", "--project", str(project.root))
    sandbox = project.root / ".sandbox"
    os.chmod(sandbox, mode)
    plant(sandbox, planted_record(canary))
    for args in (["gc"], ["run", "w"], ["audit"]):
        assert refusal(cli(*args, "--project", str(project.root))) == (
            f"the sandbox root {sandbox} has mode {mode:04o}: other users may write it. "
            f"`chmod 700 {sandbox}`, or set sandbox.root in orchestrator.yaml to a folder only "
            "you can write"
        )
        canary.untouched()


@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o1777, False), (0o775, True)])
def test_a_parent_others_may_write_is_refused_unless_sticky(engine, project, mode, refused):
    """A folder above the sandbox root that others may write lets them swap the sandbox
    root for their own; with the sticky bit they cannot rename what is root's."""
    os.chmod(project.root, mode)
    if mode == 0o775:
        os.chown(project.root, 0, 100)  # a group of other users ("users")
    done = cli("audit", "--project", str(project.root))
    if not refused:
        assert done.returncode == 0, done.stderr
        return
    assert refusal(done) == (
        f"the sandbox root {project.root / '.sandbox'}: {project.root} has mode {mode:04o}, "
        f"so other users could replace what is in it; `chmod g-w,o-w {project.root}` (or "
        "`chmod +t`), or set sandbox.root in orchestrator.yaml to a folder only you can write"
    )
    assert not (project.root / ".sandbox").exists()  # nothing made, nothing read


def test_a_sandbox_root_in_the_repo_below_a_folder_a_worker_may_rename_is_refused(engine, project):
    project.extra = "sandbox: {root: sub/.sandbox}\n"
    project.write_project()
    assert refusal(cli("audit", "--project", str(project.root))) == (
        f"the sandbox root {project.root / 'sub/.sandbox'} lies in the repo {project.root} "
        f"below {project.root / 'sub'}, which a worker at trust 'full' may rename and replace; "
        "set sandbox.root in orchestrator.yaml to a folder directly in the repo (such as "
        ".sandbox) or outside it"
    )


def test_the_sandbox_root_is_made_0700_with_a_gitignore_and_git_stages_none_of_it(engine, project):
    subprocess.run(["git", "init", "-q", str(project.root)], check=True)
    project.worker("w", 'command: ["true"]')
    project.isolation = "runc"
    project.write_project()
    done = cli("run", "w", "--project", str(project.root))
    assert done.returncode == 0, done.stderr
    sandbox = project.root / ".sandbox"
    info = sandbox.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
    assert (sandbox / ".gitignore").read_text().splitlines()[-1] == "*"
    subprocess.run(["git", "-C", str(project.root), "add", "-A"], check=True)
    staged = subprocess.run(
        ["git", "-C", str(project.root), "diff", "--cached", "--name-only"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert staged and not [name for name in staged if name.startswith(".sandbox")], staged


@pytest.fixture
def user_base():
    base = Path(tempfile.mkdtemp(prefix="orch-state-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.usefixtures("test_user")
def test_a_normal_user_refuses_a_sandbox_root_root_made_or_others_may_write(engine, user_base):
    """As a normal user: a ``.sandbox`` root left in the user's project is not the user's;
    one the user owns but others may write is refused too."""
    actor = Actor("user", user_base)
    root = user_base / "project"
    (root / "workers").mkdir(parents=True)
    (root / "orchestrator.yaml").write_text("zones: {}\n")
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(root)], check=True)
    first = actor.cli("audit", "--project", str(root))
    assert first.returncode == 0, first.stderr
    sandbox = root / ".sandbox"
    assert sandbox.stat().st_uid != 0 and stat.S_IMODE(sandbox.stat().st_mode) == 0o700
    os.chmod(sandbox, 0o777)
    done = actor.cli("audit", "--project", str(root))
    assert done.returncode == 125 and "has mode 0777: other users may write it" in done.stderr
    shutil.rmtree(sandbox)
    sandbox.mkdir(mode=0o700)  # root's
    done = actor.cli("audit", "--project", str(root))
    assert done.returncode == 125, done.stderr
    assert f"the sandbox root {sandbox} belongs to uid 0, not to you" in done.stderr
