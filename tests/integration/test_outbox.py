"""The outbox: a size-capped tmpfs per run, read out only after the worker's processes end."""

from __future__ import annotations

import pytest

from orchestrator.runtime.container import ContainerBackend
from tests.integration.test_zones import TarContents, run, script_worker

pytestmark = pytest.mark.docker


def test_outbox_has_a_hard_cap_seen_as_no_space_inside(engine, project, isolation):
    project.extra += "sandbox: {outbox: {size: 1m}}\n"
    project.write_project()
    script_worker(
        project,
        "w",
        """
        import errno
        try:
            with open("/staged/big", "wb") as f:
                for _ in range(8):
                    f.write(b"x" * (512 << 10)); f.flush()
            print("FILLED")
        except OSError as e:
            print(errno.errorcode[e.errno])
        """,
        "sandbox: {}",
    )
    result, _, _ = run(engine, project, "w", staging=TarContents())
    assert "ENOSPC" in result.stdout
    assert "FILLED" not in result.stdout
    assert len(result.outbox["big"]) <= 1 << 20


def test_stragglers_are_killed_before_the_outbox_is_read(engine, project, isolation):
    script_worker(
        project,
        "w",
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            for i in range(600):
                open("/staged/late", "w").write(str(i)); time.sleep(0.05)
            os._exit(0)
        open("/staged/main", "w").write("done")
        print("main exits")
        """,
        "sandbox: {}\nresources: {timeout: 60}",
    )
    result, _, _ = run(engine, project, "w", staging=TarContents())
    assert result.exit_code == 0, result.stderr
    assert result.duration_s < 15  # the straggler would have run for 30 s
    assert result.outbox["main"] == b"done"


def test_timeout_with_an_outbox_still_collects_what_was_written(engine, project, isolation):
    script_worker(
        project,
        "w",
        "import time; open('/staged/partial', 'w').write('half'); time.sleep(60)",
        "sandbox: {}",
    )
    result, _, _ = run(engine, project, "w", staging=TarContents(), timeout=2)
    assert (result.status, result.exit_code, result.container_removed) == ("timeout", 124, True)
    assert result.outbox == {"partial": b"half"}


def test_oom_with_an_outbox_is_137(engine, project, isolation):
    script_worker(
        project,
        "w",
        "hog = []\nwhile True: hog.append(bytearray(8 << 20))",
        "sandbox: {}\nresources: {memory: 64m}",
    )
    result, _, _ = run(engine, project, "w", staging=TarContents())
    assert (result.status, result.exit_code) == ("oom", 137)
    if isolation == "gvisor" and result.error.startswith("ran out of memory at its limit"):
        assert result.outbox == {}  # refused allocations, no kill: the outbox is still read
    else:  # the kernel killed it (under gVisor: the whole sandbox, when the host's cgroup
        # reached its limit before gVisor's own accounting refused an allocation)
        assert result.error.startswith("killed for exceeding its memory limit"), result.error
        if result.outbox is None:
            assert "its outbox was lost with its container" in result.error


def test_missing_command_with_an_outbox_is_127(engine, project):
    project.worker("w", 'command: ["/no/such/program"]\nsandbox: {}')
    result, _, _ = run(engine, project, "w", staging=TarContents())
    assert (result.status, result.exit_code) == ("error", 127)


def test_worker_cannot_stop_the_keepalive(engine, project, isolation):
    script_worker(
        project,
        "w",
        """
        import os, signal
        open("/staged/kept", "w").write("yes")
        try:
            os.kill(1, signal.SIGKILL)
        except PermissionError:
            print("pid 1 refused")
        os.system("kill -9 -1")
        """,
        "sandbox: {}",
    )
    result, _, _ = run(engine, project, "w", staging=TarContents())
    assert "pid 1 refused" in result.stdout
    assert result.outbox == {"kept": b"yes"}


def test_a_huge_sparse_file_neither_hangs_nor_fills_the_host(engine, project, isolation):
    script_worker(
        project,
        "w",
        "f = open('/staged/huge', 'wb'); f.truncate(1 << 40); f.close(); "
        "open('/staged/ok.md', 'w').write('fine')",
        "sandbox: {}",
    )
    from orchestrator.config import load_project, load_worker
    from orchestrator.prepare import prepare
    from orchestrator.runtime import execute
    from orchestrator.runtime.host_folders import open_audit
    from orchestrator.runtime.outbox import StagingReader

    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    audit = open_audit(loaded)
    result = execute(
        ContainerBackend(engine), prepared, audit=audit, staging=StagingReader(loaded, audit)
    )
    assert result.exit_code == 0, result.stderr
    assert result.duration_s < 30  # a 1 TiB apparent size is refused from its header
    assert result.container_removed
    reasons = " ".join(r["reason"] for r in result.outbox.rejected)
    assert "huge" in " ".join(r["path"] for r in result.outbox.rejected), reasons


def test_a_sparse_file_does_not_hide_the_rest_of_the_outbox(engine, project, isolation):
    """10 GiB apparent, one byte written: refused by name, and every later entry judged.

    gVisor's tmpfs shows no holes, so tar stores the file in full there: it is then refused
    for its size, listed after every other entry (runtime.supervised.GVISOR_TAR)."""
    script_worker(
        project,
        "w",
        """
        import os
        with open("/staged/big.bin", "wb") as f:
            f.seek(10 << 30)
            f.write(b"x")
        open("/staged/report.md", "w").write("the report")
        os.symlink("/etc/passwd", "/staged/link")
        os.mkfifo("/staged/fifo")
        """,
        "sandbox: {}",
    )
    from tests.integration.conftest import cli

    done = cli("run", "w", "--json", "--project", str(project.root), timeout=90)
    assert done.returncode == 0, done.stderr
    outbox = done.json()["outbox"]
    rejected = {r["path"]: r["reason"] for r in outbox["rejected"]}
    if isolation == "gvisor":
        assert "stores 10737418752 bytes, more than the stream may hold" in rejected["big.bin"]
    else:
        assert "sparse file (10737418241 bytes apparent" in rejected["big.bin"]
    assert "symbolic link to '/etc/passwd'" in rejected["link"]
    assert "FIFO" in rejected["fifo"]
    assert "(stream)" not in rejected  # the whole stream was read
    assert outbox["files"] == 1

    shown = cli("staged", "show", outbox["change_id"], "--json", "--project", str(project.root))
    assert shown.returncode == 0, shown.stderr
    change = shown.json()
    assert [f["path"] for f in change["files"]] == ["report.md"]
    assert {r["path"] for r in change["rejected"]} == {"big.bin", "link", "fifo"}
