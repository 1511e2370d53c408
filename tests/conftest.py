"""Shared fixtures: small projects written into tmp folders."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from orchestrator.config.models import TRUST_ORDER
from orchestrator.policy import worker_identity

# Property tests check what holds, not how fast: a busy machine (the engine tests run
# alongside) must not fail one on hypothesis's default 200 ms per example.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
# No command of the suite goes through a fork server it did not start (one left by `make
# demo` or by the user would serve it), and none starts one: a test that lifts
# ORCHESTRATOR_NO_SERVER uses a server of its own, in a private XDG_RUNTIME_DIR
# (test_fork_server.py, test_launcher.py); only test_autostart.py lifts both.
os.environ["ORCHESTRATOR_NO_SERVER"] = "1"
os.environ["ORCHESTRATOR_NO_AUTOSTART"] = "1"

#: ``--engine=podman``: the integration tests against Podman (tests/podman_engine.py).
pytest_plugins = ("tests.podman_engine",)

WorkerWriter = Callable[..., Path]

#: Files whose tests share a worker process under ``pytest -n`` (:func:`by_file`):
#: test_pool's allowlisted runs use test_egress's local internet (its servers' names, the
#: shared proxy its teardown removes), so the two never run at once.
SHARED_PROCESS = {"test_pool.py": "test_egress.py"}


def by_file(nodeid: str) -> str:
    """The unit of work of ``pytest -n``: under ``tests/integration`` a whole file (its module
    fixtures, such as image builds and servers, are made once, by one process; see
    :data:`SHARED_PROCESS`), elsewhere each test on its own."""
    path, _, _ = nodeid.partition("::")
    folder, _, name = path.rpartition("/")
    if folder.endswith("tests/integration"):
        return f"{folder}/{SHARED_PROCESS.get(name, name)}"
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``pytest -n`` (``make test``), work is handed out by :func:`by_file`, the
    largest units first."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return by_file(nodeid)

    return ByFile(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the swarm is ``serial`` (it switches the engine into swarm
    mode): ``make test`` runs those after the others, alone (Makefile)."""
    for item in items:
        if "swarm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.serial)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody has reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition, timeout: float = 60.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def stop(process: subprocess.Popen[str]) -> None:
    """Terminate ``process`` (killed if it is still there 20 s later) and close its pipes."""
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for stream in (process.stdout, process.stderr):
        if stream:
            stream.close()


@contextlib.contextmanager
def deep_tree(folder: Path, levels: int) -> Iterator[Path]:
    """``folder/d/d/.../d/f.txt``, ``levels`` folders deep (made by descriptor: its path is
    longer than PATH_MAX), removed afterwards without recursion: pytest's own clean-up of
    old temporary folders recurses, and would fail on it in every later session on the
    machine."""
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    try:
        yield folder
    finally:
        while (folder / "d").is_dir():  # lift d/d to the top, remove the emptied d
            for name in os.listdir(folder / "d"):
                os.rename(folder / "d" / name, folder / f"{name}.up")
            os.rmdir(folder / "d")
            if (folder / "d.up").is_dir():
                os.rename(folder / "d.up", folder / "d")
        shutil.rmtree(folder)


class ProjectDir:
    """A project folder under construction: zones, the project file and worker files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "workers").mkdir(parents=True)
        self.zones: dict[str, tuple[str, str, str]] = {}
        self.extra = ""
        self.isolation: str | None = None
        """``runc`` or ``gvisor`` for every trust level (None: the project defaults)."""

    @property
    def identity(self) -> tuple[int, int]:
        return worker_identity(self.root)

    def zone(
        self,
        name: str,
        mode: str = "ro",
        *,
        files: dict[str, str] | None = None,
        extra: str = "",
    ) -> Path:
        path = self.root / name
        path.mkdir(exist_ok=True)
        for rel, content in (files or {}).items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_text(content)
        self.zones[name] = (name, mode, f", {extra}" if extra else "")
        self.write_project()
        return path

    def write_project(self) -> None:
        lines = ["zones:" + ("" if self.zones else " {}")]
        lines += [f"  {n}: {{path: {p}, mode: {m}{x}}}" for n, (p, m, x) in self.zones.items()]
        if self.isolation is not None:
            levels = ", ".join(f"{level}: {self.isolation}" for level in TRUST_ORDER)
            lines.append(f"isolation: {{{levels}}}")
        (self.root / "orchestrator.yaml").write_text("\n".join(lines) + "\n" + self.extra)

    def worker(self, name: str, front: str, body: str = "") -> Path:
        path = self.root / "workers" / f"{name}.worker"
        path.write_text(f"---\n{textwrap.dedent(front).strip()}\n---\n{body}")
        return path


@pytest.fixture
def project(tmp_path: Path) -> ProjectDir:
    p = ProjectDir(tmp_path / "project")
    p.write_project()
    return p
