"""The host-side sandbox file API: every operation, every refusal, and a hostile race."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import stat
import threading
import time

import pytest

from orchestrator.audit import AuditFilter, AuditLog
from orchestrator.config import load_project, load_worker
from orchestrator.errors import AuditError, PolicyError
from orchestrator.prepare import prepare
from orchestrator.runtime.host_folders import make_host_folders
from orchestrator.sandbox import (
    BinaryContent,
    ImageContent,
    ReadCaps,
    SandboxError,
    SandboxFiles,
    SandboxNotFound,
    TextContent,
    WriteResult,
    as_dict,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + bytes(20)
IMAGES = {
    "png": (PNG, "image/png"),
    "jpg": (b"\xff\xd8\xff\xe0\0\x10JFIF\0" + bytes(20), "image/jpeg"),
    "gif": (b"GIF89a\x01\0\x01\0" + bytes(20), "image/gif"),
    "webp": (b"RIFF\x24\0\0\0WEBPVP8 " + bytes(20), "image/webp"),
}
ASK = "approval: {write: ask, delete: blocked}"


def build(project, **kwargs):
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    make_host_folders(prepared)
    audit = AuditLog(project.root / "audit.jsonl")
    files = SandboxFiles(
        prepared.grant,
        owner=(prepared.uid, prepared.gid),
        audit=audit,
        session_id=prepared.session_id,
        worker="w",
        **kwargs,
    )
    return prepared, files, audit


@pytest.fixture
def box(project, tmp_path):
    project.zone("input", "ro", files={"a.txt": "one\ntwo\nthree\n", "sub/b.txt": "b"})
    project.zone(
        "output", "rw", extra="untrusted_output: true, suffixes: ['.md', '.txt'], max_file_size: 1k"
    )
    project.zone("data", "rw", files={"kept.txt": "original"})
    project.worker(
        "w",
        "trust: session\nsandbox: {zones: [{name: input}, {name: output, mode: rw}, "
        f"{{name: data, mode: rw, {ASK}}}]}}",
    )
    prepared, files, audit = build(project)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("HOST-SECRET")
    files.session = prepared.grant.mount_at("/session").host_path
    files.outside = outside
    files.prepared = prepared
    files.audit_log = audit
    yield files
    files.close()


def refused(call, message, error=PolicyError):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value), str(info.value)
    return info.value


# -- listing, stat, exists, resolve ---------------------------------------------------------


def test_root_lists_the_granted_zones_as_plain_folders_and_nothing_else(box):
    listing = box.list("/")
    assert [(e.name, e.path, e.kind) for e in listing.entries] == [
        (name, f"/{name}", "folder")
        for name in ("data", "input", "output", "session", "staged", "workers", "workspace")
    ]
    assert box.stat("/").kind == "folder"
    assert box.exists("/")


def test_list_shows_entries_without_following_links(box):
    (box.session / "d").mkdir()
    (box.session / "f.txt").write_text("hello")
    (box.session / "link").symlink_to(box.outside)
    os.mkfifo(box.session / "pipe")
    listing = box.list("/session")
    kinds = {e.name: (e.kind, e.size) for e in listing.entries}
    assert kinds == {
        "d": ("folder", None),
        "f.txt": ("file", 5),
        "link": ("symlink", None),
        "pipe": ("fifo", None),
    }
    assert box.list("/input/sub").entries[0].path == "/input/sub/b.txt"
    refused(lambda: box.list("/session/link"), "is a symbolic link", SandboxError)
    refused(lambda: box.list("/session/f.txt"), "/session/f.txt is a file", SandboxError)
    refused(lambda: box.list("/session/none"), "does not exist", SandboxNotFound)
    refused(lambda: box.list("/staged"), "write-only outbox")


def test_masked_paths_never_show_and_nested_zones_do(project):
    (project.root / ".git").mkdir()
    project.worker("w", "trust: workspace\nsandbox: {}")
    _, files, _ = build(project)
    with files:
        names = [e.name for e in files.list("/repo").entries]
        assert ".git" in names
        assert ".sandbox" not in names  # the sandbox root (audit log, runs) is masked
        assert "orchestrator.yaml" in names
        refused(lambda: files.read("/repo/.sandbox/audit.jsonl"), "/repo/.sandbox is hidden")
        refused(lambda: files.list("/repo/.sandbox"), "is hidden")
        assert not files.exists("/repo/.sandbox")
        assert "/repo/.sandbox" not in json.dumps(files.security_context())


def test_stat_exists_and_resolve(box):
    (box.session / "f.txt").write_text("12345")
    (box.session / "link").symlink_to(box.outside / "secret.txt")
    info = box.stat("/session/f.txt")
    assert (info.kind, info.size, info.zone, info.path) == ("file", 5, "/session", "/session/f.txt")
    assert box.stat("/session/link").kind == "symlink"  # described, never followed
    assert box.stat("/input").kind == "folder"
    assert box.exists("/input/a.txt")
    assert not box.exists("/input/missing")
    assert not box.exists("/etc/passwd")
    resolved = box.resolve("/session/f.txt")
    assert resolved.host_path == str(box.session / "f.txt")
    assert (resolved.zone, resolved.relative, resolved.exists) == ("/session", "f.txt", True)
    assert not box.resolve("/session/new/x.txt").exists
    (box.session / "dlink").symlink_to(box.outside)
    refused(lambda: box.resolve("/session/dlink/secret.txt"), "is a symbolic link", SandboxError)
    refused(lambda: box.stat("/session/missing"), "does not exist", SandboxNotFound)


# -- read ---------------------------------------------------------------------------------


def test_read_text_whole_and_windows(box):
    page = box.read("/input/a.txt")
    assert isinstance(page, TextContent)
    assert (page.text, page.total_lines, page.truncated, page.truncated_by) == (
        "one\ntwo\nthree\n",
        3,
        False,
        None,
    )
    page = box.read("/input/a.txt", offset=2, limit=1)
    assert (page.text, page.start_line, page.line_count) == ("two\n", 2, 1)
    assert (page.truncated, page.truncated_by, page.total_lines) == (True, "lines", 3)
    page = box.read("/input/a.txt", offset=3)
    assert (page.text, page.truncated) == ("three\n", False)
    page = box.read("/input/a.txt", offset=9)
    assert (page.text, page.line_count, page.total_lines, page.truncated) == ("", 0, 3, False)
    refused(lambda: box.read("/input/a.txt", offset=0), "count lines from 1", SandboxError)
    (box.session / "empty.txt").write_text("")
    assert box.read("/session/empty.txt").total_lines == 0
    (box.session / "noeol.txt").write_text("a\nb")
    assert box.read("/session/noeol.txt").total_lines == 2


def test_read_caps_truncate_by_lines_and_by_bytes(box):
    box.caps = ReadCaps(lines=3, text_bytes=10)
    (box.session / "many.txt").write_text("".join(f"{i}\n" for i in range(1, 10)))
    page = box.read("/session/many.txt")
    assert (page.text, page.truncated_by, page.total_lines) == ("1\n2\n3\n", "lines", 9)
    page = box.read("/session/many.txt", limit=9)
    assert (page.text, page.truncated_by) == ("1\n2\n3\n4\n5\n", "bytes")
    (box.session / "wide.txt").write_text("é" * 20 + "\n")  # 2 bytes each; cut on a boundary
    page = box.read("/session/wide.txt")
    assert (page.text, page.truncated, page.truncated_by) == ("é" * 5, True, "bytes")
    box.caps = ReadCaps()
    big = "".join(f"line {i}\n" for i in range(300_000))  # several chunks, over both caps
    (box.session / "big.txt").write_text(big)
    page = box.read("/session/big.txt", offset=299_999, limit=5)
    assert (page.text, page.total_lines, page.truncated) == (
        "line 299998\nline 299999\n",
        300_000,
        False,
    )
    page = box.read("/session/big.txt", offset=150_001, limit=1)
    assert (page.text, page.truncated_by) == ("line 150000\n", "lines")
    page = box.read("/session/big.txt")
    assert page.line_count == 2000 and page.truncated_by == "lines"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_images_are_detected_by_their_first_bytes(box, name):
    data, mime = IMAGES[name]
    (box.session / f"picture.{name}.bin").write_bytes(data)  # the name says nothing
    image = box.read(f"/session/picture.{name}.bin")
    assert isinstance(image, ImageContent)
    assert (image.data, image.mime, image.size) == (data, mime, len(data))
    assert json.loads(json.dumps(as_dict(image)))["mime"] == mime


def test_binary_is_said_plainly_and_big_images_are_not_returned(box):
    (box.session / "blob.dat").write_bytes(b"abc\0def")
    (box.session / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    for path in ("/session/blob.dat", "/session/latin1.txt"):
        result = box.read(path)
        assert isinstance(result, BinaryContent)
        assert "binary file" in result.note and "content is not shown" in result.note
    box.caps = ReadCaps(image_bytes=16)
    (box.session / "big.png").write_bytes(PNG)
    result = box.read("/session/big.png")
    assert isinstance(result, BinaryContent) and result.mime == "image/png"
    assert f"image of {len(PNG)} bytes, over the 16-byte cap" in result.note


def test_read_refusals_guide_to_the_fix(box):
    readable = "Readable: /data, /input, /output, /session, /workers, /workspace"
    refused(lambda: box.read("/etc/passwd"), "Cannot read '/etc/passwd': outside the sandbox")
    refused(lambda: box.read("/etc/passwd"), readable)
    refused(lambda: box.read("/input/../output/x"), "'..' is not allowed")
    refused(lambda: box.read("input/a.txt"), "use an absolute path")
    refused(lambda: box.read("/input/a\0.txt"), "NUL")
    refused(lambda: box.read("/staged/x"), "/staged is the run's write-only outbox")
    refused(lambda: box.read("/input/missing.txt"), "/input/missing.txt does not exist",
            SandboxNotFound)  # fmt: skip
    refused(lambda: box.read("/input/sub"), "is a folder; list it instead", SandboxError)
    refused(lambda: box.read("/input"), "is a folder", SandboxError)
    refused(lambda: box.read("/input/a.txt/x"), "/input/a.txt is a file, not a folder",
            SandboxError)  # fmt: skip


# -- links, FIFOs, sockets, devices ----------------------------------------------------------


def test_links_fifos_sockets_and_devices_are_refused(box):
    s = box.session
    (s / "file-link").symlink_to(box.outside / "secret.txt")
    (s / "dir-link").symlink_to(box.outside)
    (s / "up").symlink_to("..")
    os.mkfifo(s / "pipe")
    server = socket.socket(socket.AF_UNIX)
    # Through the folder's descriptor: a socket path has a 107-byte limit, which a deep
    # tmp folder (pytest -n's per-worker one) goes over.
    folder = os.open(s, os.O_RDONLY | os.O_DIRECTORY)
    try:
        server.bind(f"/proc/self/fd/{folder}/sock")
    finally:
        os.close(folder)
    server.listen()
    try:
        started = time.monotonic()
        for path, what in [
            ("/session/file-link", "is a symbolic link"),
            ("/session/dir-link/secret.txt", "/session/dir-link is a symbolic link"),
            ("/session/up/session", "is a symbolic link"),
            ("/session/pipe", "is a FIFO (named pipe)"),
            ("/session/sock", "is a socket"),
        ]:
            refused(lambda p=path: box.read(p), what, SandboxError)
            refused(lambda p=path: box.write(p, "x"), what, SandboxError)
            refused(lambda p=path: box.write(p, "x", append=True), what, SandboxError)
            refused(lambda p=path: box.delete(p), what, SandboxError)
            assert not box.can_read(path)
            assert not box.can_write(path)
        refused(lambda: box.write("/session/dir-link/new.txt", "x"), "symbolic link", SandboxError)
        assert time.monotonic() - started < 5  # a FIFO is never waited on
    finally:
        server.close()
    assert sorted(os.listdir(box.outside)) == ["secret.txt"]
    assert (box.outside / "secret.txt").read_text() == "HOST-SECRET"
    assert (s / "file-link").is_symlink() and (s / "pipe").exists()


def test_devices_are_refused(box):
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(box.session / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    refused(lambda: box.read("/session/null"), "is a character device", SandboxError)
    refused(lambda: box.write("/session/null", "x", append=True), "character device",
            SandboxError)  # fmt: skip


# -- write --------------------------------------------------------------------------------


def test_write_creates_folders_replaces_atomically_and_appends(box):
    result = box.write("/session/a/b/c.txt", "hello\n")
    assert result == WriteResult("/session/a/b/c.txt", 6, 6, True, False, "/session")
    target = box.session / "a" / "b" / "c.txt"
    assert target.read_text() == "hello\n"
    uid = box.prepared.uid if os.geteuid() == 0 else os.getuid()
    for made in (box.session / "a", box.session / "a" / "b", target):
        assert made.stat().st_uid == uid  # the worker can still change what we made
    os.chmod(target, 0o600)
    inode = target.stat().st_ino
    result = box.write("/session/a/b/c.txt", b"bytes too\n")
    assert (result.created, result.size) == (False, 10)
    assert target.stat().st_ino != inode  # a new file renamed into place
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # mode kept
    result = box.write("/session/a/b/c.txt", "more\n", append=True)
    assert (result.appended, result.size, result.written) == (True, 15, 5)
    assert target.read_text() == "bytes too\nmore\n"
    assert box.write("/session/log.txt", "x", append=True).created
    assert [n for n in os.listdir(box.session / "a" / "b") if n.endswith(".tmp")] == []


def test_write_refusals_name_what_is_allowed(box):
    refused(
        lambda: box.write("/input/x", "x"),
        "Cannot write '/input/x': /input is read-only. Writable: /data, /output, /session, "
        "/staged, /workspace",
    )
    refused(lambda: box.write("/output/run.sh", "x"), "/output accepts only .md, .txt files")
    refused(lambda: box.write("/output/big.md", "x" * 2000),
            "2000 bytes exceeds /output's per-file cap of 1024")  # fmt: skip
    box.write("/output/log.md", "x" * 1000)
    refused(lambda: box.write("/output/log.md", "y" * 100, append=True),
            "appending 100 bytes makes 1100 bytes, over the per-file cap of 1024",
            SandboxError)  # fmt: skip
    assert (box.session.parent.parent.parent / "output" / "log.md").read_text() == "x" * 1000
    refused(lambda: box.write("/workers/w.worker", "x"), "/workers is read-only")
    refused(lambda: box.write("/etc/x", "x"), "outside the sandbox")
    refused(lambda: box.write("/session", "x"), "it is a folder", SandboxError)
    (box.session / "d").mkdir()
    refused(lambda: box.write("/session/d", "x"), "is a folder; write to a file", SandboxError)
    refused(lambda: box.write("/staged/report.md", "x"),
            "/staged is the container's outbox, not a host folder")  # fmt: skip
    refused(lambda: box.write("/staged/report.md", "x"), "Writable here: /data, /output")
    assert box.can_write("/output/ok.md", size=10)
    assert not box.can_write("/output/ok.md", size=4096)
    assert not box.can_write("/output/ok.sh")
    assert not box.can_write("/staged/x.md")
    assert box.can_write("/session/new/deep/file.txt")
    assert not box.can_write("/session/d")


def test_outbox_writes_go_through_the_staging_hook(project, box):
    class Hook:
        def __init__(self):
            self.calls = []

        def stage_write(self, relative, data, *, append):
            self.calls.append((relative, data, append))
            return WriteResult(f"/staged/{relative}", len(data), len(data), True, append,
                               "/staged", review=True)  # fmt: skip

    hook = Hook()
    files = SandboxFiles(box.prepared.grant, outbox=hook)
    with files:
        assert files.write("/staged/out/r.md", "hi").review
        assert hook.calls == [("out/r.md", b"hi", False)]
        assert files.can_write("/staged/x.md")
        assert files.security_context()["host_staging"] is True
        refused(lambda: files.delete("/staged/out/r.md"), "write-only outbox")


def test_ask_zone_writes_land_in_the_private_copy(box):
    data = box.prepared.grant.zone("data")
    result = box.write("/data/new.txt", "draft")
    assert result.review
    assert (data.host_path / "new.txt").read_text() == "draft"
    assert not (data.ask_base / "new.txt").exists()  # the zone changes only on approval
    assert box.read("/data/kept.txt").text == "original"
    refused(lambda: box.delete("/data/kept.txt"), "deletes in /data are blocked")
    assert (data.host_path / "kept.txt").exists()


# -- delete -------------------------------------------------------------------------------


def test_delete_files_and_folders_without_following_links(box):
    (box.session / "f.txt").write_text("x")
    result = box.delete("/session/f.txt")
    assert (result.kind, result.removed) == ("file", 1)
    tree = box.session / "tree" / "deeper"
    tree.mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "to-outside").symlink_to(box.outside)
    (tree / "to-secret").symlink_to(box.outside / "secret.txt")
    os.mkfifo(tree / "pipe")
    result = box.delete("/session/tree")
    assert (result.kind, result.removed) == ("folder", 6)
    assert not (box.session / "tree").exists()
    assert (box.outside / "secret.txt").read_text() == "HOST-SECRET"
    refused(lambda: box.delete("/session"), "it is the root of /session", SandboxError)
    refused(lambda: box.delete("/input/a.txt"), "/input is read-only. Writable:")
    refused(lambda: box.delete("/session/none"), "does not exist", SandboxNotFound)
    refused(lambda: box.delete("/etc/passwd"), "outside the sandbox")


# -- context and audit ------------------------------------------------------------------------


def test_security_context_is_plain_json_without_host_paths(box, tmp_path):
    context = box.security_context()
    text = json.dumps(context)
    assert str(tmp_path) not in text
    assert context["trust"] == "session"
    assert context["network"] == "none"
    assert context["limits"]["timeout"] == 600.0
    zones = {z["path"]: z for z in context["zones"]}
    assert set(zones) == {"/data", "/input", "/output", "/session", "/staged", "/workers",
                          "/workspace"}  # fmt: skip
    assert zones["/input"] | {"suffixes": None} == {
        "path": "/input", "kind": "folder", "read": True, "list": True, "write": False,
        "delete": False, "approval": {"write": None, "delete": None}, "suffixes": None,
        "max_file_size": None,
    }  # fmt: skip
    assert zones["/output"]["suffixes"] == [".md", ".txt"]
    assert zones["/output"]["max_file_size"] == 1024
    assert zones["/data"]["approval"] == {"write": "ask", "delete": "blocked"}
    assert zones["/data"]["delete"] is False
    assert zones["/session"]["approval"] == {"write": "preApproved", "delete": "preApproved"}
    assert (zones["/staged"]["read"], zones["/staged"]["write"]) == (False, True)
    assert context["host_staging"] is False


def test_every_operation_allowed_or_refused_is_audited(box):
    box.write("/session/x.txt", "x")
    box.read("/session/x.txt")
    box.list("/")
    with contextlib.suppress(PolicyError):
        box.write("/input/x", "x")
    with contextlib.suppress(PolicyError):
        box.read("/etc/passwd")
    entries = box.audit_log.query(AuditFilter())
    seen = [(e.operation, e.path, e.allowed, e.session_id, e.zone) for e in entries]
    sid = box.prepared.session_id
    assert seen == [
        ("sandbox.write", "/session/x.txt", True, sid, "session"),
        ("sandbox.read", "/session/x.txt", True, sid, "session"),
        ("sandbox.list", "/", True, sid, None),
        ("sandbox.write", "/input/x", False, sid, "input"),
        ("sandbox.read", "/etc/passwd", False, sid, None),
    ]
    assert "read-only" in entries[3].reason
    assert entries[0].metadata == {"size": 1, "append": False}
    assert entries[0].worker == "w" and entries[0].trust_level == "session"


# -- a worker racing the host ------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def exchange(a, b):
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): never a moment without both."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def test_host_never_follows_a_folder_or_file_swapped_for_a_link(box):
    s = box.session
    (s / "d").mkdir()
    (s / "d" / "f.txt").write_text("inside")
    (s / "swap").symlink_to(box.outside)  # d <-> swap: a folder, then a link out
    (s / "g.txt").write_text("inside")
    (s / "g-swap").symlink_to(box.outside / "secret.txt")  # g.txt <-> g-swap
    stop = threading.Event()

    def attacker():
        while not stop.is_set():
            exchange(s / "d", s / "swap")
            exchange(s / "g.txt", s / "g-swap")

    outside = box.outside
    box = SandboxFiles(box.prepared.grant)  # no audit: its fsyncs would slow the race down
    thread = threading.Thread(target=attacker)
    thread.start()
    outcomes = {"ok": 0, "refused": 0}
    try:
        # Up to 3000 rounds of six calls, but no more once each outcome has been seen
        # 1000 times (ten times what the race being on needs, below): by then the attacker
        # has swapped under every call both ways, a thousand times over.
        for i in range(3000):
            if min(outcomes.values()) >= 1000:
                break
            for call in (
                lambda: box.read("/session/d/f.txt"),
                lambda: box.read("/session/g.txt"),
                lambda i=i: box.write(f"/session/d/w{i % 7}.txt", "written"),
                lambda: box.write("/session/d/log.txt", "+", append=True),
                lambda: box.write("/session/g.txt", "inside", append=True),
                lambda: box.list("/session/d"),
            ):
                try:
                    result = call()
                except SandboxError:
                    outcomes["refused"] += 1
                    continue
                outcomes["ok"] += 1
                if isinstance(result, TextContent):
                    assert "HOST-SECRET" not in result.text
                    assert result.text.startswith("inside")
                elif hasattr(result, "entries"):
                    assert "secret.txt" not in [e.name for e in result.entries]
    finally:
        stop.set()
        thread.join()
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "HOST-SECRET"
    box.close()
    assert outcomes["ok"] > 100 and outcomes["refused"] > 100, outcomes  # the race was on


def test_a_zone_that_is_a_single_file(box, tmp_path):
    from dataclasses import replace

    from orchestrator.policy import ZoneGrant

    policy = tmp_path / "policy.yaml"
    policy.write_text("zones: {}\n")
    (box.session / "policy.yaml").write_text("zones: {}\n")  # where the bind lands
    guard = ZoneGrant("guard", policy, "/session/policy.yaml", "ro")
    grant = replace(box.prepared.grant, zones=(*box.prepared.grant.zones, guard))
    with SandboxFiles(grant) as files:
        assert files.read("/session/policy.yaml").text == "zones: {}\n"
        assert files.stat("/session/policy.yaml").kind == "file"
        assert "policy.yaml" in [e.name for e in files.list("/session").entries]
        refused(
            lambda: files.write("/session/policy.yaml", "x"), "/session/policy.yaml is read-only"
        )
        refused(lambda: files.delete("/session/policy.yaml"), "is read-only")
        refused(lambda: files.list("/session/policy.yaml"), "is a file, not a folder", SandboxError)
        refused(lambda: files.read("/session/policy.yaml/x"), "is a file, not a folder",
                SandboxError)  # fmt: skip


def test_folders_above_a_restricted_zone_are_plain_virtual_folders(project):
    project.zone("data", "ro", files={"sub/x.txt": "x", "other/secret.txt": "no"})
    project.worker("w", "trust: session\nsandbox: {zones: [{name: data, restrict: sub}]}")
    _, files, _ = build(project)
    with files:
        assert [e.name for e in files.list("/").entries] == [
            "data",
            "session",
            "staged",
            "workers",
            "workspace",
        ]
        assert [(e.name, e.kind) for e in files.list("/data").entries] == [("sub", "folder")]
        assert files.stat("/data").kind == "folder"
        assert files.read("/data/sub/x.txt").text == "x"
        refused(lambda: files.read("/data/other/secret.txt"), "outside the sandbox")
        refused(lambda: files.write("/data/new.txt", "x"), "outside the sandbox")


def test_a_change_the_audit_log_cannot_record_is_never_made(box):
    box.audit_log.path.unlink(missing_ok=True)
    box.audit_log.close()
    box.audit_log.path.mkdir()  # the log cannot be written: a folder is in its place
    with pytest.raises(AuditError):
        box.write("/data/new.txt", "x")
    with pytest.raises(AuditError):
        box.delete("/data/kept.txt")
    data = box.prepared.grant.mount_at("/data").host_path
    assert not (data / "new.txt").exists() and (data / "kept.txt").exists()


def test_os_errors_and_wrong_types_are_clear_refusals(box):
    long = "/output/" + "n" * 256 + ".txt"
    for call, verb in (
        (lambda: box.write(long, "x"), "write"),
        (lambda: box.write(f"{long}/f.txt", "x"), "write"),
        (lambda: box.read(long), "read"),
        (lambda: box.stat(long), "stat"),
        (lambda: box.delete(long), "delete"),
        (lambda: box.resolve(f"{long}/f.txt"), "resolve"),
    ):
        error = refused(call, "a name in it is too long (at most 255 bytes", SandboxError)
        assert str(error).startswith(f"Cannot {verb} '/output/nnn")
    assert not box.exists(long) and not box.can_read(long) and not box.can_write(long)
    denied = box.audit_log.query(AuditFilter(denied_only=True))
    assert len(denied) == 7 and all("too long" in (e.reason or "") for e in denied)
    refused(lambda: box.write("/data/x.txt", "\ud800"), "pass the content as bytes", SandboxError)
    assert box.write("/data/b.txt", "\udcff").size == 1  # an undecodable byte, written as is
    with pytest.raises(TypeError, match="limit must be a whole number"):
        box.read("/input/a.txt", limit="5")
    with pytest.raises(TypeError, match="path must be a string"):
        box.list(None)
    with pytest.raises(TypeError, match="content must be text"):
        box.write("/data/c.txt", None)
