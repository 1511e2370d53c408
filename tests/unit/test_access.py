"""Access for the worker's uid when the orchestrator runs as root: ACLs, the walk, the record.

The ACL codec is checked against the kernel (it must accept what we write and report the
mode it implies) and, where installed, against ``getfacl``. The tree walk is checked on
links, swaps and a tree deeper than Python's recursion limit. Grant and release run on
real folders as root, with the worker's actions played by chown and link calls.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.audit import AuditLog
from orchestrator.config import load_project, load_worker
from orchestrator.hostfs.walk import walk
from orchestrator.prepare import prepare
from orchestrator.runtime import acl
from orchestrator.runtime.access import RECORD, WorkerAccess, project_folders, sweep
from orchestrator.runtime.access_record import Record
from orchestrator.runtime.host_folders import make_host_folders

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="giving another uid access needs root")


def fd_of(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def acl_of(path: Path) -> bytes | None:
    fd = fd_of(path)
    try:
        return acl.read(fd)
    finally:
        os.close(fd)


def usable(path: Path, uid: int, gid: int, want: int, *, lend: bool) -> bool:
    """Whether the worker could use ``path``: by ACL under runc, by mode under gVisor."""
    info = path.stat()
    return acl.allows(None if lend else acl_of(path), info, uid, gid, want)


# -- the ACL codec --------------------------------------------------------------------------


def test_an_acl_round_trips_and_the_kernel_takes_it(tmp_path):
    target = tmp_path / "f"
    target.write_text("x")
    os.chmod(target, 0o640)
    fd = fd_of(target)
    try:
        raw = acl.with_user(None, os.fstat(fd).st_mode, NOBODY, acl.R | acl.W)
        assert acl.encode(acl.decode(raw)) == raw
        acl.write(fd, raw)
        info = os.fstat(fd)
        assert stat.S_IMODE(info.st_mode) == 0o660  # group bits show the mask
        assert acl.read(fd) == raw
        assert acl.names_user(raw, NOBODY) and not acl.names_user(raw, 1234)
        if shutil.which("getfacl"):
            shown = subprocess.run(
                ["getfacl", "-cn", str(target)], capture_output=True, text=True, check=True
            ).stdout.split()
            assert shown == ["user::rw-", f"user:{NOBODY}:rw-", "group::r--", "mask::rw-",
                             "other::---"]  # fmt: skip
        kept, group = acl.without_user(raw, NOBODY)
        assert kept is None and group == 4  # minimal again: the owning group's r--
    finally:
        os.close(fd)


def test_allows_decides_as_the_kernel_does(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    info = folder.stat()
    assert not acl.allows(None, info, NOBODY, NOBODY, acl.R)
    raw = acl.with_user(None, info.st_mode, NOBODY, acl.R | acl.X)
    assert acl.allows(raw, info, NOBODY, NOBODY, acl.R | acl.X)
    assert not acl.allows(raw, info, NOBODY, NOBODY, acl.W)
    # A narrow mask holds a named entry back.
    entries = [e if e.tag != 0x10 else acl.Entry(0x10, e.id, 0) for e in acl.decode(raw)]
    assert not acl.allows(acl.encode(tuple(entries)), info, NOBODY, NOBODY, acl.R)
    # The owner decides by the owner bits alone; others by the other bits.
    assert acl.allows(None, info, info.st_uid, 0, acl.R | acl.W | acl.X)
    os.chmod(folder, 0o705)
    assert acl.allows(None, folder.stat(), NOBODY, NOBODY, acl.R | acl.X)


def test_a_named_entry_keeps_other_named_entries(tmp_path):
    raw = acl.with_user(None, 0o600, 1000, acl.R)
    raw = acl.with_user(raw, 0o600, NOBODY, acl.R | acl.W)
    kept, group = acl.without_user(raw, NOBODY)
    assert group is None and kept is not None
    assert [(e.tag, e.id) for e in acl.decode(kept) if e.tag == 0x02] == [(0x02, 1000)]


# -- the walk -------------------------------------------------------------------------------


def test_the_walk_never_follows_links_and_reaches_any_depth(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host.txt").write_text("host")
    (root / "dir-link").symlink_to(outside)
    (root / "file-link").symlink_to(outside / "host.txt")
    os.mkfifo(root / "fifo")
    depth = 1500  # deeper than Python's recursion limit and any sane descriptor budget
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("deep")
    os.close(fd)
    seen: list[str] = []
    opened: list[int] = []

    def visit(entry):
        seen.append(entry.path)
        opened.append(_descriptors_under(root))
        return True

    try:
        walk(root, visit)
    finally:  # pytest's own clean-up of old temporary folders recurses: not into this
        subprocess.run(["rm", "-rf", "--one-file-system", str(root / "d")], check=True)
    assert "dir-link" in seen and "file-link" in seen and "fifo" in seen
    assert not any(p.startswith(("dir-link/", "file-link/")) for p in seen)
    assert "/".join(["d"] * depth) + "/bottom.txt" in seen
    assert 1 <= max(opened) <= 2  # one folder descriptor at a time (and the entry's own)


def _descriptors_under(root):
    """How many of this process's descriptors are open on something under ``root`` (other
    threads of a long test session may open and close descriptors of their own meanwhile)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since it was listed
            continue
        count += target == str(root) or target.startswith(f"{root}/")
    return count


def test_the_walk_does_not_enter_a_folder_swapped_for_a_link(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host.txt").write_text("host")
    seen: list[str] = []

    def visit(entry):
        seen.append(entry.path)
        if entry.path == "sub":  # between the look and the open, the worker swaps it
            os.rmdir(root / "sub")
            (root / "sub").symlink_to(outside)
        return True

    walk(root, visit)
    assert seen == ["", "sub"]


# -- grant and release ----------------------------------------------------------------------


def root_project(project):
    """A project owned by root with 0700 and 0755 folders and a rw and a ro zone."""
    data = project.zone("data", "rw", files={"old.txt": "old", "sub/kept.txt": "kept"},
                        extra="untrusted_output: true")  # fmt: skip
    secret = project.zone("secret", "ro", files={"s.txt": "secret", "pub.txt": "public"})
    for folder, mode in ((data, 0o700), (secret, 0o700), (data / "sub", 0o755)):
        os.chmod(folder, mode)
    os.chmod(data / "old.txt", 0o600)
    os.chmod(secret / "s.txt", 0o600)
    project.worker(
        "w",
        'command: ["true"]\nsandbox: {zones: [{name: data, mode: rw}, {name: secret}]}',
    )
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    make_host_folders(prepared)
    return prepared, data, secret


def state(root: Path) -> dict[str, tuple]:
    """Owner, mode and extended attributes of everything under ``root`` (links not followed)."""
    found = {}
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        xattrs = {}
        if not path.is_symlink():
            xattrs = {name: os.getxattr(path, name) for name in os.listxattr(path)}
        found[str(path.relative_to(root))] = (info.st_uid, info.st_gid, info.st_mode, xattrs)
    return found


def as_worker(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


@root_only
@pytest.mark.parametrize("lend", [False, True], ids=["acl", "owner"])
def test_grant_opens_up_exactly_what_is_needed_and_release_puts_it_all_back(
    project, tmp_path, lend
):
    prepared, data, secret = root_project(project)
    outside = tmp_path / "outside.txt"
    outside.write_text("host")
    before = state(project.root / "data"), state(project.root / "secret"), state(outside)
    access = WorkerAccess(prepared)
    access.lend = lend  # gVisor's way: the uid owns what it needs for the run
    assert access.grant() >= 4  # data, data/old.txt, secret, secret/s.txt (and the session)
    record = prepared.paths.run_dir / RECORD
    assert record.exists()  # written before anything changed
    uid, gid = prepared.uid, prepared.gid
    for path, want in (
        (data, 7),
        (data / "old.txt", 6),
        (data / "sub", 7),  # 0755 is not writable by the worker's uid
        (data / "sub" / "kept.txt", 6),
        (secret, 5),
        (secret / "s.txt", 4),
    ):
        assert usable(path, uid, gid, want, lend=lend), path
    public = secret / "pub.txt"  # 0644: readable already, left as it is
    assert acl_of(public) is None and public.stat().st_uid == 0
    assert not usable(secret / "s.txt", uid, gid, acl.W, lend=lend)  # read-only zone: r only
    # The worker makes files, links out, moves a file it was given access to deep down.
    (data / "new.txt").write_text("new")
    as_worker(data / "new.txt")
    os.chmod(data / "new.txt", 0o4755)
    (data / "made").mkdir()
    as_worker(data / "made")
    (data / "made" / "to-shadow").symlink_to("/etc/shadow")
    as_worker(data / "made" / "to-shadow")
    (data / "made" / "to-outside").symlink_to(outside)
    as_worker(data / "made" / "to-outside")
    os.mkfifo(data / "made" / "fifo")
    as_worker(data / "made" / "fifo")
    os.rename(data / "old.txt", data / "made" / "old.txt")
    shadow = os.stat("/etc/shadow")
    assert access.release() == []
    assert not record.exists()
    moved = data / "made" / "old.txt"
    os.rename(moved, data / "old.txt")  # back where it was, to compare
    after = state(project.root / "data")
    for name in ("new.txt", "made", "made/to-shadow", "made/to-outside", "made/fifo"):
        owner_uid, owner_gid, mode, _xattrs = after.pop(name)
        assert (owner_uid, owner_gid) == (project.root.stat().st_uid, project.root.stat().st_gid)
        assert not mode & (stat.S_ISUID | stat.S_ISGID), name
    assert (after, state(project.root / "secret"), state(outside)) == before
    now = os.stat("/etc/shadow")
    assert (now.st_uid, now.st_gid, now.st_mode) == (shadow.st_uid, shadow.st_gid, shadow.st_mode)


@root_only
def test_files_with_hard_links_elsewhere_and_privileged_files_are_left_alone(project, tmp_path):
    prepared, data, _secret = root_project(project)
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("host file")
    os.chmod(elsewhere, 0o600)
    os.link(elsewhere, data / "linked.txt")  # another name of a host file
    (data / "suid").write_text("#!/bin/sh\n")
    os.chmod(data / "suid", 0o4700)
    access = WorkerAccess(prepared)
    access.grant()
    try:
        for path in (elsewhere, data / "suid"):
            assert not usable(path, prepared.uid, prepared.gid, acl.R, lend=False), path
        assert any("linked.txt" in line for line in access.skipped)
        assert any("suid" in line for line in access.skipped)
    finally:
        assert access.release() == []
    assert stat.S_IMODE((data / "suid").stat().st_mode) == 0o4700


@root_only
def test_two_runs_sharing_a_folder_keep_it_open_until_the_last_ends(project):
    first, data, _ = root_project(project)
    loaded = load_project(project.root)
    second = prepare(loaded, load_worker(loaded, "w"))
    make_host_folders(second)
    one, two = WorkerAccess(first), WorkerAccess(second)
    one.grant()
    two.grant()
    (data / "by-two.txt").write_text("x")
    as_worker(data / "by-two.txt")
    assert one.release() == []
    # The second run still works in data: its access and its files are as they were.
    assert usable(data, second.uid, second.gid, 7, lend=False)
    assert (data / "by-two.txt").stat().st_uid == NOBODY
    assert two.release() == []
    assert (data / "by-two.txt").stat().st_uid == project.root.stat().st_uid
    assert acl_of(data) is None


@root_only
def test_gc_puts_back_what_a_killed_run_left(project):
    prepared, data, secret = root_project(project)
    before = state(data), state(secret)
    access = WorkerAccess(prepared)
    access.grant()
    record = prepared.paths.run_dir / RECORD
    # As if its process had been SIGKILLed: the record names a process that is gone.
    loaded = Record.load(record, project_folders(prepared.project))
    loaded.process[labels.OWNER_PID] = "999999999"
    loaded.write()  # signed again, as the orchestrator (the same user) writes it
    assert sweep(prepared.project) == [prepared.spec.run_id]
    assert not prepared.paths.run_dir.exists()
    assert (state(data), state(secret)) == before


@root_only
def test_a_record_changed_by_anyone_else_is_reported_and_never_applied(project, caplog):
    """The same dead run's record, edited without the key (its pid, and a mode 4777 for a
    file it lists): refused as a whole, audited, kept; nothing it lists changes."""
    prepared, data, _ = root_project(project)
    access = WorkerAccess(prepared)
    access.grant()
    granted = state(data)
    record = prepared.paths.run_dir / RECORD
    text = record.read_text().replace(f'"{os.getpid()}"', '"999999999"')
    assert ", 448, {" in text
    record.write_text(text.replace(", 448, {", ", 2559, {"))  # 0o700 -> 0o4777
    with AuditLog(prepared.paths.sandbox_root / "audit.jsonl") as audit:
        assert sweep(prepared.project, audit=audit) == []
        entries = audit.query()
    assert f"refusing the access record {record}: not signed" in caplog.text
    assert [(e.operation, e.allowed, e.path) for e in entries] == [
        ("access.record_refused", False, str(record))
    ]
    assert record.read_text() == text.replace(", 448, {", ", 2559, {")
    assert state(data) == granted  # left as the run had it: a person decides
    assert access.release() == []  # the run itself puts back what it holds in memory
