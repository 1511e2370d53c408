"""Root CI runners: the orchestrator runs as root over a tree root owns, nobody chowns.

The worker runs as an unprivileged uid; the orchestrator gives that uid what the grant
says for the run only (ACL entries under runc, lent ownership under gVisor) and puts every
pre-existing file back exactly (owner, mode, extended attributes), while what the worker
made goes to the project folder's owner. Everything here goes through the real console
entry point, once per isolation runtime, and the worker attacks its temporary access:
links out of the zone, a hard link to a read-only file, a setuid file, a granted file
moved deep into a tree deeper than any recursion limit, a SIGKILLed orchestrator.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.runtime import acl
from tests.integration.conftest import cli, unavailable
from tests.integration.test_zones import git_init

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def as_root() -> None:
    if os.geteuid() != 0:
        unavailable("a root orchestrator is what is tested: run as root")


#: Host files a worker with lent access might try to reach through links.
HOST_FILES = ("/etc", "/etc/shadow", "/etc/passwd")

WORKER = r"""
import errno, os, sys

def attempt(what, action):
    try:
        action()
        print("DID", what)
    except OSError as exc:
        print("refused", what, errno.errorcode[exc.errno])

def write(path, text, mode="w"):
    with open(path, mode) as handle:
        handle.write(text)

# What the grant gives: a writable zone, the session, the workspace, reading the rest.
write("/out/new.txt", "new")
write("/out/old.txt", " appended", "a")
os.makedirs("/out/made/sub")
write("/out/made/sub/deep.txt", "deep")
write("/session/s.txt", "session")
write("/workspace/w.txt", "workspace")
print("read", open("/secret/s.txt").read(), open("/repo/private/p.txt").read())

# A read-only zone and a read-only repo stay read-only.
attempt("append /secret/s.txt", lambda: write("/secret/s.txt", "x", "a"))
attempt("create /secret/new", lambda: write("/secret/new", "x"))
attempt("chmod /secret/s.txt", lambda: os.chmod("/secret/s.txt", 0o666))
attempt("remove /secret/s.txt", lambda: os.unlink("/secret/s.txt"))
attempt("create /repo/new", lambda: write("/repo/new", "x"))

# Reaching beyond the grant with the access it was lent.
os.symlink("/etc/shadow", "/out/to-shadow")
os.symlink("/etc", "/out/to-etc")
os.symlink("OUTSIDE", "/out/to-outside")
attempt("make /out/fifo", lambda: os.mkfifo("/out/fifo"))
attempt("hard link /secret/s.txt", lambda: os.link("/secret/s.txt", "/out/secret-link"))
attempt("hard link /out/old.txt", lambda: os.link("/out/old.txt", "/out/old-link.txt"))
attempt("chmod /out/old.txt", lambda: os.chmod("/out/old.txt", 0o777))
write("/out/suid", "#!/bin/sh\n")
os.chmod("/out/suid", 0o6755)

# A granted file moved to the bottom of a tree deeper than any recursion limit.
os.chdir("/out")
for _ in range(DEPTH):
    os.mkdir("d")
    os.chdir("d")
write("bottom.txt", "bottom")
os.rename("/out/keep.txt", "keep.txt")
print("done")
sys.stdout.flush()
if os.environ.get("HANG"):
    import time
    print("started", flush=True)
    time.sleep(600)
"""

DEPTH = 1200


def state_of(path: Path) -> tuple:
    info = os.lstat(path)
    names = os.listxattr(path, follow_symlinks=False)
    xattrs = {n: os.getxattr(path, n, follow_symlinks=False) for n in sorted(names)}
    return info.st_uid, info.st_gid, info.st_mode, xattrs


def everything(root: Path, *, skip: Path | None = None) -> list[Path]:
    """Every path under ``root`` but ``skip``, without following links (a loop, not
    recursion: the worker builds a tree deeper than Python's recursion limit)."""
    found = [root]
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                path = Path(entry.path)
                if path == skip:
                    continue
                found.append(path)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
    return found


def snapshot(root: Path, *, skip: Path | None = None) -> dict[str, tuple]:
    """Owner, mode bits and every xattr of everything under ``root``, links not followed."""
    return {str(path): state_of(path) for path in everything(root, skip=skip)}


def names_uid(path: Path, uid: int) -> bool:
    for name in (acl.ACCESS, acl.DEFAULT):
        try:
            raw = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            continue
        if acl.names_user(raw, uid):
            return True
    return False


@pytest.fixture
def root_tree(project, tmp_path):
    """A project owned by root: 0755 and 0700 folders, 0600 files, a git repo."""
    git_init(project.root)
    out = project.zone("out", "rw", files={"old.txt": "old", "keep.txt": "keep"})
    secret = project.zone("secret", "ro", files={"s.txt": "secret"})
    private = project.root / "private"
    private.mkdir(mode=0o700)
    (private / "p.txt").write_text("private")
    for path, mode in ((out, 0o700), (secret, 0o700), (private, 0o700)):
        os.chmod(path, mode)
    for path in (out / "old.txt", out / "keep.txt", secret / "s.txt", private / "p.txt"):
        os.chmod(path, 0o600)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "host.txt").write_text("host")
    script = WORKER.replace("OUTSIDE", str(outside)).replace("DEPTH", str(DEPTH))
    command = json.dumps(["python3", "-c", textwrap.dedent(script)])
    zones = "[{name: out, mode: rw}, {name: secret, mode: ro}]"
    project.worker("w", f"command: {command}\ntrust: workspace\nsandbox: {{zones: {zones}}}")
    assert all(os.lstat(p).st_uid == 0 for p in everything(project.root))
    yield project, outside
    # pytest's own clean-up of old temporary folders recurses: it cannot take the tree.
    subprocess.run(["rm", "-rf", "--one-file-system", str(out)], check=True)


def host_state(outside: Path) -> dict[str, tuple]:
    return {**{p: state_of(Path(p)) for p in HOST_FILES}, **snapshot(outside)}


def check_put_back(project, outside, before, host_before, *, moved: bool = True) -> None:
    """Pre-existing paths as before (``keep.txt`` where the worker ``moved`` it), what the
    worker made the project folder owner's, and no trace of the worker's uid anywhere."""
    uid = project.identity[0]
    owner = project.root.stat()
    sandbox = project.root / ".sandbox"
    after = snapshot(project.root, skip=sandbox)
    if moved:
        keep = project.root / "out" / "/".join(["d"] * DEPTH) / "keep.txt"
        assert after.pop(str(keep)) == before.pop(str(project.root / "out" / "keep.txt"))
    made = {path: after.pop(path) for path in list(after) if path not in before}
    assert after == before  # owner, mode and every xattr, ACLs included
    assert made, "the worker made nothing?"
    for path, (made_uid, made_gid, mode, _xattrs) in made.items():
        assert (made_uid, made_gid) == (owner.st_uid, owner.st_gid), path
        assert not mode & 0o6000, path  # setuid and setgid dropped
    for path in everything(project.root):
        assert os.lstat(path).st_uid != uid, path
        assert not names_uid(path, uid), path
    assert not list((sandbox / "runs").glob("*/access.json"))
    assert host_state(outside) == host_before


def test_a_root_run_gives_the_grant_and_puts_everything_back(engine, root_tree, isolation):
    project, outside = root_tree
    before = snapshot(project.root)
    host_before = host_state(outside)
    done = cli("run", "w", "--project", str(project.root), timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "read secret private" in out and "done" in out, out
    for what in ("append /secret/s.txt", "create /secret/new", "chmod /secret/s.txt",
                 "remove /secret/s.txt", "create /repo/new", "hard link /secret/s.txt"):  # fmt: skip
        assert f"refused {what}" in out, out
    assert (project.root / "secret" / "s.txt").read_text() == "secret"
    assert (project.root / "out" / "old.txt").read_text() == "old appended"
    bottom = project.root / "out" / "/".join(["d"] * DEPTH) / "bottom.txt"
    assert bottom.read_text() == "bottom"
    sessions = list((project.root / ".sandbox" / "sessions").iterdir())
    assert [p.name for s in sessions for p in s.iterdir()] == ["s.txt"]
    workspace = project.root / ".sandbox" / "workspaces" / "default" / "w.txt"
    assert workspace.read_text() == "workspace"
    check_put_back(project, outside, before, host_before)
    log = (project.root / ".sandbox" / "audit.jsonl").read_text()
    audit = [json.loads(line) for line in log.splitlines()]
    granted = [e for e in audit if e["operation"] == "access.granted"]
    method = "owner" if isolation == "gvisor" else "acl"
    assert granted and granted[0]["metadata"]["method"] == method
    assert [e["allowed"] for e in audit if e["operation"] == "access.released"] == [True]


def test_a_full_worker_writes_the_repo_of_a_root_tree(engine, root_tree, isolation):
    project, outside = root_tree
    script = """
    import errno, os
    open("/repo/README.new", "w").write("new")
    os.makedirs("/repo/private/made")
    open("/repo/private/made/f", "w").write("f")
    open("/repo/private/p.txt", "a").write(" edited")
    for path in ("/repo/.git/config", "/repo/orchestrator.yaml"):
        try:
            open(path, "a").write("x")
            print("DID", path)
        except OSError as exc:
            print("refused", path, errno.errorcode[exc.errno])
    """
    command = json.dumps(["python3", "-c", textwrap.dedent(script)])
    project.worker("full", f"command: {command}\ntrust: full\nsandbox: {{}}")
    before = snapshot(project.root)
    host_before = host_state(outside)
    done = cli("run", "full", "--project", str(project.root), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "DID" not in done.stdout, done.stdout
    assert (project.root / "private" / "p.txt").read_text() == "private edited"
    assert (project.root / "README.new").read_text() == "new"
    check_put_back(project, outside, before, host_before, moved=False)


@pytest.mark.serial
def test_a_sigkilled_root_run_is_put_back_by_gc(engine, root_tree, isolation):
    project, outside = root_tree
    before = snapshot(project.root)
    host_before = host_state(outside)
    command = ["run", "w", "--project", str(project.root), "--env", "HANG=1"]
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = process.stdout.readline() if process.stdout else ""
            if line == "started\n" or not line:
                break
        assert line == "started\n", process.stderr.read() if process.stderr else ""
        records = list((project.root / ".sandbox" / "runs").glob("*/access.json"))
        assert len(records) == 1  # what was changed, on disk before the change
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
        process.communicate()
    uid = project.identity[0]
    if isolation == "runc":
        assert names_uid(project.root / "out", uid)  # a SIGKILL leaves the entries...
    else:
        assert (project.root / "out").stat().st_uid == uid  # ...or the lent ownership
    done = cli("gc", "--json", "--project", str(project.root), timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(done.json()["access_restored"]) == 1  # ...gc puts them back
    check_put_back(project, outside, before, host_before)
