"""The outbox: a size-capped tmpfs per run, read out only after the worker's processes end."""

from __future__ import annotations

import pytest

from tests.integration.test_zones import TarContents, run, script_worker

pytestmark = pytest.mark.docker


def test_outbox_has_a_hard_cap_seen_as_no_space_inside(engine, project):
    project.extra = "sandbox: {outbox: {size: 1m}}\n"
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


def test_stragglers_are_killed_before_the_outbox_is_read(engine, project):
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


def test_timeout_with_an_outbox_still_collects_what_was_written(engine, project):
    script_worker(
        project,
        "w",
        "import time; open('/staged/partial', 'w').write('half'); time.sleep(60)",
        "sandbox: {}",
    )
    result, _, _ = run(engine, project, "w", staging=TarContents(), timeout=2)
    assert (result.status, result.exit_code, result.container_removed) == ("timeout", 124, True)
    assert result.outbox == {"partial": b"half"}


def test_oom_with_an_outbox_is_137(engine, project):
    script_worker(
        project,
        "w",
        "hog = []\nwhile True: hog.append(bytearray(8 << 20))",
        "sandbox: {}\nresources: {memory: 64m}",
    )
    result, _, _ = run(engine, project, "w", staging=TarContents())
    assert (result.status, result.exit_code) == ("oom", 137)


def test_missing_command_with_an_outbox_is_127(engine, project):
    project.worker("w", 'command: ["/no/such/program"]\nsandbox: {}')
    result, _, _ = run(engine, project, "w", staging=TarContents())
    assert (result.status, result.exit_code) == ("error", 127)


def test_worker_cannot_stop_the_keepalive(engine, project):
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


def test_a_huge_sparse_file_neither_hangs_nor_fills_the_host(engine, project):
    script_worker(
        project,
        "w",
        "f = open('/staged/huge', 'wb'); f.truncate(1 << 40); f.close(); "
        "open('/staged/ok.md', 'w').write('fine')",
        "sandbox: {}",
    )
    from orchestrator.config import load_project, load_worker
    from orchestrator.runtime import execute, prepare
    from orchestrator.runtime.outbox import StagingReader
    from orchestrator.runtime.preparation import open_audit

    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    audit = open_audit(loaded)
    result = execute(engine, prepared, audit=audit, staging=StagingReader(loaded, audit))
    assert result.exit_code == 0, result.stderr
    assert result.duration_s < 30  # a 1 TiB apparent size is refused from its header
    assert result.container_removed
    reasons = " ".join(r["reason"] for r in result.outbox.rejected)
    assert "huge" in " ".join(r["path"] for r in result.outbox.rejected), reasons
