"""Hardening tried from inside real containers, through the real command line.

io_uring is blocked by the project's own seccomp profile at every trust level, workers get
ulimits, the policy files stay read-only even for a ``full`` worker, and the shipped images
hold no setuid or setgid file.
"""

from __future__ import annotations

import json
import os
import platform
import textwrap
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.config import load_project, load_worker
from orchestrator.docker.podman import engine_kind
from orchestrator.prepare import prepare
from orchestrator.runtime.host_folders import make_host_folders
from tests.integration.conftest import cli
from tests.integration.test_zones import git_init

#: ``io_uring_setup`` on both architectures (the generic syscall table on aarch64).
IO_URING_SETUP = {"x86_64": 425, "aarch64": 425}

PROBE = """
import ctypes, errno, os, resource
print("release", os.uname().release)
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)  # struct io_uring_params
fd = libc.syscall({nr}, 4, params)
print("io_uring_setup", fd, errno.errorcode.get(ctypes.get_errno(), "-") if fd < 0 else "OK")
print("core", *resource.getrlimit(resource.RLIMIT_CORE))
print("nofile", *resource.getrlimit(resource.RLIMIT_NOFILE))
print("seccomp", open("/proc/self/status").read().split("Seccomp:")[1].split()[0])
"""


def write_script_worker(project, name: str, script: str, front: str) -> None:
    command = json.dumps(["python3", "-c", textwrap.dedent(script)])
    project.worker(name, f"command: {command}\n{textwrap.dedent(front).strip()}")


@pytest.mark.parametrize("trust", ["untrusted", "session", "full"])
def test_io_uring_is_refused_and_ulimits_apply_at_every_trust_level(engine, project, trust):
    machine = platform.machine()
    if machine not in IO_URING_SETUP:
        pytest.skip(f"no io_uring_setup number known for {machine}")
    if trust == "full":
        git_init(project.root)
    write_script_worker(
        project, "probe", PROBE.format(nr=IO_URING_SETUP[machine]), f"trust: {trust}\nsandbox: {{}}"
    )
    result = cli("run", "probe", "--project", str(project.root))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    plan = cli("plan", "probe", "--project", str(project.root), "--json").json()
    if plan["isolation"] == "gvisor":
        # runsc applies the profile to the container's own process only, not to exec'd
        # ones (this worker runs by exec: it has an outbox), so gVisor's own kernel serves
        # the call; it never reaches the host's (docs/security.md). The container's own
        # process gets EPERM: test_the_runtime_is_really_used_and_threads_work.
        assert f"release {os.uname().release}" not in lines, result.stdout
        assert "core 0 0" in lines and "nofile 1024 4096" in lines, lines
        return
    assert "io_uring_setup -1 EPERM" in lines, result.stdout
    assert "core 0 0" in lines
    # Podman may raise an exec'd command's soft nofile limit (these workers run by exec:
    # they have an outbox) to its hard one, as the worker itself may; the hard limit is
    # the same. See docs/engines.md.
    raised = engine_kind(engine).podman
    assert "nofile 1024 4096" in lines or (raised and "nofile 4096 4096" in lines), lines
    assert "seccomp 2" in lines  # a filter is in place


def test_every_exec_gets_the_plans_open_file_limit_under_load(engine, project):
    """runc sets an exec's rlimits after starting it, racing Go's start-up in ``runc init``
    that raises the soft nofile limit to the hard one (orchestrator/docker/execlimits.py):
    under load an exec'd worker saw ``nofile 4096 4096``. Execs four at a time, each one
    must see the plan's limits."""
    project.worker("w", 'command: ["true"]\ntrust: session\nsandbox: {}')
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    spec = prepared.spec
    assert (spec.isolation, spec.supervisor_user is not None) == ("runc", True)  # runs by exec
    make_host_folders(prepared)
    container_id = engine.create(spec)
    try:
        engine.start(container_id)
        probe = ["python3", "-c", "import resource as r; print(*r.getrlimit(r.RLIMIT_NOFILE))"]

        def limits(_: int) -> str:
            handle = engine.exec(container_id, probe, user=spec.user, env=spec.env)
            return b"".join(chunk for _, chunk in handle.frames).decode().strip()

        with ThreadPoolExecutor(4) as pool:
            seen = Counter(pool.map(limits, range(60)))
    finally:
        engine.remove(container_id)
    assert seen == {"1024 4096": 60}


def test_plan_states_the_seccomp_profile_and_ulimits(project):
    project.worker("w", 'command: ["true"]')
    shown = cli("plan", "w", "--project", str(project.root))
    assert shown.returncode == 0, shown.stderr
    assert "ulimits     core 0/0, nofile 1024/4096" in shown.stdout
    assert "no-new-privileges, seccomp profile orchestrator-default" in shown.stdout
    spec = cli("plan", "w", "--project", str(project.root), "--json").json()
    assert (spec["seccomp"], spec["no_new_privileges"]) == ("orchestrator-default", True)
    assert {"name": "nofile", "soft": 1024, "hard": 4096} in spec["ulimits"]


ATTACK = """
import os, errno
def attempt(what, action):
    try:
        action()
        print("DID", what)
    except OSError as e:
        print("refused", what, errno.errorcode[e.errno])
def append(path):
    with open(path, "a") as f:
        f.write("\\nzones: {etc: {path: /etc, mode: rw}}\\n")
attempt("edit /repo/orchestrator.yaml", lambda: append("/repo/orchestrator.yaml"))
attempt("replace /repo/orchestrator.yaml",
        lambda: os.rename("/repo/new.txt", "/repo/orchestrator.yaml"))
attempt("remove /repo/orchestrator.yaml", lambda: os.unlink("/repo/orchestrator.yaml"))
attempt("edit /repo/workers/w.worker", lambda: append("/repo/workers/w.worker"))
attempt("add /repo/workers/evil.worker", lambda: append("/repo/workers/evil.worker"))
attempt("move /repo/workers", lambda: os.rename("/repo/workers", "/repo/old-workers"))
attempt("edit /workers/w.worker", lambda: append("/workers/w.worker"))
attempt("add /workers/evil.worker", lambda: append("/workers/evil.worker"))
attempt("edit /repo/keys/token", lambda: append("/repo/keys/token"))
attempt("add /repo/orchestrator.yml", lambda: append("/repo/orchestrator.yml"))
"""


#: How an edit of a policy file is refused. Run by its owner, the worker may write the file
#: and only the read-only mount stops it; run by root, the worker's uid is given read
#: access to policy files only (runtime.access), so the permission check refuses first.
EDIT_REFUSED = "EACCES" if os.getuid() == 0 else "EROFS"


def test_a_full_worker_cannot_rewrite_the_policy_files(engine, project):
    git_init(project.root)
    (project.root / "keys").mkdir()
    (project.root / "keys" / "token").write_text("TOKEN\n")
    (project.root / "new.txt").write_text("zones: {}\n")
    project.extra = "credentials: {push: {source: file, path: keys/token}}\n"
    project.write_project()
    write_script_worker(project, "w", ATTACK, "trust: full\nsandbox: {}")
    before = {
        path: path.read_bytes()
        for path in (
            project.root / "orchestrator.yaml",
            project.root / "workers" / "w.worker",
            project.root / "keys" / "token",
        )
    }
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "DID" not in out.replace("DID add /repo/orchestrator.yml", ""), out
    for what in (
        "edit /repo/orchestrator.yaml",
        "edit /repo/workers/w.worker",
        "add /repo/workers/evil.worker",
        "edit /workers/w.worker",
        "add /workers/evil.worker",
        "edit /repo/keys/token",
    ):
        refusal = EDIT_REFUSED if what.startswith("edit") else "EROFS"
        assert f"refused {what} {refusal}" in out, out
    assert "refused replace /repo/orchestrator.yaml EBUSY" in out  # a mount point
    assert "refused remove /repo/orchestrator.yaml EBUSY" in out
    assert "refused move /repo/workers EBUSY" in out
    for path, content in before.items():
        assert path.read_bytes() == content, path
    assert sorted(p.name for p in (project.root / "workers").iterdir()) == ["w.worker"]
    # Only orchestrator.yaml is ever read: the look-alike the worker added widens nothing.
    assert (project.root / "orchestrator.yml").exists()
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: etc}]}')
    plan = cli("plan", "w", "--project", str(project.root))
    assert plan.returncode == 125
    assert "zone 'etc' is not declared" in plan.stderr


EDIT_WORKER_FILES = """
import errno
for path in ("/repo/agents/linked.worker", "/repo/tasks/byPath.worker"):
    try:
        with open(path, "a") as handle:
            handle.write("# widened\\n")
        print("DID edit", path)
    except OSError as exc:
        print("refused edit", path, errno.errorcode[exc.errno])
"""


def test_a_full_worker_cannot_rewrite_worker_files_kept_elsewhere(engine, project):
    """A worker file linked into workers/ from elsewhere, and one run by its path, are
    policy too: read-only wherever a writable zone holds them."""
    git_init(project.root)
    for folder in ("agents", "tasks"):
        (project.root / folder).mkdir()
    script = json.dumps(["python3", "-c", textwrap.dedent(EDIT_WORKER_FILES)])
    front = f"---\ncommand: {script}\ntrust: full\nsandbox: {{}}\n---\n"
    linked = project.root / "agents" / "linked.worker"
    linked.write_text(front)
    (project.root / "workers" / "linked.worker").symlink_to("../agents/linked.worker")
    by_path = project.root / "tasks" / "byPath.worker"
    by_path.write_text(front)
    result = cli("run", str(by_path), "--project", str(project.root))
    assert result.returncode == 0, result.stderr
    assert f"refused edit /repo/agents/linked.worker {EDIT_REFUSED}" in result.stdout
    assert f"refused edit /repo/tasks/byPath.worker {EDIT_REFUSED}" in result.stdout
    assert linked.read_text() == front and by_path.read_text() == front
    # A file that is no worker of this project (not linked, not the one run) is the
    # repo's like any other: what matters is that the linked one stays guarded.
    result = cli("run", "linked", "--project", str(project.root))
    assert result.returncode == 0, result.stderr
    assert f"refused edit /repo/agents/linked.worker {EDIT_REFUSED}" in result.stdout
    assert linked.read_text() == front


@pytest.mark.parametrize("image", ["orchestrator/worker:latest", "orchestrator/proxy:latest"])
def test_images_hold_no_setuid_or_setgid_file(engine, image):
    if not engine.image_exists(image):
        pytest.skip(f"{image} is not built")
    client = engine.api
    container = client.create_container(
        image=image,
        entrypoint=["find", "/", "-xdev", "-perm", "/6000", "-type", "f"],
        user="0",
        network_disabled=True,
        host_config=client.create_host_config(network_mode="none"),
    )
    try:
        client.start(container)
        assert client.wait(container, timeout=60)["StatusCode"] == 0
        found = client.logs(container, stdout=True, stderr=True).decode().split()
    finally:
        client.remove_container(container, force=True)
    assert found == [], f"setuid/setgid files in {image}: {found}"
