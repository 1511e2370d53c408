"""``pytest --engine=podman``: the tests against Podman's Docker-compatible API.

The session starts a rootful ``podman system service`` on a socket in a temporary folder,
with its own storage, network configuration and run folders (``CONTAINERS_CONF`` and
``CONTAINERS_STORAGE_CONF`` point at files written there), and sets ``DOCKER_HOST`` for
this process and every command line the tests start. The worker and proxy images are
built there with ``orchestrator images build``'s code; the Debian base is copied over
from the Docker engine when it has one (bootstrapping it again would add a minute),
else bootstrapped. The host firewall rule (docs/network.md, Limits) is applied before the
service starts, as ``orchestrator doctor --fix`` applies it, so that every test runs with it
in place (it must not break Podman: its DNS answers the proxies on their bridge's address).
At the end the service stops, ``podman system reset`` removes what it stored, and the
firewall chains netavark added are removed when they were not there before, and the host
rule when it was not: the machine is left as found.

Without podman (or without root) the session's engine tests skip, except under CI=true,
where that is a failure. Without ``--engine=podman``, tests marked ``podman`` are
deselected. Podman's projects run untrusted workers with ``isolation: runc``
(gVisor is set up for Docker only; see docs/engines.md).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
#: What the tests' projects add for Podman, unless a test sets isolation itself.
RUNC_ISOLATION = "isolation: {untrusted: runc}\n"
START_TIMEOUT_S = 30.0
#: netavark's run folder (address allocations, aardvark-dns); it has no setting of its own.
NETWORK_RUN_DIR = Path("/run/containers/networks")
#: Where Podman keeps its image blob cache as root, whatever the storage settings.
BLOB_CACHE_DIR = Path("/var/lib/containers")

STORAGE_CONF = """\
[storage]
driver = "overlay"
graphroot = "{root}/storage"
runroot = "{root}/run"
"""
CONTAINERS_CONF = """\
[network]
network_config_dir = "{root}/networks"
[engine]
tmp_dir = "{root}/tmp"
static_dir = "{root}/storage/libpod"
volume_path = "{root}/storage/volumes"
events_logger = "file"
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        choices=("docker", "podman"),
        default="docker",
        help="engine for the integration tests: docker (DOCKER_HOST or the default "
        "socket) or podman (a rootful podman system service started for the session)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "podman: runs only with --engine=podman")
    if config.getoption("engine") != "podman":
        return
    missing = ""
    if shutil.which("podman") is None:
        missing = "podman is not installed (apt-get install podman catatonit uidmap)"
    elif os.getuid() != 0:
        missing = "the rootful podman service of --engine=podman needs root (sudo)"
    if missing:
        if IN_CI:
            raise pytest.UsageError(f"CI=true and --engine=podman, but {missing}")
        config.stash[_MISSING] = missing
        return
    service = PodmanService.start()
    config.stash[_SERVICE] = service
    os.environ["DOCKER_HOST"] = service.url
    # Where the orchestrator writes the seccomp profile Podman reads: the session's folder.
    os.environ["XDG_RUNTIME_DIR"] = str(service.runtime_dir)
    _patch_projects()
    _patch_host_configs()


def pytest_unconfigure(config: pytest.Config) -> None:
    service = config.stash.get(_SERVICE, None)
    if service is not None:
        service.stop()
        for name, value in service.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Podman's own tests belong to ``--engine=podman`` runs only (deselected otherwise)."""
    if config.getoption("engine") != "podman":
        podman_only = [item for item in items if item.get_closest_marker("podman")]
        if podman_only:
            config.hook.pytest_deselected(items=podman_only)
            items[:] = [item for item in items if not item.get_closest_marker("podman")]
        return
    missing = config.stash.get(_MISSING, None)
    for item in items:
        if missing and "engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.skip(reason=missing))


_SERVICE = pytest.StashKey["PodmanService"]()
_MISSING = pytest.StashKey[str]()


def _patch_projects() -> None:
    """Projects written by the tests run untrusted workers under runc on Podman."""
    from tests.conftest import ProjectDir

    write = ProjectDir.write_project

    def write_project(self: ProjectDir) -> None:
        write(self)
        path = self.root / "orchestrator.yaml"
        text = path.read_text()
        if not any(line.startswith("isolation:") for line in text.splitlines()):
            path.write_text(text + ("" if text.endswith("\n") else "\n") + RUNC_ISOLATION)

    ProjectDir.write_project = write_project  # type: ignore[method-assign]


def _patch_host_configs() -> None:
    """Containers the tests create themselves (test servers, probes) get explicit nofile and
    nproc limits, as the orchestrator gives its own (orchestrator/docker/podman.py): rootful
    Podman's defaults (1048576) cannot be set where root lacks CAP_SYS_RESOURCE."""
    import docker
    from docker.types import Ulimit

    from orchestrator.docker.podman import pid_max

    create = docker.APIClient.create_host_config

    def create_host_config(self: docker.APIClient, *args: object, **kwargs: object) -> object:
        given = list(kwargs.get("ulimits") or [])  # type: ignore[call-overload]
        names = {u["Name"] for u in given}
        if "nofile" not in names:
            given.append(Ulimit(name="nofile", soft=1024, hard=1024))
        if "nproc" not in names:
            given.append(Ulimit(name="nproc", soft=pid_max(), hard=pid_max()))
        kwargs["ulimits"] = given
        return create(self, *args, **kwargs)  # type: ignore[arg-type]

    docker.APIClient.create_host_config = create_host_config  # type: ignore[method-assign,assignment]


class PodmanService:
    """A rootful ``podman system service`` with storage of its own, in a temporary folder."""

    def __init__(self, root: Path, process: subprocess.Popen[bytes], firewall: set[str]):
        self.root = root
        self.process = process
        self.firewall_before = firewall
        # What was there before the service ran (set by start()), to leave only that.
        self.existed: dict[Path, bool] = {}
        self.links_before: set[str] = set()
        self.dns_before: set[int] = set()
        self.bridged_rules: list[list[str]] = []
        self.host_rule_before: dict[tuple[str, ...], bool] | None = None
        self.url = f"unix://{root}/podman.sock"
        self.runtime_dir = root / "xdg"
        self.saved_env = {name: os.environ.get(name) for name in ("DOCKER_HOST", "XDG_RUNTIME_DIR")}

    @staticmethod
    def env(root: Path) -> dict[str, str]:
        return {
            **os.environ,
            "CONTAINERS_CONF": str(root / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
        }

    @classmethod
    def start(cls) -> PodmanService:
        root = Path(tempfile.mkdtemp(prefix="orch-podman-", dir="/tmp"))
        (root / "storage.conf").write_text(STORAGE_CONF.format(root=root))
        (root / "containers.conf").write_text(CONTAINERS_CONF.format(root=root))
        (root / "xdg").mkdir(mode=0o700)
        from orchestrator.doctor.firewall import apply_fix
        from tests import host_firewall

        firewall = netavark_rules()
        host_rule_before = host_firewall.state()
        apply_fix()  # the rule and its exceptions, as on a machine set up by make
        bridged = add_bridged_rules()
        existed = {path: path.exists() for path in (NETWORK_RUN_DIR.parent, BLOB_CACHE_DIR)}
        before = (_links(), _pids_of(b"aardvark-dns"))
        with (root / "service.log").open("wb") as log:
            process = subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{root}/podman.sock"],
                env=cls.env(root),
                # conmon, started by the service, writes an exec's `oom` marker into its
                # working directory: keep that inside the service's own folder.
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = cls(root, process, firewall)
        service.existed = existed
        service.links_before, service.dns_before = before
        service.bridged_rules = bridged
        service.host_rule_before = host_rule_before
        try:
            service.wait_ready()
            service.load_images()
        except BaseException:
            service.stop()
            raise
        return service

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        path = str(self.root / "podman.sock")
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"podman system service exited: {self.log_tail()}")
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(path)
                    probe.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                    if b"OK" in probe.recv(4096):
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"podman system service did not answer in time: {self.log_tail()}")

    def load_images(self) -> None:
        """The base copied from Docker when it has one, then the images built here."""
        import docker

        from orchestrator.docker import DockerEngine
        from orchestrator.docker.images import BASE_REPOSITORY, build_all, host_suite

        base = f"{BASE_REPOSITORY}:{host_suite()}"
        target = docker.APIClient(base_url=self.url, version="1.41", timeout=300)
        try:
            source = docker.APIClient(version="1.41", timeout=300)
            source.inspect_image(base)  # type: ignore[no-untyped-call]
            target.load_image(source.get_image(base))
        except docker.errors.DockerException:
            pass  # no Docker, or no base there: build_all bootstraps one
        finally:
            target.close()
        os.environ["DOCKER_HOST"] = self.url
        build_all(DockerEngine(), with_credproxy=False)  # refused under Podman: never used

    def log_tail(self) -> str:
        try:
            return (self.root / "service.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        subprocess.run(
            ["podman", "system", "reset", "--force"],
            env=self.env(self.root),
            capture_output=True,
            timeout=120,
            check=False,
        )
        stop_monitors(self.root)
        for pid in _pids_of(b"aardvark-dns") - self.dns_before:  # netavark's DNS daemon
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        for link in _links() - self.links_before:
            if link.startswith(("podman", "oeg-podman")):
                subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
        remove_netavark_rules(self.firewall_before)
        for rule in self.bridged_rules:
            subprocess.run(["iptables", "-D", *rule], capture_output=True, check=False)
        for path, existed in self.existed.items():
            if not existed:
                shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["umount", "-R", "-l", str(self.root)], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.host_rule_before is not None:
            from tests import host_firewall

            host_firewall.restore(self.host_rule_before)


def _links() -> set[str]:
    try:
        return {entry.name for entry in Path("/sys/class/net").iterdir()}
    except OSError:
        return set()


def _pids_of(program: bytes) -> set[int]:
    """Pids whose command is ``program`` (a path ending in it)."""
    return {pid for pid, argv in _processes() if argv[0].endswith(program)}


def stop_monitors(root: Path) -> None:
    """Kill (by their own pids) what the session's service left running: conmon processes,
    and the ``podman ... container cleanup`` each runs when it ends, which would recreate
    the session's folders after their removal.

    conmon leaves the service's process group (it daemonises), and the one of each exec
    waits five minutes after the exec ended (Podman's exit_command_delay) before it goes.
    """
    marker = f"{root}/".encode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [
            pid
            for pid, argv in _processes()
            if argv[0].endswith((b"conmon", b"podman")) and any(marker in arg for arg in argv)
        ]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _processes() -> list[tuple[int, list[bytes]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv and argv[0]:
                    found.append((int(entry.name), argv))
    return found


# -- the host firewall: netavark's chains are global and outlive its networks ---------------


def _iptables_save() -> list[str]:
    if shutil.which("iptables-save") is None:
        return []
    done = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()


def netavark_rules() -> set[str]:
    """netavark's rules and chains now, as ``table|line`` entries."""
    found: set[str] = set()
    table = ""
    for line in _iptables_save():
        if line.startswith("*"):
            table = line[1:]
        elif "NETAVARK" in line.upper():
            found.add(f"{table}|{line}")
    return found


#: Traffic inside one ``oeg-*`` bridge (a worker and its proxy on the run's internal
#: network). Where Docker runs too, bridged traffic passes iptables (br_netfilter) and
#: Docker's FORWARD policy is DROP; netavark accepts nothing for an internal network, so
#: without this the worker never reaches its proxy. docs/engines.md says the same.
#: The tests' own internal networks have no bridge name of ours: Podman names them podmanN.
BRIDGED_RULES = [
    [
        "FORWARD", "-i", bridge, "-o", bridge, "-m", "physdev", "--physdev-is-bridged",
        "-m", "comment", "--comment", "orchestrator: traffic inside one egress bridge",
        "-j", "ACCEPT",
    ]
    for bridge in ("oeg+", "podman+")
]  # fmt: skip


def add_bridged_rules() -> list[list[str]]:
    """Insert :data:`BRIDGED_RULES` that are not there; return those this added."""
    if shutil.which("iptables") is None:
        return []
    added = []
    for rule in BRIDGED_RULES:
        if subprocess.run(["iptables", "-C", *rule], capture_output=True, check=False).returncode:
            done = subprocess.run(["iptables", "-I", *rule], capture_output=True, check=False)
            if done.returncode == 0:
                added.append(rule)
    return added


def remove_netavark_rules(before: set[str]) -> None:
    """Delete the netavark rules and chains that were not there before the session."""
    added = netavark_rules() - before
    for entry in sorted(added):
        table, line = entry.split("|", 1)
        if line.startswith("-A "):
            rule = shlex.split(line[3:])
            subprocess.run(["iptables", "-t", table, "-D", *rule], capture_output=True, check=False)
    for entry in sorted(added):
        table, line = entry.split("|", 1)
        if line.startswith(":"):
            chain = line[1:].split()[0]
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True, check=False)
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True, check=False)


# -- rootless: a user of its own, its own service ---------------------------------------------

ROOTLESS_USER = "orchestrator-podman-test"
#: Subordinate ids for the test user (a range no Debian default hands out).
SUBORDINATE = "400000-465535"


class RootlessPodman:
    """``podman system service`` run by a throw-away user with subordinate ids, and its own
    runtime folder and storage under a temporary folder. Root only. :meth:`close` stops the
    service and its pause process (by their pids), removes the storage and the user, and
    restores /etc/subuid and /etc/subgid."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="orch-podman-rl-", dir="/tmp"))
        self.saved = {p: p.read_bytes() for p in map(Path, ("/etc/subuid", "/etc/subgid"))}
        self.created_user = False
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"unix://{self.root}/run/podman.sock"
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _env(self) -> list[str]:
        return [
            f"HOME={self.root}/home",
            f"XDG_RUNTIME_DIR={self.root}/run",
            f"CONTAINERS_STORAGE_CONF={self.root}/storage.conf",
            f"CONTAINERS_CONF={self.root}/containers.conf",
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        ]

    def _as_user(self, *argv: str) -> list[str]:
        return ["runuser", "-u", ROOTLESS_USER, "--", "env", "-i", *self._env(), *argv]

    def _start(self) -> None:
        if subprocess.run(["id", ROOTLESS_USER], capture_output=True, check=False).returncode:
            subprocess.run(
                ["useradd", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", ROOTLESS_USER],
                check=True,
                capture_output=True,
            )
            self.created_user = True
        subprocess.run(
            ["usermod", "--add-subuids", SUBORDINATE, "--add-subgids", SUBORDINATE, ROOTLESS_USER],
            check=True,
            capture_output=True,
        )
        for sub in ("run", "home"):
            (self.root / sub).mkdir(mode=0o700)
        (self.root / "storage.conf").write_text(
            STORAGE_CONF.replace("{root}/run", "{root}/run/storage").format(root=self.root)
        )
        (self.root / "containers.conf").write_text('[engine]\nevents_logger = "file"\n')
        shutil.chown(self.root, ROOTLESS_USER, ROOTLESS_USER)
        for path in self.root.iterdir():
            shutil.chown(path, ROOTLESS_USER, ROOTLESS_USER)
        with (self.root / "service.log").open("wb") as log:
            self.process = subprocess.Popen(
                self._as_user("podman", "system", "service", "--time=0", self.url),
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.root / "run" / "podman.sock").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log_text = (self.root / "service.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"rootless podman system service did not start: {log_text}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if (self.root / "storage.conf").exists():
            subprocess.run(
                self._as_user("podman", "system", "reset", "--force"),
                capture_output=True,
                timeout=120,
                check=False,
            )
        # The user namespace's keeper, started by the service: stopped by its own pid file.
        pause = self.root / "run" / "libpod" / "tmp" / "pause.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pause.read_text().strip()), signal.SIGKILL)
        if self.created_user:
            subprocess.run(["userdel", ROOTLESS_USER], capture_output=True, check=False)
        for path, data in self.saved.items():
            path.write_bytes(data)
        subprocess.run(["umount", "-R", "-l", str(self.root)], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
