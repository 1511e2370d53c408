"""The single-use warm pool against the real engine: a pooled run works like a cold one and
stages its outbox, every take gets its own container (never reused), closing removes what
was never handed out, an allowlisted pooled run has its own network and a working proxy,
and a SIGKILLed owner leaves nothing after ``orchestrator gc``; allowlisted runs of a batch
made at once each reach the allowed host only."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from orchestrator import Orchestrator, labels
from orchestrator.audit import AuditFilter
from orchestrator.docker import egress as eg
from orchestrator.docker.netnames import network_name
from orchestrator.runtime.pool import PoolError
from tests.integration.conftest import cli
from tests.integration.test_egress import internet, last_json, probe_script  # noqa: F401

pytestmark = pytest.mark.docker

OUTBOX_WORKER = """
command: ["/bin/sh", "-c", "echo report > /staged/report.md; echo done"]
sandbox: {}
"""
PLAIN_WORKER = 'command: ["/bin/sh", "-c", "echo hello"]\ntrust: session\nsandbox: {}'


def run_objects(engine, run_id: str) -> list:
    return [o for o in engine.list_managed() if o.labels.get(labels.RUN_ID) == run_id]


def test_a_pooled_run_works_like_a_cold_one_and_stages_its_outbox(engine, project):
    project.worker("w", OUTBOX_WORKER)
    orch = Orchestrator(project.root, engine=engine)
    seen: list[bytes] = []
    with orch.pool("w", size=1) as pool:
        assert pool.wait_ready(120)
        run = pool.take(on_output=lambda _stream, chunk: seen.append(chunk))
        assert run.launch.container_id is not None
        assert [o.id for o in run_objects(engine, run.spec.run_id)] == [run.launch.container_id]
        try:
            run.run_worker()
            run.collect()
        finally:
            result = run.close()
    assert result.status == "exited" and result.exit_code == 0 and result.container_removed
    assert b"".join(seen) == b"done\n"
    assert result.outbox.change_id is not None and result.outbox.files == 1
    assert result.duration_s < 30
    assert run_objects(engine, run.spec.run_id) == []
    assert not run.prepared.paths.run_dir.exists()


def test_a_pool_of_two_serving_five_takes_makes_five_containers(engine, project):
    project.worker("w", PLAIN_WORKER)
    orch = Orchestrator(project.root, engine=engine)
    results = []
    containers = set()
    with orch.pool("w", size=2) as pool:
        for _ in range(5):
            run = pool.take()
            containers.add(run.launch.container_id)
            try:
                run.run_worker()
                run.collect()
            finally:
                results.append(run.close())
        assert pool.handed_out == 5
    assert len(containers) == 5  # never reused
    assert len({r.run_id for r in results}) == 5
    assert all(r.exit_code == 0 and r.stdout == "hello\n" for r in results), results
    for r in results:
        assert run_objects(engine, r.run_id) == []


def test_close_removes_what_was_never_handed_out_and_records_it_unused(engine, project):
    project.worker("w", PLAIN_WORKER)
    orch = Orchestrator(project.root, engine=engine)
    pool = orch.pool("w", size=3)
    try:
        assert pool.wait_ready(120)
        run = pool.take()
        run.run_worker()
        run.close()
    finally:
        pool.close()
    started = orch.audit.query(AuditFilter(operation="run.started"))
    ended = orch.audit.query(AuditFilter(operation="run.ended"))
    assert sorted(e.run_id for e in started) == sorted(e.run_id for e in ended)
    unused = [e for e in ended if e.metadata["status"] == "unused"]
    assert len(started) >= 4 and len(unused) == len(started) - 1  # refills are unused too
    for entry in started:
        assert run_objects(engine, entry.run_id) == []
    assert list((project.root / ".sandbox" / "runs").glob("*")) == []
    with pytest.raises(PoolError, match="closed"):
        pool.take()


def test_a_pooled_run_handed_out_as_a_session(engine, project):
    project.worker("w", PLAIN_WORKER)
    orch = Orchestrator(project.root, engine=engine)
    with orch.pool("w", size=1) as pool, pool.open_session(idle_timeout=60) as session:
        done = session.exec("echo $((6 * 7))")
        assert done.exit_code == 0 and done.stdout == "42\n"
        run_id = session.run_id
        assert len(run_objects(engine, run_id)) == 1
    assert run_objects(engine, run_id) == []


def test_the_pool_refuses_what_it_cannot_serve(project):
    project.worker("w", PLAIN_WORKER)
    orch = Orchestrator(project.root)
    with pytest.raises(PoolError, match="explicit session id"):
        orch.pool("w", size=1, session_id="mine")
    with pytest.raises(PoolError, match="at least one"):
        orch.pool("w", size=0)


ALLOW_JOBS = [
    ["fetch", "http_allowed", "http://allowed.test/"],
    ["fetch", "http_denied", "http://denied.test/"],
]


def allowlist_worker(project) -> None:
    command = json.dumps(["python3", "-c", probe_script(ALLOW_JOBS)])
    project.extra = "untrusted_network: allow\n"
    project.write_project()
    project.worker("listed", f"command: {command}\nnetwork: {{allow: [allowed.test]}}")


def test_an_allowlisted_pooled_run_has_its_own_network_and_a_working_proxy(
    engine,
    internet,  # noqa: F811
    project,
):
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    allowlist_worker(project)
    orch = Orchestrator(project.root, engine=engine)
    with orch.pool("listed", size=2) as pool:
        assert pool.wait_ready(120)
        first, second = pool.take(), pool.take()
        names = [network_name(first.spec), network_name(second.spec)]
        assert names == [f"orchestrator-run-{r.spec.run_id}" for r in (first, second)]
        for name in names:  # made ahead, the proxy already attached
            (net,) = engine.api.networks(names=[name])
            attached = engine.api.inspect_network(net["Id"])["Containers"]
            assert len(attached) == 2, attached  # the run's container and the proxy
        results = []
        for run in (first, second):
            try:
                run.run_worker()
            finally:
                results.append(run.close())
    for name, result in zip(names, results, strict=True):
        seen = last_json(result.stdout)
        assert seen["http_allowed"][:2] == ["ok", 200], seen
        assert seen["http_denied"][:2] == ["http-error", 403], seen
        assert not engine.api.networks(names=[name])  # gone with its run


@pytest.mark.serial
def test_a_sigkilled_pool_owner_leaves_nothing_after_gc(
    engine,
    internet,  # noqa: F811
    project,
):
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    allowlist_worker(project)
    code = textwrap.dedent(
        f"""
        import time
        from orchestrator import Orchestrator
        pool = Orchestrator({str(project.root)!r}).pool("listed", size=3)
        assert pool.wait_ready(120)
        print("ready", flush=True)
        time.sleep(600)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line == "ready", process.stderr.read() if process.stderr else ""
        process.kill()
        process.wait(timeout=30)
    finally:
        process.kill()
        process.communicate()

    def owned():
        return [
            o for o in engine.list_managed() if o.labels.get(labels.OWNER_PID) == str(process.pid)
        ]

    kinds = sorted(o.kind for o in owned())
    assert kinds == ["container"] * 3 + ["network"] * 3  # SIGKILL gives no chance...
    result = cli("gc", "--json")
    assert result.returncode == 0, result.stderr
    assert owned() == []  # ...gc does


def test_a_pool_left_open_is_closed_when_its_program_exits(engine, project):
    project.worker("w", PLAIN_WORKER)
    code = textwrap.dedent(
        f"""
        import os
        from orchestrator import Orchestrator
        pool = Orchestrator({str(project.root)!r}).pool("w", size=2)
        assert pool.wait_ready(120)
        print(os.getpid(), flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    assert [o for o in engine.list_managed() if o.labels.get(labels.OWNER_PID) == pid] == []
    assert list((project.root / ".sandbox" / "runs").glob("*")) == []


def test_allowlisted_runs_of_a_batch_at_once_each_reach_the_allowed_host_only(
    engine,
    internet,  # noqa: F811
    project,
    tmp_path,
):
    # Six runs at a time, each making its own network and attaching the shared proxy to it
    # while the others do the same: none may see another's failure (502, no name).
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    checked = probe_script(ALLOW_JOBS) + (
        "\nimport sys\n"
        "sys.exit(0 if results['http_allowed'][:2] == ['ok', 200]"
        " and results['http_denied'][:2] == ['http-error', 403] else 3)\n"
    )
    command = json.dumps(["python3", "-c", checked])
    project.extra = "untrusted_network: allow\n"
    project.write_project()
    project.worker("listed", f"command: {command}\nnetwork: {{allow: [allowed.test]}}")
    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(12):
        (folder / f"d{n:02d}.txt").write_text(f"doc {n}")
    done = Orchestrator(project.root, engine=engine).batch("listed", [folder], concurrency=6)
    assert [r["status"] for r in done.records] == ["succeeded"] * 12, done.records
    assert done.exit_code == 0
