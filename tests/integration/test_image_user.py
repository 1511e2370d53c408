"""``image_user: true``: a task image run as it was written (its own user, root here, and a
writable root filesystem), only under gVisor. Through the real command line:

- root inside gVisor edits the image's ``/app`` files in place, writes under ``/etc`` and
  adds a user; the writable root is the run's own (the next run sees the image again);
- root gets no more of a zone than its mode (a read-only zone stays read-only), no raw
  sockets, and no more capabilities than the plan lists;
- what it leaves in a writable zone (files, folders, a link, a file it chowned to another
  uid, a setuid file) is owned by the project's owner on the host, never root, and has no
  set-id bit;
- under runc the worker is refused in one line naming gVisor (exit 125), and nothing is
  created;
- the set-id window docs/security.md lists under Limits, as measured: runsc does not put a
  worker started by exec under the container's seccomp filter, so while the run lasts its
  setuid file is setuid-root on the host; it is stripped when the run ends.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import threading
import time
import uuid

import pytest

from orchestrator import labels
from orchestrator.plan import IMAGE_USER_CAPABILITIES
from tests.integration.conftest import cli, require_gvisor

pytestmark = pytest.mark.docker

DOCKERFILE = """\
FROM orchestrator/worker:latest
USER root
COPY app /app
WORKDIR /app
"""

#: What the task asks of root: everything a task image's agent typically does.
SCRIPT = r"""
set -u
echo "uid $(id -u)"
sed -i 's/broken/fixed/' /app/main.py && cat /app/main.py
echo configured > /etc/task.conf && echo "etc $(cat /etc/task.conf)"
useradd -m bob && echo "bob $(id -u bob)"
echo hacked > /src/a.txt 2>/dev/null && echo "DID write ro zone" || echo "refused ro zone"
python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>/dev/null \
  && echo "DID raw socket" || echo "refused raw socket"
grep CapEff /proc/self/status
mkdir -p /out/made/deep && echo made > /out/made/deep/f.txt
echo set > /out/setuid && chmod 4755 /out/setuid
echo other > /out/other && chown 4242:4242 /out/other
ln -s /etc/shadow /out/link
echo previous >> /out/old.txt
"""

AGAIN = r"""
test -e /etc/task.conf && echo "etc left" || echo "etc fresh"
id bob >/dev/null 2>&1 && echo "bob left" || echo "bob fresh"
cat /app/main.py
"""


@pytest.fixture(scope="module")
def task_image(engine):
    """An image whose USER is root and whose files are in /app (no RUN: nothing runs)."""
    tag = f"orchestrator-test/root-task:{uuid.uuid4().hex[:8]}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in (("Dockerfile", DOCKERFILE), ("app/main.py", "print('broken')\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    for _ in engine.api.build(
        fileobj=buffer, custom_context=True, tag=tag, rm=True, forcerm=True, decode=True
    ):
        pass
    try:
        yield tag
    finally:
        engine.api.remove_image(tag, force=True)


def _worker(project, image: str, script: str, name: str = "task") -> None:
    project.worker(
        name,
        f"""
        image: {image}
        image_user: true
        command: {json.dumps(["sh", "-c", script])}
        sandbox:
          zones:
            - {{name: out, mode: rw}}
            - {{name: src, mode: ro}}
        """,
    )


#: The project folder's owner (a user of the host's, not root): the worker's uid:gid.
OWNER = (4321, 4321)


def _zones(project):
    os.chown(project.root, *OWNER)  # a root orchestrator runs the worker as this owner
    out = project.zone("out", "rw", files={"old.txt": "old\n"}, extra="untrusted_output: true")
    src = project.zone("src", "ro", files={"a.txt": "original\n"})
    return out, src


def test_root_changes_the_image_in_place_and_leaves_only_owner_files(engine, project, task_image):
    require_gvisor(engine)
    out, src = _zones(project)
    owner = project.identity
    assert owner == OWNER
    old_info = (out / "old.txt").stat()
    _worker(project, task_image, SCRIPT)
    plan = cli("plan", "task", "--project", str(project.root), "--json").json()
    assert (plan["isolation"], plan["image_user"], plan["read_only_rootfs"]) == (
        "gvisor",
        True,
        False,
    )
    assert plan["capabilities"] == list(IMAGE_USER_CAPABILITIES)

    done = cli("run", "task", "--project", str(project.root), "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    printed = done.json()["stdout"]
    assert "uid 0\n" in printed
    assert "print('fixed')" in printed
    assert "etc configured" in printed
    assert "bob " in printed
    assert "refused ro zone" in printed and "DID" not in printed, printed
    assert (src / "a.txt").read_text() == "original\n"
    cap_eff = int(printed.split("CapEff:")[1].split()[0], 16)
    assert cap_eff & ~0 != 0
    assert not cap_eff & (1 << 13)  # CAP_NET_RAW
    assert not cap_eff & (1 << 27)  # CAP_MKNOD
    assert not cap_eff & (1 << 21)  # CAP_SYS_ADMIN

    # On the host: what the run left is the project owner's, never root's, and not setuid.
    for rel in ("made", "made/deep", "made/deep/f.txt", "setuid", "other", "link"):
        info = (out / rel).lstat()
        assert (info.st_uid, info.st_gid) == owner, (rel, info.st_uid, info.st_gid)
    assert not (out / "setuid").lstat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert os.readlink(out / "link") == "/etc/shadow"
    assert (out / "old.txt").read_text() == "old\nprevious\n"
    assert ((out / "old.txt").stat().st_uid, (out / "old.txt").stat().st_gid) == (
        old_info.st_uid,
        old_info.st_gid,
    )

    # The writable root was the run's own: the next run sees the image as it was built.
    _worker(project, task_image, AGAIN, name="again")
    again = cli("run", "again", "--project", str(project.root), "--json", timeout=240)
    assert again.returncode == 0, again.stderr
    shown = again.json()["stdout"]
    assert "etc fresh" in shown and "bob fresh" in shown and "print('broken')" in shown


def test_under_runc_image_user_is_refused_in_one_line(engine, project, task_image):
    project.isolation = "runc"
    _zones(project)
    _worker(project, task_image, "id")
    before = {o.name for o in engine.list_managed()}
    for command in ("plan", "run"):
        done = cli(command, "task", "--project", str(project.root))
        assert done.returncode == 125, (command, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "image_user" in lines[0] and "gVisor" in lines[0], lines[0]
        assert "Traceback" not in done.stderr
    made = [
        o
        for o in engine.list_managed()
        if o.name not in before and o.labels.get(labels.WORKER) == "task"
    ]
    assert made == []


#: The worker of a run with an outbox is started by exec (every image_user run has one).
WINDOW = r"""
grep Seccomp: /proc/self/status
echo set > /out/window && chmod 4755 /out/window && echo "chmod allowed" || echo "chmod refused"
touch /out/window.done
sleep 8
"""


def test_an_execd_workers_setuid_file_is_setuid_root_on_the_host_only_while_the_run_lasts(
    engine, project, task_image
):
    """Pins the residual risk docs/security.md states (Limits: ``image_user`` while the run
    lasts): if runsc starts applying the filter to execs, this fails and the docs change."""
    require_gvisor(engine)
    out, _ = _zones(project)
    _worker(project, task_image, WINDOW, name="window")
    plan = cli("plan", "window", "--project", str(project.root), "--json").json()
    assert plan["outbox"] and plan["supervisor_user"]  # the worker is started by exec
    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                if (out / "window.done").exists():
                    info = (out / "window").lstat()
                    seen.append((info.st_uid, info.st_mode & (stat.S_ISUID | stat.S_ISGID)))
            except FileNotFoundError:
                pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        done = cli("run", "window", "--project", str(project.root), "--json", timeout=240)
    finally:
        stop.set()
        watcher.join()
    assert done.returncode == 0, done.stderr
    printed = done.json()["stdout"]
    assert "Seccomp:\t0" in printed, printed  # no filter in an exec'd process
    assert "chmod allowed" in printed, printed
    assert (0, stat.S_ISUID) in seen, seen  # setuid-root on the host during the run
    info = (out / "window").lstat()
    assert (info.st_uid, info.st_gid) == OWNER
    assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID)
