"""A worker plants symbolic links on zone paths to redirect later runs: every attack tried.

Each test builds a project whose zones a hostile worker can reach, a *canary* host folder
outside every zone, and tries to make a later run, a session's host-side file API or
``staged apply`` read or write the canary. The orchestrator runs as root (as on CI
runners) and as a normal user of the ``docker`` group, under runc and gVisor. The canary's
content is asserted unread (it never reaches any output) and unwritten (its listing and
bytes are unchanged).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from importlib import metadata
from pathlib import Path

import pytest

from orchestrator.audit import AuditLog

pytestmark = pytest.mark.docker

USER = "orchestrator-links-test"
PROJECT_FILE = "orchestrator.yaml"


class Actor:
    """Who runs the orchestrator: root, or a normal user in the ``docker`` group."""

    def __init__(self, name: str, base: Path) -> None:
        self.name = name
        self.base = base

    @property
    def is_root(self) -> bool:
        return self.name == "root"

    def argv(self, *argv: str) -> list[str]:
        """``argv`` (a Python command line) as this actor. The user gets the system's own
        Python with its own readable copy of this checkout's code and the venv's packages
        (:func:`readable_install`): the checkout and its venv may live in a folder other
        users cannot enter (``/root``, a ``mktemp -d``)."""
        if self.is_root:
            return [sys.executable, *argv]
        return ["runuser", "-u", USER, "--", "env", "-i", "HOME=/nonexistent",
                f"PATH={os.environ['PATH']}", f"PYTHONPATH={_USER_INSTALL}",
                PYTHON_FOR_USER, *argv]  # fmt: skip

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv("-m", "orchestrator", *args),
            capture_output=True, text=True, timeout=timeout, check=False, cwd=self.base,
        )  # fmt: skip

    def python(self, script: str, timeout: float = 180) -> dict:
        """Run ``script`` (which prints one JSON line last) as this actor."""
        done = subprocess.run(
            self.argv("-c", textwrap.dedent(script)),
            capture_output=True, text=True, timeout=timeout, check=False, cwd=self.base,
            env=None if not self.is_root else {**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def own(self, path: Path) -> None:
        if not self.is_root:
            subprocess.run(["chown", "-R", f"{USER}:{USER}", str(path)], check=True)


REPO = Path(__file__).resolve().parents[2]
#: An interpreter of the venv's version that every user can run.
PYTHON_FOR_USER = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


#: The folder on ``PYTHONPATH`` of the throw-away user's commands (set by ``test_user``).
_USER_INSTALL = ""


def readable_install(into: Path) -> None:
    """Copy into ``into`` (readable by every user) this checkout's ``orchestrator`` and
    ``tests`` packages and the files of every distribution the project needs to run (its
    dependencies, found through their metadata; not the test tools)."""
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("orchestrator", "tests"):
        shutil.copytree(REPO / package, into / package, ignore=ignore)
    seen: set[str] = set()
    todo = list(metadata.requires("orchestrator") or ())
    while todo:
        requirement = todo.pop()
        if "extra ==" in requirement.partition(";")[2]:
            continue  # an optional extra's
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert name is not None, requirement
        try:
            dist = metadata.distribution(name.group())
        except metadata.PackageNotFoundError:
            continue  # for another Python or platform (a marker): not installed here
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        todo += dist.requires or []
        for file in dist.files or ():
            source = Path(str(file.locate()))
            if file.parts[0] == ".." or not source.is_file() or "__pycache__" in file.parts:
                continue  # scripts beside the venv's bin, compiled caches
            target = into / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for folder, _dirs, files in os.walk(into):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)


@pytest.fixture(scope="module")
def test_user():
    """A throw-away user in the docker group, with its own readable copy of the code it
    runs (both removed afterwards)."""
    global _USER_INSTALL
    created = subprocess.run(["id", USER], capture_output=True, check=False).returncode != 0
    if created:
        subprocess.run(
            ["useradd", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", "-G", "docker",
             USER], check=True, capture_output=True,
        )  # fmt: skip
    install = Path(tempfile.mkdtemp(prefix="orch-links-install-", dir="/tmp"))
    try:
        os.chmod(install, 0o755)
        readable_install(install)
        _USER_INSTALL = str(install)
        yield USER
    finally:
        _USER_INSTALL = ""
        shutil.rmtree(install, ignore_errors=True)
        if created:
            subprocess.run(["userdel", USER], check=False, capture_output=True)


@pytest.fixture(params=["root", "user"])
def actor(request, engine, test_user):
    # /tmp itself: pytest's own folders are root's, 0700, out of a normal user's reach.
    base = Path(tempfile.mkdtemp(prefix="orch-links-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield Actor(request.param, base)
    shutil.rmtree(base, ignore_errors=True)


class Canary:
    """A host folder outside every zone, with a secret file and a ``nested`` folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.secret = f"CANARY-{uuid.uuid4().hex}"
        (root / "nested").mkdir(parents=True)
        for folder in (root, root / "nested"):
            (folder / "secret.txt").write_text(self.secret)
            (folder / "real.txt").write_text(self.secret)
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, bytes]:
        return {
            str(p.relative_to(self.root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(self.root.rglob("*"))
        }

    def untouched(self, *outputs: str) -> None:
        assert self.snapshot() == self.before, "the canary folder was written"
        for output in outputs:
            assert self.secret not in output, "the canary was read"


def make_project(actor: Actor, isolation: str, zones: str, *, git: bool = False) -> Path:
    root = actor.base / "project"
    (root / "workers").mkdir(parents=True)
    levels = ", ".join(f"{t}: {isolation}" for t in ("untrusted", "session", "workspace", "full"))
    (root / PROJECT_FILE).write_text(f"zones:\n{zones}isolation: {{{levels}}}\n")
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        (root / ".gitignore").write_text(".sandbox/\n")
    return root


def worker(root: Path, name: str, script: str, front: str) -> None:
    command = json.dumps(["sh", "-c", textwrap.dedent(script).strip()])
    (root / "workers" / f"{name}.worker").write_text(f"---\ncommand: {command}\n{front}\n---\n")


def audit_events(root: Path, kind: str) -> list:
    return [e for e in AuditLog(root / ".sandbox" / "audit.jsonl").query() if e.operation == kind]


def gvisor_or_runc(request, engine) -> str:
    from tests.integration.conftest import require_gvisor

    if request.param == "gvisor":
        require_gvisor(engine)
    return request.param


@pytest.fixture(params=["runc", "gvisor"])
def runtime(request, engine) -> str:
    return gvisor_or_runc(request, engine)


# -- 1. a persistent link, no race -------------------------------------------------------------


def test_a_full_worker_cannot_redirect_a_zone_for_later_runs(actor, runtime):
    """``mv /repo/output /repo/.old && ln -s CANARY /repo/output`` by a ``full`` worker: the
    run reports the violation, and every later run refuses the project, naming the link."""
    canary = Canary(actor.base / "canary")
    root = make_project(
        actor, runtime, "  output: {path: output, mode: rw, untrusted_output: true}\n", git=True
    )
    (root / "output").mkdir()
    (root / "output" / "mine.txt").write_text("the zone's own file")
    worker(root, "planter", f"mv /repo/output /repo/.old && ln -s {canary.root} /repo/output",
           "trust: full\nsandbox: {}")  # fmt: skip
    worker(root, "victim", "cat /output/*; echo pwned > /output/pwned.txt",
           "trust: untrusted\nsandbox: {zones: [{name: output, mode: rw}]}")  # fmt: skip
    actor.own(actor.base)

    planted = actor.cli("run", "planter", "--project", str(root))
    assert planted.returncode == 0, planted.stderr
    assert os.path.islink(root / "output")  # the attack itself worked on the host
    assert f"VIOLATION: zone 'output': {root / 'output'} is now a symbolic link" in planted.stderr
    (violation,) = audit_events(root, "zone.violation")
    assert violation.allowed is False and str(root / "output") in violation.reason

    victim = actor.cli("run", "victim", "--project", str(root))
    assert victim.returncode == 125, victim.stderr
    assert f"zones.output.path: 'output' leads through a symbolic link: {root / 'output'} -> " \
        f"{canary.root}" in victim.stderr  # fmt: skip
    doctor = actor.cli("doctor", "--no-egress", "--no-tools", "--project", str(root))
    assert doctor.returncode != 0
    assert f"{root / 'output'} -> {canary.root}" in doctor.stdout + doctor.stderr
    canary.untouched(victim.stdout, victim.stderr, planted.stdout)
    assert not [e for e in audit_events(root, "run.started") if e.worker == "victim"]


def test_an_untrusted_worker_cannot_redirect_a_nested_zone(actor, runtime):
    """``data`` rw holds ``nested``: an untrusted worker swaps ``data/sub`` for a link."""
    canary = Canary(actor.base / "canary")
    zones = (
        "  data: {path: data, mode: rw, untrusted_output: true}\n"
        "  nested: {path: data/sub/nested, mode: rw, untrusted_output: true}\n"
    )
    root = make_project(actor, runtime, zones)
    (root / "data" / "sub" / "nested").mkdir(parents=True)
    (root / "data" / "sub" / "nested" / "real.txt").write_text("real")
    worker(root, "planter", f"mv /data/sub /data/sub.old && ln -s {canary.root} /data/sub",
           "trust: untrusted\nsandbox: {zones: [{name: data, mode: rw}]}")  # fmt: skip
    worker(root, "victim", "cat /nested/*; echo pwned > /nested/pwned.txt",
           "trust: untrusted\nsandbox: {zones: [{name: nested, mode: rw}]}")  # fmt: skip
    actor.own(actor.base)

    planted = actor.cli("run", "planter", "--project", str(root))
    assert planted.returncode == 0, planted.stderr
    assert f"VIOLATION: zone 'nested': {root / 'data' / 'sub'} is now a symbolic link" in (
        planted.stderr
    )
    victim = actor.cli("run", "victim", "--project", str(root), "--json")
    assert victim.returncode == 125
    assert json.loads(victim.stdout)["error"]["kind"] == "ConfigError"
    assert f"{root / 'data' / 'sub'} -> {canary.root}" in victim.stderr
    canary.untouched(victim.stdout, victim.stderr)


def test_staged_apply_refuses_a_zone_redirected_after_the_run(actor, runtime):
    """An ``ask`` change set for ``nested``; then ``data/sub`` becomes a link: apply refuses."""
    canary = Canary(actor.base / "canary")
    zones = (
        "  data: {path: data, mode: rw, untrusted_output: true}\n"
        "  nested: {path: data/sub/nested, mode: rw}\n"
    )
    root = make_project(actor, runtime, zones)
    (root / "data" / "sub" / "nested").mkdir(parents=True)
    worker(root, "editor", "echo edited > /nested/real.txt",
           "trust: session\nsandbox: {zones: [{name: nested, mode: rw, approval: {write: ask}}]}"
           )  # fmt: skip
    worker(root, "planter", f"mv /data/sub /data/sub.old && ln -s {canary.root} /data/sub",
           "trust: untrusted\nsandbox: {zones: [{name: data, mode: rw}]}")  # fmt: skip
    actor.own(actor.base)

    edited = actor.cli("run", "editor", "--project", str(root), "--json")
    assert edited.returncode == 0, edited.stderr
    (asked,) = json.loads(edited.stdout)["asked"]
    assert actor.cli("run", "planter", "--project", str(root)).returncode == 0
    applied = actor.cli("staged", "apply", asked["change_id"], "--yes", "--project", str(root))
    assert applied.returncode == 125, applied.stderr
    assert f"{root / 'data' / 'sub'} -> {canary.root}" in applied.stderr
    canary.untouched(applied.stdout, applied.stderr)
    assert (canary.root / "nested" / "real.txt").read_text() == canary.secret


# -- 2. racing the host-side file API ----------------------------------------------------------

#: Inside the session, the attack of the issue: with the real ``/data/sub`` moved aside,
#: make it a link to the canary and nothing, in turn, as fast as the shell can; then put
#: the real folder back.
TOGGLE_LINK = """
mv /data/sub /data/sub.real
end=$(( $(date +%s) + {seconds} ))
while [ $(date +%s) -lt $end ]; do
  for i in 1 2 3 4 5 6 7 8 9 10; do ln -s {canary} /data/sub; rm /data/sub; done
done
mv /data/sub.real /data/sub
echo toggled
"""

#: The same, with the real folder in the cycle too (so some runs get it).
TOGGLE = """
end=$(( $(date +%s) + {seconds} ))
while [ $(date +%s) -lt $end ]; do
  for i in 1 2 3 4 5 6 7 8 9 10; do
    mv /data/sub /data/sub.real; ln -s {canary} /data/sub; rm /data/sub; mv /data/sub.real /data/sub
  done
done
echo toggled
"""

#: The host side: the session API reads, lists and writes /nested in a loop meanwhile.
SESSION_RACE = """
import json, threading, time
from orchestrator import Orchestrator, OrchestratorError
orch = Orchestrator({root!r})
seen, refused, wrote = [], 0, 0
with orch.open_session("racer") as session:
    toggler = threading.Thread(target=lambda: seen.append(session.exec(
        ["sh", "-c", {toggle!r}], timeout=60).stdout))
    toggler.start()
    time.sleep(0.5)
    i = 0
    while toggler.is_alive():
        i += 1
        for op in (lambda: seen.append(session.read("/nested/real.txt").text),
                   lambda: seen.append(" ".join(e.name for e in session.list("/nested").entries)),
                   lambda: session.write(f"/nested/w{{i}}.txt", "from the host")):
            try:
                op()
            except OrchestratorError as exc:
                refused += 1
                seen.append(str(exc))
    toggler.join()
    seen.append(session.read("/nested/real.txt").text)  # the real folder, once back
print(json.dumps({{"seen": seen, "refused": refused, "rounds": i}}))
"""


def race_project(actor: Actor, runtime: str, canary: Canary) -> Path:
    zones = (
        "  data: {path: data, mode: rw, untrusted_output: true}\n"
        "  nested: {path: data/sub/nested, mode: rw, untrusted_output: true}\n"
    )
    root = make_project(actor, runtime, zones)
    (root / "data" / "sub" / "nested").mkdir(parents=True)
    (root / "data" / "sub" / "nested" / "real.txt").write_text("the real file")
    worker(root, "racer", "sleep infinity",
           "trust: untrusted\nsandbox: {zones: [{name: data, mode: rw}, {name: nested, mode: rw}]}"
           )  # fmt: skip
    actor.own(actor.base)
    return root


def test_swapping_a_folder_under_the_session_file_api_reaches_nothing(actor, runtime):
    canary = Canary(actor.base / "canary")
    root = race_project(actor, runtime, canary)
    toggle = TOGGLE_LINK.format(seconds=4, canary=canary.root)
    outcome = actor.python(SESSION_RACE.format(root=str(root), toggle=toggle))
    assert "toggled" in outcome["seen"][0] or any("toggled" in s for s in outcome["seen"])
    canary.untouched(*outcome["seen"])
    assert outcome["refused"] > 0, "the race was never met: the test proves nothing"
    assert any("is a symbolic link" in seen for seen in outcome["seen"]), "never met the link"
    assert outcome["seen"][-1] == "the real file"  # the real folder, read once it is back
    denied = [e for e in audit_events(root, "sandbox.read") if e.allowed is False]
    assert denied, "refusals are audited as denials"
    assert not (root / "data" / "sub").is_symlink()  # the toggler put it back


# -- 3. racing the engine's own lookup of a mount source (root: pinned sources) ---------------

MOUNT_RACE = """
import json, threading, time
from orchestrator import Orchestrator, OrchestratorError
orch = Orchestrator({root!r})
outputs, outcomes = [], []
with orch.open_session("racer") as session:
    toggler = threading.Thread(target=lambda: outputs.append(session.exec(
        ["sh", "-c", {toggle!r}], timeout=60).stdout))
    toggler.start()
    time.sleep(0.5)
    while toggler.is_alive():
        try:
            result = orch.run("victim")
            outputs += [result.stdout, result.stderr, result.error or ""]
            outcomes.append(result.status)
        except OrchestratorError as exc:
            outputs.append(str(exc))
            outcomes.append(type(exc).__name__)
    toggler.join()
print(json.dumps({{"outputs": outputs, "outcomes": outcomes}}))
"""


def test_swapping_a_folder_while_runs_start_never_mounts_the_canary(engine, runtime, test_user):
    """As root every mount source is pinned: whatever the path says when the engine looks,
    the container gets the folder that was checked (or the run is refused)."""
    actor = Actor("root", Path(tempfile.mkdtemp(prefix="orch-links-", dir="/tmp")))
    try:
        canary = Canary(actor.base / "canary")
        root = race_project(actor, runtime, canary)
        worker(root, "victim", "cat /nested/*; ls /nested; echo pwned > /nested/pwned.txt",
               "trust: untrusted\nsandbox: {zones: [{name: nested, mode: rw}]}")  # fmt: skip
        toggle = TOGGLE.format(seconds=8, canary=canary.root)
        outcome = actor.python(MOUNT_RACE.format(root=str(root), toggle=toggle), timeout=300)
        canary.untouched(*outcome["outputs"])
        assert "exited" in outcome["outcomes"], outcome  # runs did start meanwhile
        started = [e for e in audit_events(root, "run.started") if e.worker == "victim"]
        assert started and all(e.metadata["pinned_mounts"] for e in started)  # as root
        assert not (canary.root / "nested" / "pwned.txt").exists()
    finally:
        shutil.rmtree(actor.base, ignore_errors=True)


# -- 4. the same race, by an agent through MCP (read, write, exec only) -------------------------


def test_an_mcp_agent_swapping_a_folder_under_its_own_reads_reaches_nothing(engine, runtime):
    from types import SimpleNamespace

    import anyio

    from tests.integration.test_mcp import serve

    actor = Actor("root", Path(tempfile.mkdtemp(prefix="orch-links-", dir="/tmp")))
    try:
        canary = Canary(actor.base / "canary")
        root = race_project(actor, runtime, canary)
        (root / "workers" / "racer.worker").rename(root / "workers" / "w.worker")
        toggle = TOGGLE_LINK.format(seconds=4, canary=canary.root)
        background = f"nohup sh -c '{toggle}' >/dev/null 2>&1 &"

        async def script(client):
            seen, refused = [], 0
            started = await client.call_tool("exec", {"command": background})
            assert not started.is_error
            end = time.monotonic() + 5
            i = 0
            while time.monotonic() < end:
                i += 1
                for name, args in (
                    ("read", {"path": "/nested/real.txt"}),
                    ("list", {"path": "/nested"}),
                    ("write", {"path": f"/nested/m{i}.txt", "content": "from the agent"}),
                ):
                    answer = await client.call_tool(name, args)
                    refused += answer.is_error
                    seen.append(json.dumps(answer.structured_content) + answer.content[0].text)
                await anyio.sleep(0)
            return seen, refused

        seen, refused = serve(SimpleNamespace(root=root), script)
        canary.untouched(*seen)
        assert refused > 0, "the race was never met: the test proves nothing"
        denied = [e for e in audit_events(root, "sandbox.write") if e.allowed is False]
        assert denied
    finally:
        shutil.rmtree(actor.base, ignore_errors=True)
