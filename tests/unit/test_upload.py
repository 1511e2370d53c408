"""What a harness uploads from a task's folder: never through a link out of it."""

from __future__ import annotations

import io
import os
import tarfile
import time

import pytest

from orchestrator.integrations.upload import pack_folder, read_file


@pytest.fixture
def victim(tmp_path_factory):
    """Another user's key: its access time is set well before its change, so any read
    moves it (relatime)."""
    home = tmp_path_factory.mktemp("victim")
    (home / ".ssh").mkdir()
    key = home / ".ssh" / "id_rsa"
    key.write_text("PRIVATE KEY")
    os.utime(key, (1_000_000, time.time()))
    return home


@pytest.fixture
def task(tmp_path):
    root = tmp_path / "task"
    for rel, body in {"environment/Dockerfile": "FROM x", "tests/test.sh": "#!/bin/sh\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    return root


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_files_and_folders_of_the_task_upload_as_they_are(task):
    assert read_file(task / "tests" / "test.sh", task, 1 << 20) == b"#!/bin/sh\n"
    (task / "tests" / "sub").mkdir()
    (task / "tests" / "sub" / "data.txt").write_text("data")
    found = members(pack_folder(task / "tests", task, 1 << 20))
    assert set(found) == {"test.sh", "sub", "sub/data.txt"}
    assert found["sub"].isdir() and found["sub/data.txt"].size == 4


def test_a_link_out_of_the_task_is_refused_or_sent_as_the_link(task, victim):
    key = victim / ".ssh" / "id_rsa"
    (task / "tests" / "key").symlink_to(key)
    (task / "solution").symlink_to(victim / ".ssh")
    with pytest.raises(OSError, match=r"tests/key is a symbolic link \(to .*id_rsa\)"):
        read_file(task / "tests" / "key", task, 1 << 20)
    for path in (task / "solution", task / "solution" / "id_rsa"):
        with pytest.raises(OSError, match=r"task/solution is a symbolic link \(to .*\.ssh\)"):
            (pack_folder if path.name == "solution" else read_file)(path, task, 1 << 20)
    found = members(pack_folder(task / "tests", task, 1 << 20))
    assert found["key"].issym() and found["key"].linkname == str(key)  # the link, not the key
    assert key.stat().st_atime == 1_000_000  # never read


def test_special_files_and_sizes_over_the_cap_are_refused(task):
    os.mkfifo(task / "tests" / "pipe")
    with pytest.raises(OSError, match="pipe: a FIFO"):
        pack_folder(task / "tests", task, 1 << 20)
    os.unlink(task / "tests" / "pipe")
    (task / "tests" / "big").write_bytes(bytes(2048))
    with pytest.raises(OSError, match="too large"):
        pack_folder(task / "tests", task, 1024)
    with pytest.raises(OSError, match="too large"):
        read_file(task / "tests" / "big", task, 1024)
