"""Set-id bits: refused before a run that would honour them, stripped after every run."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.runtime.setid import SetidRefused, SetidSweep, refuse_setid

#: The project's owner in these tests (the worker's uid:gid).
OWNER = (4321, 4321)


def _prepared(
    tmp_path: Path, zones: dict[str, tuple[Path, str]], inputs=(), image_user: bool = False
):
    grant = SimpleNamespace(
        zones=[
            SimpleNamespace(
                name=name, host_path=path, target=f"/{name}", mode=mode, read_only=mode == "ro",
                outbox=False, ask_base=None,
            )
            for name, (path, mode) in zones.items()
        ],
        masks=(),
    )  # fmt: skip
    paths = SimpleNamespace(sandbox_root=tmp_path / ".sandbox")
    return SimpleNamespace(
        grant=grant,
        paths=paths,
        inputs=tuple(inputs),
        spec=SimpleNamespace(image_user=image_user),
        uid=OWNER[0],
        gid=OWNER[1],
    )


def test_a_setuid_file_in_a_read_only_zone_is_refused_by_name(tmp_path):
    tools = tmp_path / "tools"
    (tools / "bin").mkdir(parents=True)
    program = tools / "bin" / "prog"
    program.write_text("x")
    os.chmod(program, 0o4755)
    prepared = _prepared(tmp_path, {"tools": (tools, "ro")})
    with pytest.raises(SetidRefused) as refused:
        refuse_setid(prepared, why="swarm cannot set no-new-privileges")
    text = str(refused.value)
    assert text.startswith(f"zone 'tools' (/tools): {program} is setuid ")
    assert f"chmod u-s,g-s {program}" in text and "\n" not in text
    os.chmod(program, 0o755)
    refuse_setid(prepared, why="-")  # nothing left to refuse


def test_a_setgid_input_is_refused_and_a_link_is_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("x")
    os.chmod(outside, 0o4755)
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "to-outside").symlink_to(outside)
    prepared = _prepared(tmp_path, {}, [SimpleNamespace(source=folder)])
    refuse_setid(prepared, why="-")  # the link is not followed
    (folder / "g").write_text("x")
    os.chmod(folder / "g", 0o2755)
    with pytest.raises(SetidRefused, match=r"^input .*/in: .*/in/g is setgid "):
        refuse_setid(prepared, why="-")


def test_the_sweep_strips_what_the_run_added_and_keeps_what_was_there(tmp_path):
    out = tmp_path / "out"
    shared = out / "shared"
    shared.mkdir(parents=True)
    os.chmod(shared, 0o2775)  # a setgid shared folder, there before the run
    old = out / "old"
    old.write_text("x")
    os.chmod(old, 0o4755)  # a set-id file there before, untouched by the run
    prepared = _prepared(tmp_path, {"out": (out, "rw")})
    sweep = SetidSweep(prepared)
    sweep.before()
    # What a worker does:
    (shared / "new").write_text("x")  # moves the shared folder's ctime
    made = out / "made"
    made.write_text("x")
    os.chmod(made, 0o6755)
    folder = out / "d"
    folder.mkdir()
    os.chmod(folder, 0o2755)
    (out / "link").symlink_to(made)
    os.mkfifo(out / "fifo")
    findings = sweep.after()
    stripped = {Path(f.path).name: f for f in findings if f.operation == "zone.setid_stripped"}
    assert sorted(stripped) == ["d", "made"]
    assert stripped["made"].old_mode == 0o6755 and stripped["made"].new_mode == 0o755
    assert stat.S_IMODE(made.stat().st_mode) == 0o755
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE(shared.stat().st_mode) == 0o2775
    assert stat.S_IMODE(old.stat().st_mode) == 0o4755
    special = [f for f in findings if f.operation == "zone.special_file"]
    assert [Path(f.path).name for f in special] == ["fifo"]
    assert sweep.after() == []  # once


def test_a_chmod_again_of_a_set_id_file_that_was_there_is_stripped(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    old = out / "old"
    old.write_text("x")
    os.chmod(old, 0o4755)
    sweep = SetidSweep(_prepared(tmp_path, {"out": (out, "rw")}))
    sweep.before()
    os.chmod(old, 0o4775)  # its ctime moves: the run changed it
    [finding] = sweep.after()
    assert finding.operation == "zone.setid_stripped"
    assert stat.S_IMODE(old.stat().st_mode) == 0o775


def test_image_user_leaves_every_changed_owner_to_the_project_owner(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root can make root's files and chown them (a root orchestrator)")
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, *OWNER)
    kept = out / "theirs.txt"  # another user's file, there before the run: left alone
    kept.write_text("x")
    os.chown(kept, 1234, 1234)
    regranted = out / "given.txt"  # the owner's, chowned away by the run
    regranted.write_text("x")
    os.chown(regranted, *OWNER)
    sweep = SetidSweep(_prepared(tmp_path, {"out": (out, "rw")}, image_user=True))
    sweep.before()
    # The run, as root: new files and folders (root's), a chown, a link, a setuid file.
    (out / "made" / "deep").mkdir(parents=True)
    (out / "made" / "deep" / "f.txt").write_text("made")
    os.chown(regranted, 4242, 4242)
    (out / "link").symlink_to("/etc/shadow")
    program = out / "prog"
    program.write_text("x")
    os.chmod(program, 0o4755)

    findings = sweep.after()

    for path in ("made", "made/deep", "made/deep/f.txt", "given.txt", "link", "prog"):
        info = (out / path).lstat()
        assert (info.st_uid, info.st_gid) == OWNER, path
    assert os.stat("/etc/shadow").st_uid == 0  # the link itself, never its target
    assert (kept.stat().st_uid, kept.stat().st_gid) == (1234, 1234)
    assert not program.stat().st_mode & stat.S_ISUID
    restored = {f.path for f in findings if f.operation == "zone.owner_restored"}
    assert str(out / "link") in restored and str(kept) not in restored
    given = next(f for f in findings if f.path == str(regranted))
    assert given.metadata()["old_owner"] == "4242:4242"


def test_without_image_user_nothing_is_chowned(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root can make root's files")
    out = tmp_path / "out"
    out.mkdir()
    sweep = SetidSweep(_prepared(tmp_path, {"out": (out, "rw")}))
    sweep.before()
    (out / "f").write_text("x")
    assert sweep.after() == []
    assert (out / "f").stat().st_uid == 0
