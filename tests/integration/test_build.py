"""``orchestrator build`` on the real engine, every RUN under gVisor's build runtime.

A multi-stage Dockerfile builds and runs; a second build is all cache; a changed context
file runs again only the steps from its COPY on. Attacks from a Dockerfile and its context
are refused or contained, and leave no step container behind. See docs/build.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.build.builder import TMP_MARKER
from orchestrator.docker import buildnames
from orchestrator.docker.images import WORKER_IMAGE
from tests.integration.conftest import cli, require_gvisor, wait_until
from tests.integration.pkgservice import FILE_DIGEST, FILE_TEXT, package_service
from tests.integration.pkgservice import PORT as PKG_PORT
from tests.integration.pkgservice import project_text as pkg_project

pytestmark = pytest.mark.docker


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=False, timeout=timeout
    )


def step_containers(*, live: bool = False) -> list[str]:
    """Build step containers whose owner is gone (a leak); with ``live``, also those of
    live owners (a build in progress: other engineers' builds run on this engine too)."""
    found = docker("ps", "-a", "--filter", f"name={buildnames.NAME_PREFIX}", "--format",
                   "{{.Names}}").stdout.split()  # fmt: skip
    wanted = {"gone", "alive"} if live else {"gone"}
    return [
        name
        for name in found
        if (owner := buildnames.owner_labels(name)) is not None
        and labels.owner_state(owner) in wanted
    ]


@pytest.fixture
def builds(engine, project, tmp_path):
    """A context folder, a unique label for this test's images, and clean-up of every image
    this test made (the tagged ones and the cache entries under them)."""
    require_gvisor(engine)
    marker = uuid.uuid4().hex[:12]
    context = tmp_path / "ctx"
    context.mkdir()
    tags: list[str] = []

    def build(dockerfile: str, *args: str, tag: str | None = None, timeout: float = 600):
        (context / "Dockerfile").write_text(
            dockerfile.replace("@BASE@", WORKER_IMAGE).replace("@MARK@", marker)
        )
        if tag:
            tags.append(tag)
        extra = ["-t", tag] if tag else []
        return cli("build", str(context), "--project", str(project.root), *extra, *args,
                   timeout=timeout)  # fmt: skip

    build.context = context  # type: ignore[attr-defined]
    build.marker = marker  # type: ignore[attr-defined]
    yield build
    for tag in tags:
        docker("rmi", "-f", tag)
    made = docker("images", "-aq", "--filter", f"label=test.mark={marker}").stdout.split()
    for image in reversed(made):
        docker("rmi", "-f", image)
    assert not step_containers(), "a build left a step container behind"


MULTI_STAGE = """\
FROM @BASE@ AS base
USER root
LABEL test.mark=@MARK@
RUN useradd -m alice && mkdir -p /app && echo made > /app/made.txt
COPY data.txt /app/
COPY folder /app/folder
WORKDIR /app
ENV GREETING="hello there"
RUN python3 -c "import os; open('py.txt', 'w').write(os.environ['GREETING'])"
FROM base AS final
COPY --from=base /app/py.txt /final/
USER alice
CMD ["cat", "/final/py.txt"]
"""


def outcomes(done) -> dict[int, str]:
    assert done.returncode == 0, done.stderr
    return {step["line"]: step["outcome"] for step in json.loads(done.stdout)["steps"]}


def test_a_multi_stage_build_runs_caches_and_rebuilds_only_after_a_changed_copy(builds, project):
    context: Path = builds.context
    (context / "data.txt").write_text("data\n")
    (context / "folder").mkdir()
    (context / "folder" / "inner.txt").write_text("inner v1\n")
    tag = f"orchestrator-test/build-{builds.marker}:1"

    first = builds(MULTI_STAGE, "--json", tag=tag)
    assert outcomes(first) == {2: "config", 3: "config", 4: "built", 5: "built", 6: "built",
                               7: "config", 8: "config", 9: "built", 11: "built", 12: "config",
                               13: "config"}  # fmt: skip
    ran = docker("run", "--rm", tag)
    assert (ran.returncode, ran.stdout) == (0, "hello there")
    shown = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                   "id -un; pwd; cat made.txt data.txt folder/inner.txt")  # fmt: skip
    assert shown.stdout.split("\n")[:5] == ["alice", "/app", "made", "data", "inner v1"]
    image = json.loads(first.stdout)["image"]
    inspected = json.loads(docker("image", "inspect", tag).stdout)[0]["Config"]["Labels"]
    assert inspected["io.orchestrator.build.runtime"] == "orchestrator-runsc-build"
    assert inspected["io.orchestrator.build.dockerfile-digest"].startswith("sha256:")

    began = time.monotonic()
    second = builds(MULTI_STAGE, "--json", tag=tag)
    assert set(outcomes(second).values()) <= {"cached", "config"}
    assert json.loads(second.stdout)["image"] == image
    assert json.loads(second.stdout)["duration_s"] < 1.5, second.stdout
    assert time.monotonic() - began < 60

    (context / "folder" / "inner.txt").write_text("inner v2\n")
    third = outcomes(builds(MULTI_STAGE, "--json", tag=tag))
    assert (third[4], third[5]) == ("cached", "cached")
    assert (third[6], third[9], third[11]) == ("built", "built", "built")
    shown = docker("run", "--rm", "--entrypoint", "cat", tag, "/app/folder/inner.txt")
    assert shown.stdout == "inner v2\n"

    log = (project.root / ".sandbox" / "audit.jsonl").read_text().splitlines()
    audit = [json.loads(line) for line in log]
    builds_seen = [e for e in audit if e["operation"].startswith("build.")]
    ended = [e for e in builds_seen if e["operation"] == "build.ended"]
    assert [e["metadata"]["image"] for e in ended][:2] == [image, image]
    steps = [e for e in builds_seen if e["operation"] == "build.step"]
    assert {s["metadata"]["outcome"] for s in steps} == {"built", "cached", "config"}


ATTACKS = r"""
import ctypes, errno, json, os, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
found = {}
def refused(name, attempt):
    try:
        found[name] = "refused" if attempt() else "ALLOWED"
    except OSError as exc:
        found[name] = f"refused: {exc}"
def network():
    socket.create_connection(("1.1.1.1", 80), timeout=3)
    return False
def command(*argv):
    return lambda: subprocess.run(argv, capture_output=True).returncode != 0
def syscall(number, *args):
    return lambda: libc.syscall(number, *args) == -1
def sysrq():
    with open("/proc/sysrq-trigger", "w") as handle:
        handle.write("h")
    return False
refused("network", network)
refused("mount", command("mount", "-t", "tmpfs", "none", "/mnt"))
refused("unshare", command("unshare", "--mount", "--net", "true"))
refused("io_uring", syscall(425, 8, ctypes.create_string_buffer(120)))
refused("sysrq", sysrq)
refused("module", syscall(313, -1, b"", 0))
with open("/attacks.json", "w") as out:
    json.dump(found, out)
"""


def test_attacks_from_a_run_step_are_refused_inside_the_sandbox(builds):
    (builds.context / "attacks.py").write_text(ATTACKS)
    tag = f"orchestrator-test/build-{builds.marker}:attacks"
    done = builds("FROM @BASE@\nUSER root\nLABEL test.mark=@MARK@\nCOPY attacks.py /\n"
                  "RUN python3 /attacks.py\n", tag=tag)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(docker("run", "--rm", "--entrypoint", "cat", tag, "/attacks.json").stdout)
    assert set(report) == {"network", "mount", "unshare", "io_uring", "sysrq", "module"}
    assert all(value.startswith("refused") for value in report.values()), report


def test_links_and_special_files_in_the_context_never_bring_in_a_host_file(builds, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text(f"host secret {builds.marker}\n")
    context: Path = builds.context
    (context / "link").symlink_to(secret)
    tag = f"orchestrator-test/build-{builds.marker}:links"
    copied = builds("FROM @BASE@\nLABEL test.mark=@MARK@\nCOPY link /copied\n", tag=tag)
    assert copied.returncode == 0, copied.stderr
    inside = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                    "readlink /copied; cat /copied 2>/dev/null || echo unreadable")  # fmt: skip
    assert inside.stdout.split() == [str(secret), "unreadable"]
    assert builds.marker not in inside.stdout.replace(f"build-{builds.marker}", "")

    os.link(secret, context / "hard")
    refused = builds("FROM @BASE@\nLABEL test.mark=@MARK@\nCOPY . /ctx/\n")
    assert refused.returncode == 125
    assert (
        f"{context / 'hard'} is a hard link to a file outside the build context" in refused.stderr
    )
    assert "Dockerfile:3: COPY" in refused.stderr
    (context / "hard").unlink()

    os.mkfifo(context / "fifo")
    refused = builds("FROM @BASE@\nLABEL test.mark=@MARK@\nCOPY fifo /x\n")
    assert refused.returncode == 125
    assert f"{context / 'fifo'} is a FIFO (named pipe): never copied" in refused.stderr


@pytest.mark.parametrize(
    ("dockerfile", "said"),
    [
        ("RUN --security=insecure true", "Dockerfile:2: RUN: --security=insecure would run"),
        (
            "RUN --mount=type=secret,id=x cat /run/secrets/x",
            "Dockerfile:2: RUN: --mount=type=secret,id=x: the project does not declare 'x' for "
            "builds; add it to build.secrets in",
        ),
        ("RUN --mount=type=ssh true", "Dockerfile:2: RUN: --mount=type=ssh: a build never"),
        ("RUN --privileged true", "Dockerfile:2: RUN: --privileged runs with every privilege"),
    ],
)
def test_what_cannot_be_made_safe_is_refused_in_one_line(builds, dockerfile, said):
    done = builds(f"FROM @BASE@\n{dockerfile}\n")
    assert done.returncode == 125
    assert said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


SECRET_STEPS = """\
FROM @BASE@
USER root
LABEL test.mark=@MARK@
RUN --mount=type=secret,id=token stat -c 'mode %a uid %u' /run/secrets/token && \\
    sha256sum /run/secrets/token | cut -c1-64 > /digest && echo "said: $(cat /run/secrets/token)"
RUN --mount=type=secret,id=token,target=/etc/tok,uid=1000,gid=1000 stat -c 'at %n %u' /etc/tok
RUN wc -c < /run/secrets/token > /later; wc -c < /etc/tok >> /later
"""


def test_a_declared_build_secret_is_read_in_its_step_and_kept_out_of_image_output_and_log(
    builds, project, monkeypatch
):
    value = f"build-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("TEST_BUILD_TOKEN", value)
    project.extra = (
        "credentials:\n  token: {source: env, env: TEST_BUILD_TOKEN}\nbuild:\n  secrets: [token]\n"
    )
    project.write_project()
    tag = f"orchestrator-test/build-{builds.marker}:secret"
    done = builds(SECRET_STEPS, "--json", tag=tag)
    assert done.returncode == 0, done.stderr
    # Readable in its step (0400, root's), the step's output redacted, as the second target.
    assert "mode 400 uid 0" in done.stderr and "at /etc/tok 1000" in done.stderr
    assert "said: [REDACTED]" in done.stderr
    assert value not in done.stderr + done.stdout
    shown = docker("run", "--rm", "--entrypoint", "sh", tag, "-c", "cat /digest /later")
    digest, *later = shown.stdout.split()
    assert digest == hashlib.sha256(value.encode()).hexdigest()
    assert later == ["0", "0"]  # only the mounts' empty mount points stay in the layers
    # Nowhere in the image: its layers, its configuration, its history.
    saved = subprocess.run(["docker", "save", tag], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(saved)) as outer:
        for member in outer.getmembers():
            data = outer.extractfile(member)
            content = data.read() if data else b""
            assert value.encode() not in content, member.name
            if member.name.endswith("layer.tar"):
                with tarfile.open(fileobj=io.BytesIO(content)) as layer:
                    for inner in layer.getmembers():
                        if inner.isreg() and inner.size:
                            assert value.encode() not in layer.extractfile(inner).read()  # type: ignore[union-attr]
    described = docker("history", "--no-trunc", tag).stdout + docker("inspect", tag).stdout
    assert value not in described
    # The audit log names the secret (each use), never its value.
    log = (project.root / ".sandbox" / "audit.jsonl").read_text()
    assert value not in log
    used = [json.loads(x) for x in log.splitlines() if '"credential.used"' in x]
    assert [(u["metadata"]["credential"], u["metadata"]["use"]) for u in used] == [
        ("token", "build secret"),
        ("token", "build secret"),
    ]
    assert not list(Path("/dev/shm").glob("orchestrator-secrets-*-build-*"))
    # A second build is a cache hit: nothing is read or mounted again.
    again = builds(SECRET_STEPS, "--json", tag=tag)
    assert set(outcomes(again).values()) <= {"cached", "config"}


def test_an_image_not_on_this_machine_is_never_pulled(builds):
    done = builds("FROM orchestrator-test/absent-image:never\nRUN true\n")
    assert done.returncode == 125
    assert "Dockerfile:1: FROM: image 'orchestrator-test/absent-image:never' is not on this " \
        "machine and nothing is pulled" in done.stderr  # fmt: skip


def test_a_failing_run_gives_its_exit_code_in_one_line(builds):
    done = builds("FROM @BASE@\nLABEL test.mark=@MARK@\nRUN echo about to fail; exit 3\n")
    assert done.returncode == 3
    assert "Dockerfile:3: RUN: exited 3: about to fail" in done.stderr


def test_a_never_ending_run_stops_at_the_build_time_limit(builds):
    began = time.monotonic()
    done = builds("FROM @BASE@\nLABEL test.mark=@MARK@\nRUN sleep 100000\n", "--timeout", "20")
    assert done.returncode == 125
    assert "still running at the build's time limit (20 s): stopped" in done.stderr
    assert time.monotonic() - began < 90


def test_a_fork_bomb_is_contained_by_the_process_limit(builds):
    bomb = "import os\\nwhile True:\\n    os.fork()"
    began = time.monotonic()
    done = builds(f'FROM @BASE@\nLABEL test.mark=@MARK@\nRUN python3 -c "$(printf \'{bomb}\')"\n',
                  "--timeout", "120")  # fmt: skip
    assert done.returncode != 0
    assert time.monotonic() - began < 180


def test_a_step_writing_past_the_disk_limit_is_stopped(builds):
    done = builds(
        "FROM @BASE@\nUSER root\nLABEL test.mark=@MARK@\n"
        "RUN dd if=/dev/zero of=/big bs=1M count=200\n",
        "--disk", "32m", "--no-cache",
    )  # fmt: skip
    assert done.returncode != 0
    assert "Dockerfile:4: RUN" in done.stderr
    assert not docker("images", "-aq", "--filter", f"label=test.mark={builds.marker}").stdout


def test_fifty_mebibytes_of_output_are_clipped(builds):
    done = builds(
        "FROM @BASE@\nLABEL test.mark=@MARK@\n"
        "RUN head -c 52428800 /dev/zero | tr '\\0' x; echo; echo finished\n"
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert "(output clipped at 2048 KiB)" in done.stderr
    assert len(done.stderr) < 3 << 20


def test_a_sigkilled_build_leaves_only_what_gc_removes(builds, project):
    (builds.context / "Dockerfile").write_text(
        f"FROM {WORKER_IMAGE}\nLABEL test.mark={builds.marker}\nRUN sleep 100000\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "build", str(builds.context),
         "--project", str(project.root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    mine = f"{buildnames.NAME_PREFIX}{process.pid}-"
    try:
        assert wait_until(lambda: any(n.startswith(mine) for n in step_containers(live=True)), 180)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    done = cli("gc", "--project", str(project.root))
    assert done.returncode == 0, done.stderr
    assert not [n for n in step_containers(live=True) if n.startswith(mine)]


def test_a_build_allowlist_lets_run_steps_reach_only_its_hosts_through_the_audited_proxy(
    builds, project, engine
):
    service_net = f"buildtest-{builds.marker}"
    server = f"pkgsrv-{builds.marker}"
    docker("network", "create", service_net)
    try:
        started = docker("run", "-d", "--name", server, "--network", service_net, "--user",
                         "65534", "--workdir", "/tmp", "--entrypoint", "sh", WORKER_IMAGE, "-c",
                         "echo package > /tmp/pkg.txt && exec python3 -m http.server 8000")  # fmt: skip
        assert started.returncode == 0, started.stderr
        project.extra = (
            f"network:\n  services:\n    - network: {service_net}\n"
            f"build:\n  allow: ['{server}.{service_net}:8000']\n"
        )
        project.write_project()
        fetch = (
            "import urllib.request as u\\n"
            "def get(url):\\n"
            "    try: return u.urlopen(url, timeout=20).read().decode().strip()\\n"
            "    except Exception as exc: return 'refused: ' + str(exc)\\n"
            f"open('/fetched.txt','w').write(get('http://{server}.{service_net}:8000/pkg.txt'))\\n"
            "open('/denied.txt','w').write(get('http://denied.example/'))\\n"
        )
        tag = f"orchestrator-test/build-{builds.marker}:net"
        done = builds(
            f"FROM @BASE@\nUSER root\nLABEL test.mark=@MARK@\n"
            f'RUN printf "{fetch}" > /f.py && python3 /f.py\n',
            tag=tag,
        )
        assert done.returncode == 0, done.stderr
        shown = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                       "cat /fetched.txt; echo; cat /denied.txt; echo; env")  # fmt: skip
        lines = shown.stdout.splitlines()
        assert lines[0] == "package"
        assert lines[1].startswith("refused") and "403" in lines[1]
        assert not [line for line in lines if "proxy" in line.lower()]  # not in the image
        log = (project.root / ".sandbox" / "audit.jsonl").read_text().splitlines()
        egress = [json.loads(x) for x in log if '"build.egress"' in x]
        seen = {(e["metadata"]["host"], e["allowed"]) for e in egress}
        assert (f"{server}.{service_net}", True) in seen
        assert ("denied.example", False) in seen
        assert not build_networks_left(project)
    finally:
        docker("rm", "-f", server)
        # The shared egress proxy joined the service network for the build: it stays (other
        # builds may use it), the test's network goes.
        attached = docker("network", "inspect", service_net, "--format",
                          "{{range .Containers}}{{.Name}} {{end}}").stdout.split()  # fmt: skip
        for name in attached:
            docker("network", "disconnect", "-f", service_net, name)
        removed = docker("network", "rm", service_net)
        assert removed.returncode == 0, removed.stderr


def test_sigterm_mid_step_removes_the_step_container_at_once(builds, project):
    (builds.context / "Dockerfile").write_text(
        f"FROM {WORKER_IMAGE}\nLABEL test.mark={builds.marker}\nRUN sleep 100000\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "build", str(builds.context),
         "--project", str(project.root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    mine = f"{buildnames.NAME_PREFIX}{process.pid}-"
    try:
        assert wait_until(lambda: any(n.startswith(mine) for n in step_containers(live=True)), 180)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "build interrupted (signal 15)" in err
    assert not [n for n in step_containers(live=True) if n.startswith(mine)]


def test_copy_into_an_existing_folder_and_hard_links_from_a_stage(builds):
    (builds.context / "data.txt").write_text("data\n")
    tag = f"orchestrator-test/build-{builds.marker}:copies"
    done = builds(
        "FROM @BASE@ AS first\nUSER root\nLABEL test.mark=@MARK@\n"
        "RUN mkdir -p /app /src && echo keep > /app/keep && echo x > /src/a && ln /src/a /src/b\n"
        "WORKDIR /app\nCOPY data.txt .\nCOPY data.txt /app\nCOPY data.txt /named.txt\n"
        "FROM first\nCOPY --from=first /src /copied\n",
        tag=tag,
    )
    assert done.returncode == 0, done.stderr
    shown = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                   "cat /app/keep /app/data.txt /named.txt /copied/a /copied/b; "
                   "stat -c %h /copied/a")  # fmt: skip
    assert shown.stdout.split() == ["keep", "data", "data", "x", "x", "2"], shown.stderr


KEEPS_TMP = """\
FROM @BASE@
LABEL test.mark=@MARK@
USER worker
RUN ["env"]
RUN echo worker > /tmp/kept.txt
USER root
RUN cat /tmp/kept.txt && echo root >> /tmp/kept.txt && stat -c %a /tmp > /tmp/mode.txt
COPY data.txt /tmp/copied.txt
RUN cat /tmp/copied.txt >> /tmp/kept.txt
RUN --mount=type=tmpfs,target=/tmp echo scratch > /tmp/scratch.txt
"""


def layer_names(image: str) -> list[list[str]]:
    """The names in each layer of ``image`` (``docker save``, read as a stream)."""
    layers: list[list[str]] = []
    with (
        subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE) as saving,
        tarfile.open(fileobj=saving.stdout, mode="r|") as saved,
    ):
        for member in saved:
            if member.name.endswith("layer.tar"):
                with tarfile.open(fileobj=saved.extractfile(member), mode="r|") as layer:
                    layers.append([m.name for m in layer])
    assert saving.returncode == 0
    return layers


def test_what_a_run_step_writes_to_tmp_is_kept_as_docker_build_keeps_it(builds):
    """gVisor mounts a tmpfs of its own over an empty /tmp, lost with the sandbox: what a
    step writes there is still committed, and how leaves no trace in any layer."""
    (builds.context / "data.txt").write_text("copied\n")
    tag = f"orchestrator-test/build-{builds.marker}:tmp"
    done = builds(KEEPS_TMP, tag=tag)
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    assert "  | HOME=/home/worker" in said  # the step's own environment, no shell's in it
    assert not [line for line in said if line.startswith(("  | PWD=", "  | SHLVL="))]
    shown = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                   "ls -A /tmp; cat /tmp/kept.txt /tmp/mode.txt; stat -c %a /tmp")  # fmt: skip
    assert shown.stdout.split() == ["copied.txt", "kept.txt", "mode.txt",
                                    "worker", "root", "copied", "1777", "1777"], shown.stderr  # fmt: skip
    # Four steps wrote files; `env` and the step with /tmp mounted added no layer.
    layers = [json.loads(docker("image", "inspect", ref).stdout)[0]["RootFS"]["Layers"]
              for ref in (WORKER_IMAGE, tag)]  # fmt: skip
    assert len(layers[1]) == len(layers[0]) + 4
    names = [name for names in layer_names(tag) for name in names]
    assert not [name for name in names if TMP_MARKER in name]
    # No marker, no whiteout: only what the steps wrote.
    assert sorted(n for n in names if n.startswith("tmp")) == [
        *["tmp"] * 4, "tmp/copied.txt", *["tmp/kept.txt"] * 3, "tmp/mode.txt"]  # fmt: skip


@pytest.fixture
def packages(engine, project):
    """The local package server (tests/integration/pkgservice.py) and a project whose
    build allowlist holds it as ``pkgs.NET:8000`` (``other.NET`` is the same server, not
    on the list); the network's name."""
    require_gvisor(engine)
    with package_service(engine, "build") as net:
        project.extra = pkg_project(net)
        project.write_project()
        yield net


def _audit_path(project) -> Path:
    return project.root / ".sandbox" / "audit.jsonl"


def _audit(project) -> list[dict]:
    path = _audit_path(project)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def build_networks_left(project) -> list[str]:
    """The networks of this project's builds still on the engine (another test's build may
    hold a network of its own at the same time)."""
    ids = {e["run_id"] for e in _audit(project) if e["operation"].startswith("build.")}
    names = {f"orchestrator-run-build-{build_id}" for build_id in ids if build_id}
    return [n for n in docker("network", "ls", "--format", "{{.Name}}").stdout.split()
            if n in names]  # fmt: skip


def test_add_of_a_url_fetches_an_allowlisted_host_through_the_audited_proxy(builds, project,
                                                                           packages):  # fmt: skip
    base = f"http://pkgs.{packages}:{PKG_PORT}"
    tag = f"orchestrator-test/build-{builds.marker}:url"
    dockerfile = (
        "FROM @BASE@\nLABEL test.mark=@MARK@\nUSER root\nRUN mkdir /existing\n"
        f"ADD {base}/file.txt /fetched/\n"
        f"ADD --checksum=sha256:{FILE_DIGEST} {base}/moved-here /fetched/named.txt\n"
        f"ADD --chmod=644 {base}/archive.tar.gz /existing\n"
    )
    first = builds(dockerfile, "--json", tag=tag)
    steps = outcomes(first)
    assert (steps[5], steps[6], steps[7]) == ("built", "built", "built")
    shown = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                   "cd /fetched; stat -c '%a %u %n' file.txt named.txt /existing/archive.tar.gz; "
                   "cat file.txt named.txt; ls /existing")  # fmt: skip
    assert shown.stdout.splitlines() == [
        "600 0 file.txt",  # Docker's mode for a URL's file
        "600 0 named.txt",
        "644 0 /existing/archive.tar.gz",  # into the existing folder, never unpacked
        FILE_TEXT.strip(),
        FILE_TEXT.strip(),
        "archive.tar.gz",
    ], shown.stderr
    egress = [e for e in _audit(project) if e["operation"] == "build.egress"]
    seen = {(e["metadata"]["line"], e["metadata"]["host"], e["allowed"]) for e in egress}
    assert {(line, f"pkgs.{packages}", True) for line in (5, 6, 7)} <= seen, seen

    # Again: each URL is fetched again (not the checksummed one) and, the same content,
    # its step comes from the cache.
    again = outcomes(builds(dockerfile, "--json", tag=tag))
    assert (again[5], again[6], again[7]) == ("cached", "cached", "cached")
    assert (
        json.loads(docker("image", "inspect", tag).stdout)[0]["Id"]
        == json.loads(first.stdout)["image"]
    )


@pytest.mark.parametrize(
    ("add", "said"),
    [
        ("http://other.NET:8000/file.txt /x",
         "Dockerfile:3: ADD: http://other.NET:8000/file.txt: other.NET:8000 is not on the "
         "project's build allowlist (build.allow): nothing was downloaded"),
        ("http://pkgs.NET:8000/moved /x",
         "Dockerfile:3: ADD: http://pkgs.NET:8000/moved redirected to "
         "http://other.NET:8000/file.txt: other.NET:8000 is not on the project's build "
         "allowlist (build.allow): not followed"),
        (f"--checksum=sha256:{'0' * 64} http://pkgs.NET:8000/file.txt /x",
         f"Dockerfile:3: ADD: http://pkgs.NET:8000/file.txt: checksum mismatch: "
         f"--checksum=sha256:{'0' * 64}, the download is sha256:{FILE_DIGEST}"),
    ],
)  # fmt: skip
def test_add_of_a_url_off_the_allowlist_or_redirected_off_it_is_refused(builds, project,
                                                                       packages, add, said):  # fmt: skip
    before = len(_audit(project))
    done = builds(f"FROM @BASE@\nLABEL test.mark=@MARK@\nADD {add.replace('NET', packages)}\n")
    assert done.returncode == 125, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"orchestrator: error: {builds.context}/{said.replace('NET', packages)}"
    hosts = {
        (e["metadata"]["host"], e["allowed"])
        for e in _audit(project)[before:]
        if e["operation"] == "build.egress"
    }
    assert (f"other.{packages}", True) not in hosts  # nothing reached the other name
    assert not build_networks_left(project)


def test_add_of_a_url_larger_than_the_disk_limit_is_stopped(builds, packages):
    done = builds(
        f"FROM @BASE@\nLABEL test.mark=@MARK@\nADD http://pkgs.{packages}:{PKG_PORT}/big /big\n",
        "--disk", "16m", "--no-cache",
    )  # fmt: skip
    assert done.returncode == 125, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"Dockerfile:3: ADD: http://pkgs.{packages}:{PKG_PORT}/big: larger than the step's "
            "disk limit (16 MiB, --disk): stopped"
        )
    ), done.stderr
    assert not docker("images", "-aq", "--filter", f"label=test.mark={builds.marker}").stdout


#: One allowed request, then COUNT pipelined denied ones straight to the proxy (HOST is
#: the allowed URL).
FLOOD_STEP = r"""
import socket, threading, time, urllib.request
urllib.request.urlopen("HOST", timeout=30).read()
sock = socket.create_connection(("proxy", 3128), timeout=60)
seen = [0]
def drain():
    rest = b""
    while seen[0] < COUNT:
        data = sock.recv(1 << 16)
        if not data:
            return
        # A status line cut between two reads is counted once whole.
        data = rest + data
        seen[0] += data.count(b"HTTP/1.1 403")
        rest = data[-11:]
reader = threading.Thread(target=drain, daemon=True)
reader.start()
for start in range(0, COUNT, 500):
    sock.sendall(b"".join(b"GET http://flood%d.denied.test/ HTTP/1.1\r\nHost: flood%d.denied.test\r\n\r\n"
                          % (n, n) for n in range(start, min(start + 500, COUNT))))
reader.join(180)
sock.close()
print("answered", seen[0])
"""


def test_a_build_step_flooding_the_proxy_is_summarised_and_erases_no_decision(
    builds, project, packages
):
    url = f"http://pkgs.{packages}:{PKG_PORT}/file.txt"
    count = 2_000
    (builds.context / "flood.py").write_text(
        FLOOD_STEP.replace("HOST", url).replace("COUNT", str(count))
    )
    (builds.context / "after.py").write_text(
        "import urllib.request as u\n"
        # No answer from any DNS server: the step finds its proxy in /etc/hosts.
        "open('/etc/resolv.conf', 'w').write('nameserver 192.0.2.1\\n')\n"
        f"u.urlopen('{url}', timeout=30).read()\n"
        "try:\n    u.urlopen('http://after.denied.test/', timeout=30)\n"
        "except Exception:\n    pass\n"
    )
    before = _audit_path(project).stat().st_size if _audit_path(project).exists() else 0
    done = builds(
        "FROM @BASE@\nLABEL test.mark=@MARK@\nCOPY flood.py after.py /\n"
        "RUN python3 /flood.py\nUSER root\nRUN python3 /after.py\n",
        "--no-cache", timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    # The step printed its count unbuffered, in four writes: shown as one line.
    shown = re.search(r"^  \| answered (\d+)$", done.stderr, re.MULTILINE)
    assert shown, done.stderr[-2000:]
    answered = int(shown.group(1))
    assert "egress FLOOD" in done.stderr
    audit = _audit(project)
    egress = [e for e in audit if e["operation"] == "build.egress"]
    by_line = {
        line: [
            (e["metadata"]["host"], e["allowed"]) for e in egress if e["metadata"]["line"] == line
        ]
        for line in (4, 6)
    }
    assert (f"pkgs.{packages}", True) in by_line[4]  # the request before the flood
    denied = [host for host, allowed in by_line[4] if not allowed]
    assert 0 < len(denied) <= 200, len(denied)
    (flood,) = [e for e in audit if e["operation"] == "build.egress.flood"]
    assert flood["metadata"]["line"] == 4 and flood["allowed"] is False
    counted = flood["metadata"]["denied"] + flood["metadata"]["logged_denied"]
    assert count // 2 < answered <= counted <= count, (answered, flood["metadata"])
    # The next step's decisions are its own, none lost to the flood before it.
    assert sorted(by_line[6]) == sorted([(f"pkgs.{packages}", True), ("after.denied.test", False)])
    grown = _audit_path(project).stat().st_size - before
    assert grown < 200_000, grown


def test_the_doctor_reads_the_build_runtimes_and_their_flags_from_the_engine(engine):
    require_gvisor(engine)
    from orchestrator.docker.inspection import engine_facts
    from orchestrator.docker.runtimes import BUILD_RUNTIMES, GVISOR_ARGS, setup_command
    from orchestrator.doctor.checks import build_runtimes_check

    facts = engine_facts(engine)
    wanted = {name: GVISOR_ARGS[name] for name in BUILD_RUNTIMES}
    check = build_runtimes_check(facts, wanted=wanted, needed=True, setup=setup_command())
    assert check.status == "pass", check.detail
    assert "orchestrator-runsc-build (--network=none --oci-seccomp --overlay2=none)" in check.detail
    # The same engine asked for a flag its build runtime lacks: the one-line fix.
    stricter = {**wanted, "orchestrator-runsc-build": [*wanted["orchestrator-runsc-build"],
                                                      "--not-a-flag"]}  # fmt: skip
    check = build_runtimes_check(facts, wanted=stricter, needed=True, setup=setup_command())
    assert check.status == "fail" and check.fix == "sudo orchestrator engine setup --gvisor"
    assert check.detail.startswith("orchestrator-runsc-build runs without --not-a-flag: ")
