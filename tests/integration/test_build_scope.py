"""What one project's builds may take from the shared engine, through the real command line
(``orchestrator build`` and ``orchestrator gc``, every ``RUN`` under gVisor's build runtime).

- The layer cache is the project's own: two projects building the same Dockerfile, with
  different secret values or different allowlists, never get each other's layer.
- ``LABEL io.orchestrator.*`` and a base image carrying the orchestrator's labels are
  refused; a run's container made from such an image carries the real owner's labels,
  and ``gc`` leaves alone a container someone else made from it.
- ``FROM``/``COPY --from`` only the images the project's ``build.images`` allows; the
  egress proxy's image never.

See docs/build.md ("The cache", "Base images", "Labels").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import labels
from orchestrator.docker.images import WORKER_IMAGE
from orchestrator.egress import PROXY_IMAGE
from tests.conftest import ProjectDir
from tests.integration.conftest import cli, containers_of, require_gvisor
from tests.integration.pkgservice import FILE_TEXT, package_service
from tests.integration.pkgservice import PORT as PKG_PORT
from tests.integration.pkgservice import project_text as pkg_project
from tests.integration.test_build import docker, outcomes, step_containers

pytestmark = pytest.mark.docker


class Projects:
    """Projects of one test, each with its own folder, building one context."""

    def __init__(self, tmp_path: Path, marker: str) -> None:
        self.tmp_path, self.marker = tmp_path, marker
        self.context = tmp_path / "ctx"
        self.context.mkdir()
        self.tags: list[str] = []

    def new(self, name: str, extra: str = "") -> ProjectDir:
        project = ProjectDir(self.tmp_path / name)
        project.extra = extra
        project.write_project()
        return project

    def build(self, project: ProjectDir, dockerfile: str, *args: str, tag: str | None = None,
              env: dict[str, str] | None = None):  # fmt: skip
        (self.context / "Dockerfile").write_text(dockerfile.replace("@MARK@", self.marker))
        if tag:
            self.tags.append(tag)
        extra = ["-t", tag] if tag else []
        return cli("build", str(self.context), "--project", str(project.root), "--json",
                   *extra, *args, env=env, timeout=600)  # fmt: skip

    def tag(self, name: str) -> str:
        tag = f"orchestrator-test/scope-{self.marker}:{name}"
        self.tags.append(tag)
        return tag


@pytest.fixture
def projects(engine, tmp_path) -> Iterator[Projects]:
    require_gvisor(engine)
    made = Projects(tmp_path, uuid.uuid4().hex[:12])
    yield made
    for tag in made.tags:
        docker("rmi", "-f", tag)
    for image in reversed(
        docker("images", "-aq", "--filter", f"label=test.mark={made.marker}").stdout.split()
    ):
        docker("rmi", "-f", image)
    assert not step_containers(), "a build left a step container behind"


def cat(tag: str, path: str) -> str:
    shown = docker("run", "--rm", "--entrypoint", "cat", tag, path)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def one_line_error(done) -> str:
    assert done.returncode == 125, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


SECRET_STEP = f"""\
FROM {WORKER_IMAGE}
USER root
LABEL test.mark=@MARK@
RUN --mount=type=secret,id=tok cp /run/secrets/tok /x
"""
SECRET_PROJECT = (
    "credentials:\n  tok: {source: env, env: TEST_SCOPE_TOK}\nbuild:\n  secrets: [tok]\n"
)


def test_two_projects_with_different_secret_values_never_share_a_layer(projects):
    a, b = projects.new("a", SECRET_PROJECT), projects.new("b", SECRET_PROJECT)
    value_a, value_b = f"value-a-{uuid.uuid4().hex}", f"value-b-{uuid.uuid4().hex}"
    tag_a, tag_b = projects.tag("secret-a"), projects.tag("secret-b")

    first = projects.build(a, SECRET_STEP, tag=tag_a, env={"TEST_SCOPE_TOK": value_a})
    assert outcomes(first)[4] == "built"
    other = projects.build(b, SECRET_STEP, tag=tag_b, env={"TEST_SCOPE_TOK": value_b})
    assert outcomes(other)[4] == "built"  # never A's layer
    assert cat(tag_a, "/x") == value_a and cat(tag_b, "/x") == value_b
    # Within one project the cache works as before: all of it is reused.
    again = projects.build(a, SECRET_STEP, tag=tag_a, env={"TEST_SCOPE_TOK": value_a})
    assert set(outcomes(again).values()) <= {"cached", "config"}
    assert json.loads(again.stdout)["image"] == json.loads(first.stdout)["image"]
    # Each project's steps carry keys the other never computes.
    keys = [{s["key"] for s in json.loads(d.stdout)["steps"] if s["key"]} for d in (first, other)]
    assert keys[0] and keys[1] and not keys[0] & keys[1]


FETCH_STEP = """\
FROM orchestrator/worker:latest
USER root
LABEL test.mark=@MARK@
RUN python3 -c "import urllib.request as u; \\
    open('/fetched', 'w').write(u.urlopen('URL', timeout=30).read().decode())" \\
    || echo refused > /fetched
"""


def test_a_project_whose_allowlist_refuses_a_host_never_gets_a_layer_fetched_from_it(
    engine, projects
):
    from orchestrator.config.allowlist import validate_allowlist
    from orchestrator.docker import egress as eg
    from orchestrator.docker import egress_gc as eg_gc

    narrow = "blocked.example.invalid:8000"
    try:
        with package_service(engine, "scope") as net:
            url = f"http://pkgs.{net}:{PKG_PORT}/file.txt"
            dockerfile = FETCH_STEP.replace("URL", url)
            wide = projects.new("wide", pkg_project(net))
            refused = projects.new("narrow", f"build:\n  allow: ['{narrow}']\n")
            tag_wide, tag_narrow = projects.tag("wide"), projects.tag("narrow")

            first = projects.build(wide, dockerfile, tag=tag_wide)
            assert outcomes(first)[4] == "built"
            assert cat(tag_wide, "/fetched") == FILE_TEXT
            other = projects.build(refused, dockerfile, tag=tag_narrow)
            assert outcomes(other)[4] == "built"  # never the wide project's layer
            assert cat(tag_narrow, "/fetched") == "refused\n"
            audit = (refused.root / ".sandbox" / "audit.jsonl").read_text().splitlines()
            egress = [json.loads(x) for x in audit if '"build.egress"' in x]
            assert {(e["metadata"]["host"], e["allowed"]) for e in egress} == {
                (f"pkgs.{net}", False)
            }
    finally:
        eg_gc.remove_egress(engine, eg.egress_key(validate_allowlist([narrow]), []))


FORGED_OWNER = "LABEL io.orchestrator.managed=true io.orchestrator.owner-pid=999999 " \
    "io.orchestrator.owner-start=1 io.orchestrator.owner-pidns={ns}"  # fmt: skip


def forged_image(projects: Projects, name: str, label: str) -> str:
    """An image made outside the orchestrator (plain ``docker build``) carrying ``label``."""
    folder = projects.tmp_path / f"forged-{name}"
    folder.mkdir()
    (folder / "Dockerfile").write_text(
        f"FROM {WORKER_IMAGE}\n{label}\nLABEL test.mark={projects.marker}\n"
    )
    tag = projects.tag(f"forged-{name}")
    made = docker("build", "-q", "-t", tag, str(folder))
    assert made.returncode == 0, made.stderr
    return tag


def test_a_dockerfile_or_a_base_image_setting_the_orchestrators_labels_is_refused(projects):
    ns = labels.current_owner().pid_ns
    project = projects.new("p")
    said = one_line_error(projects.build(
        project, f"FROM {WORKER_IMAGE}\nLABEL test.mark=@MARK@\n{FORGED_OWNER.format(ns=ns)}\n"
    ))  # fmt: skip
    assert said == (
        f"orchestrator: error: {projects.context}/Dockerfile:3: LABEL: io.orchestrator.managed: "
        "the io.orchestrator.* labels are the orchestrator's own; a Dockerfile may not set "
        "them (name yours otherwise)"
    )
    # A name made of a variable is known only as the stage is built: refused there.
    done = projects.build(
        project, f"FROM {WORKER_IMAGE}\nARG KEY=io.orchestrator.build.key\nLABEL $KEY=planted\n"
    )
    assert done.returncode == 125, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said.endswith("Dockerfile:3: LABEL: io.orchestrator.build.key: the io.orchestrator.* "
                         "labels are the orchestrator's own; a Dockerfile may not set them "
                         "(name yours otherwise)")  # fmt: skip
    shared = forged_image(projects, "shared", "LABEL io.orchestrator.shared=true")
    project = projects.new("listed", "build:\n  images: ['orchestrator-test/*']\n")
    for dockerfile, line in ((f"FROM {shared}\nRUN true\n", "1: FROM"),
                             (f"FROM {WORKER_IMAGE}\nCOPY --from={shared} /etc/hostname /x\n",
                              "2: COPY")):  # fmt: skip
        said = one_line_error(projects.build(project, dockerfile))
        assert said.endswith(
            f"Dockerfile:{line}: image '{shared}' carries the label io.orchestrator.shared, "
            "which only the orchestrator sets (the engine would pass it into the image and "
            "every container made from it): rebuild that image without it"
        ), said


def _start_run(project: ProjectDir, image: str) -> subprocess.Popen:
    script = "import time; print('started', flush=True); time.sleep(120)"
    project.worker("w", f"image: {image}\ncommand: {json.dumps(['python3', '-c', script])}")
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "w", "--project", str(project.root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.serial
def test_gc_judges_a_container_by_the_labels_the_orchestrator_gave_it_never_its_images(
    engine, projects
):
    ns = labels.current_owner().pid_ns
    # An image claiming a SIGKILLed orchestrator's "shared" container: a run made from it.
    shared = forged_image(projects, "shared", "LABEL io.orchestrator.shared=true "
                          f"{FORGED_OWNER.format(ns=ns).removeprefix('LABEL ')}")  # fmt: skip
    project = projects.new("p")
    process = _start_run(project, shared)
    try:
        assert process.stdout is not None and process.stdout.readline() == "started\n"
        (mine,) = containers_of(engine, process.pid)
        given = json.loads(docker("inspect", mine.id).stdout)[0]["Config"]["Labels"]
        assert given[labels.SHARED] == "false" and given[labels.OWNER_PID] == str(process.pid)
        assert given[labels.MANAGED] == "true" and given[labels.OWNER_NS] == ns
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        done = cli("gc", "--json", "--project", str(project.root))
        assert done.returncode == 0, done.stderr
        # The SIGKILLed run's container is gone (its image's "shared" never stood).
        assert containers_of(engine, process.pid) == []
        assert docker("inspect", mine.id).returncode != 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_gc_leaves_alone_a_container_someone_else_made_from_an_image_naming_an_owner(
    engine, projects
):
    """The container's owner labels are its image's: a dead orchestrator's, in the pid
    namespace ``gc`` runs in. ``gc`` runs in a pid namespace of the test's own, so that no
    other ``gc`` on this shared engine (every ``run`` starts with one) judges the
    container: for them its owner is another namespace's."""
    project = projects.new("p")
    inner = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
         'readlink /proc/self/ns/pid; read go; exec "$0" -m orchestrator gc --json --project "$1"',
         sys.executable, str(project.root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ORCHESTRATOR_NO_SERVER": "1"},
    )  # fmt: skip
    theirs = ""
    try:
        assert inner.stdout is not None and inner.stdin is not None
        ns = inner.stdout.readline().strip()
        assert ns.startswith("pid:[") and ns != labels.current_owner().pid_ns, ns
        claimed = forged_image(projects, "owner", FORGED_OWNER.format(ns=ns))
        theirs = docker("create", "--name", f"orchestrator-test-theirs-{projects.marker}",
                        claimed, "true").stdout.strip()  # fmt: skip
        assert theirs
        out, err = inner.communicate("go\n", timeout=120)
        assert inner.returncode == 0, err
        removed = {o["name"] for o in json.loads(out)["removed"]}
        assert f"orchestrator-test-theirs-{projects.marker}" not in removed
        assert docker("inspect", theirs).returncode == 0, "gc removed what it did not make"
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.communicate()
        if theirs:
            docker("rm", "-f", theirs)


def test_from_or_copy_from_an_image_off_the_projects_list_is_refused(projects):
    other = projects.new("other")
    secret_tag = projects.tag("other-project")
    made = projects.build(
        other, f"FROM {WORKER_IMAGE}\nUSER root\nLABEL test.mark=@MARK@\n"
        "RUN echo other-project-data > /data\n", tag=secret_tag,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    mine = projects.new("mine")
    for dockerfile, line in ((f"FROM {secret_tag}\n", "1: FROM"),
                             (f"FROM {WORKER_IMAGE}\nCOPY --from={secret_tag} /data /data\n",
                              "2: COPY")):  # fmt: skip
        said = one_line_error(projects.build(mine, dockerfile))
        assert said == (
            f"orchestrator: error: {projects.context}/Dockerfile:{line}: image '{secret_tag}' "
            "is not one this project's builds may name (the images the orchestrator ships, "
            "orchestrator/base:*, orchestrator/worker:*, orchestrator/agent:*, and build.images "
            f"in {mine.root}/orchestrator.yaml); add '{secret_tag}' or a pattern such as "
            f"'{secret_tag.split(':')[0]}' to build.images"
        ), said
    # The egress proxy's image: never, whatever the list says or the tag it is given.
    alias = projects.tag("proxy-alias")
    assert docker("tag", PROXY_IMAGE, alias).returncode == 0
    anything = projects.new("anything", "build:\n  images: ['*']\n")
    for ref in (PROXY_IMAGE, alias):
        said = one_line_error(
            projects.build(anything, f"FROM {WORKER_IMAGE}\nCOPY --from={ref} /etc/passwd /x\n")
        )
        assert said.endswith(
            f"Dockerfile:2: COPY: image '{ref}' is the egress proxy's image: no build may read it"
        ), said
    # Widened by name, the other project's image is a base like any other.
    mine.extra = f"build:\n  images: ['{secret_tag}']\n"
    mine.write_project()
    tag = projects.tag("widened")
    done = projects.build(mine, f"FROM {secret_tag}\nLABEL test.mark=@MARK@\n", tag=tag)
    assert done.returncode == 0, done.stderr
    assert cat(tag, "/data") == "other-project-data\n"
    assert os.path.exists(mine.root / ".sandbox" / "build-cache.key")
