"""Building the orchestrator's images without a registry.

The base image is bootstrapped from the host's own apt sources with ``mmdebstrap`` and
imported into the engine; the worker image is then built on it from ``images/worker``.
Both steps are idempotent: an existing base is reused, and the build uses the engine's
cache (and, with ``cache_from``, images brought back by ``docker load`` in a CI job). With a
registry, ``base`` may name an official image (e.g. ``python:3.12-slim``).

On request, the orchestrator's own image (``images/orchestrator``, for CI runners: see
docs/ci.md) is built on the same base from wheels made on this machine by ``pip wheel``,
so that the image build itself needs no package index.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.credproxy import CREDPROXY_IMAGE
from orchestrator.docker.aptsources import carried_over, host_sources
from orchestrator.docker.cache import user_cache
from orchestrator.docker.client import DockerClient, engine_errors
from orchestrator.egress import PROXY_IMAGE
from orchestrator.errors import ImageBuildError

Progress = Callable[[str], None]

WORKER_IMAGE = "orchestrator/worker:latest"
#: The image for agent workers: the worker image plus git, curl, jq, ripgrep and the like.
AGENT_IMAGE = "orchestrator/agent:latest"
ORCHESTRATOR_IMAGE = "orchestrator/orchestrator:latest"
BASE_REPOSITORY = "orchestrator/base"
BASE_PACKAGES = ("python3", "ca-certificates")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The credential proxy's base: mitmproxy 12 needs Python >= 3.12 (trixie has 3.13).
CREDPROXY_SUITE = "trixie"
CREDPROXY_PYTHON = "3.13"
#: Pinned: a 12.x release (11.0.2, the last for Python 3.11, pins an h2 with a
#: request-smuggling flaw).
MITMPROXY_VERSION = "12.3.1"
#: Platforms ``pip download`` may take binary wheels for (the image is x86-64 glibc).
_WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)


@dataclass(frozen=True)
class BuildResult:
    base: str
    base_built: bool
    images: list[str]


def images_dir() -> Path:
    """The Dockerfiles: packaged with the wheel, or the checkout's ``images/`` folder."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_images", here.parent / "images"):
        if (candidate / "worker" / "Dockerfile").is_file():
            return candidate
    raise ImageBuildError(
        f"image definitions not found next to {here}; reinstall the orchestrator package"
    )


def host_suite() -> str:
    """The host's release codename (e.g. ``bookworm``), read from /etc/os-release."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME" and value.strip('"'):
            return value.strip('"')
    raise ImageBuildError(
        "cannot tell the host's release from /etc/os-release; pass --suite (e.g. bookworm) "
        "or --base IMAGE"
    )


def bootstrap_base(
    engine: DockerClient,
    tag: str,
    suite: str,
    progress: Progress,
    *,
    mirrors: list[str] | None = None,
) -> None:
    """Create ``tag`` from a Debian root filesystem bootstrapped from the host's apt sources
    (or from ``mirrors``: apt source lines, given on mmdebstrap's command line)."""
    tool = shutil.which("mmdebstrap")
    if tool is None:
        raise ImageBuildError(
            "no base image and no registry: install mmdebstrap to bootstrap one "
            "(`sudo apt-get install mmdebstrap`), or pass --base IMAGE"
        )
    with tempfile.TemporaryDirectory(prefix="orchestrator-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        command = [
            tool,
            "--variant=apt",
            "--mode=auto",
            "--format=tar",
            f"--include={','.join(BASE_PACKAGES)}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/info/*",
            suite,
            str(rootfs),
            *(mirrors or []),
        ]
        progress(f"bootstrapping a {suite} root filesystem from the host's apt sources")
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            line = line.rstrip()
            tail = [*tail[-19:], line]
            if line.startswith("I: "):
                progress(line[3:])
        if process.wait() != 0:
            raise ImageBuildError(
                f"mmdebstrap failed (exit {process.returncode}); last output:\n" + "\n".join(tail)
            )
        repository, _, version = tag.partition(":")
        progress(f"importing {rootfs.stat().st_size >> 20} MiB as {tag}")
        with engine_errors(f"importing the base image {tag}"):
            # The tag goes inside ``repository`` (the API allows both) and each label gets
            # its own LABEL: Podman's import ignores a separate tag and reads a LABEL's
            # second key=value pair as part of the first one's value.
            engine.api.import_image_from_file(
                str(rootfs),
                repository=f"{repository}:{version or 'latest'}",
                changes=[
                    f"ENV PATH={DEFAULT_PATH}",
                    f"LABEL {labels.PREFIX}.image=base",
                    f"LABEL {labels.PREFIX}.suite={suite}",
                ],
            )


def build_image(
    engine: DockerClient,
    name: str,
    tag: str,
    base: str,
    progress: Progress,
    *,
    context: Path | None = None,
    buildargs: dict[str, str] | None = None,
) -> None:
    """Build ``images/<name>`` (or ``context``) on ``base`` as ``tag``, streaming progress.

    An existing ``tag`` is offered as a cache source: after a ``docker load`` (a CI cache)
    the classic builder would not reuse the loaded layers on its own. The image the build
    replaces is removed when nothing uses it, so that rebuilds (every test run rebuilds the
    orchestrator's image) leave no untagged copies behind.
    """
    context = context or images_dir() / name
    previous = _image_id(engine, tag)
    cache_from = [tag] if previous else None
    with engine_errors(f"building {tag}"):
        try:
            stream = engine.api.build(
                path=str(context),
                tag=tag,
                rm=True,
                forcerm=True,
                decode=True,
                buildargs={"BASE": base, **(buildargs or {})},
                labels={f"{labels.PREFIX}.image": name},
                cache_from=cache_from,
            )
            for event in stream:
                if "error" in event:
                    raise ImageBuildError(f"building {tag} failed: {event['error'].strip()}")
                text = str(event.get("stream", "")).strip()
                if text:
                    progress(text)
        except docker_errors.BuildError as exc:
            raise ImageBuildError(f"building {tag} failed: {exc.msg}") from None
    if previous and _image_id(engine, tag) != previous:
        # Still used by a container (or another tag): then it stays, as docker leaves it.
        with contextlib.suppress(docker_errors.APIError, requests.exceptions.RequestException):
            engine.api.remove_image(previous)


def _image_id(engine: DockerClient, tag: str) -> str | None:
    with engine_errors(f"looking up image '{tag}'"):
        try:
            return str(engine.api.inspect_image(tag)["Id"])  # type: ignore[no-untyped-call]
        except docker_errors.NotFound:
            return None


def build_all(
    engine: DockerClient,
    *,
    base: str | None = None,
    suite: str | None = None,
    rebuild_base: bool = False,
    with_orchestrator: bool = False,
    with_credproxy: bool = True,
    progress: Progress = lambda _: None,
) -> BuildResult:
    """Make sure the base exists (bootstrapping it if needed), then build the worker and
    proxy images, the credential proxy's (on its own trixie base) unless
    ``with_credproxy`` is False, and with ``with_orchestrator`` the orchestrator's own.
    The agent image is built by the orchestrator's own builder
    (:func:`orchestrator.build.agent.build_agent_image`)."""
    engine.ping()
    base_built = False
    if base is None:
        suite = suite or host_suite()
        base = f"{BASE_REPOSITORY}:{suite}"
        if rebuild_base or not engine.image_exists(base):
            bootstrap_base(engine, base, suite, progress)
            base_built = True
        else:
            progress(f"base image {base} present; reusing it (--rebuild-base to refresh)")
    elif not engine.image_exists(base):
        progress(f"pulling {base}")
        repository, _, version = base.partition(":")
        with engine_errors(f"pulling {base} (no registry? omit --base to bootstrap one)"):
            engine.api.pull(repository, tag=version or "latest")
    build_image(engine, "worker", WORKER_IMAGE, base, progress)
    build_image(engine, "proxy", PROXY_IMAGE, base, progress)
    built = [WORKER_IMAGE, PROXY_IMAGE]
    if with_credproxy:
        build_credproxy_image(engine, rebuild_base=rebuild_base, progress=progress)
        built.append(CREDPROXY_IMAGE)
    if with_orchestrator:
        build_orchestrator_image(engine, base, progress)
        built.append(ORCHESTRATOR_IMAGE)
    return BuildResult(base=base, base_built=base_built, images=built)


def credproxy_base(engine: DockerClient, *, rebuild: bool, progress: Progress) -> str:
    """The trixie base the credential proxy is built on, bootstrapped when missing from
    the host's apt sources with the host's release name replaced (read now, from
    /etc/apt; no archive address is written anywhere)."""
    tag = f"{BASE_REPOSITORY}:{CREDPROXY_SUITE}"
    if engine.image_exists(tag) and not rebuild:
        progress(f"base image {tag} present; reusing it")
        return tag
    host = host_suite()
    mirrors: list[str] = []
    if host != CREDPROXY_SUITE:
        sources = carried_over(host_sources(), host, CREDPROXY_SUITE)
        if not sources:
            raise ImageBuildError(
                f"cannot derive {CREDPROXY_SUITE} sources from the host's apt sources (no "
                f"'{host}' entry in /etc/apt); import a {CREDPROXY_SUITE} image as {tag} "
                "yourself (any image with python3 >= 3.12 and apt)"
            )
        mirrors = [source.line() for source in sources]
    bootstrap_base(engine, tag, CREDPROXY_SUITE, progress, mirrors=mirrors)
    return tag


def download_wheels(into: Path, progress: Progress) -> None:
    """``pip download`` mitmproxy and its dependencies as binary wheels for the credential
    proxy's Python, with this machine's pip (its index and settings), into ``into``. The
    wheels of one version are kept in the user's cache folder (:func:`user_cache`) and
    copied from there by later builds: one download per machine, not per build."""
    key = f"mitmproxy-{MITMPROXY_VERSION}-cp{CREDPROXY_PYTHON}"
    cache = user_cache("wheels")
    kept = cache / key if cache is not None else None
    if kept is not None and (kept / ".complete").is_file() and not kept.is_symlink():
        progress(f"mitmproxy {MITMPROXY_VERSION} wheels from {kept}")
        shutil.copytree(kept, into, ignore=shutil.ignore_patterns(".complete"))
        return
    progress(f"downloading mitmproxy {MITMPROXY_VERSION} wheels for Python {CREDPROXY_PYTHON}")
    platforms = [arg for platform in _WHEEL_PLATFORMS for arg in ("--platform", platform)]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
        "--python-version", CREDPROXY_PYTHON, "--implementation", "cp", *platforms,
        "--dest", str(into), f"mitmproxy=={MITMPROXY_VERSION}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
        raise ImageBuildError(
            f"pip download of mitmproxy {MITMPROXY_VERSION} failed (exit {done.returncode}); "
            f"is the package index reachable? Last output:\n{tail}"
        )
    if kept is not None and cache is not None:  # whole, then renamed into place
        with contextlib.suppress(OSError):
            staging = Path(tempfile.mkdtemp(dir=cache, prefix=f".{key}-"))
            shutil.copytree(into, staging, dirs_exist_ok=True)
            (staging / ".complete").write_text("")
            try:
                os.rename(staging, kept)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)  # another build kept them first


def build_credproxy_image(engine: DockerClient, *, rebuild_base: bool, progress: Progress) -> None:
    """Build ``orchestrator/credproxy`` (``images/credproxy``) on the trixie base from
    wheels downloaded here (no index in the build)."""
    base = credproxy_base(engine, rebuild=rebuild_base, progress=progress)
    with tempfile.TemporaryDirectory(prefix="orchestrator-credproxy-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(images_dir() / "credproxy", context)
        download_wheels(context / "wheels", progress)
        build_image(
            engine,
            "credproxy",
            CREDPROXY_IMAGE,
            base,
            progress,
            context=context,
            buildargs={"PYTHON_VERSION": CREDPROXY_PYTHON, "MITMPROXY_VERSION": MITMPROXY_VERSION},
        )


def source_checkout() -> Path:
    """The project checkout the orchestrator runs from (its ``pyproject.toml``)."""
    root = images_dir().parent
    if not (root / "pyproject.toml").is_file() or not (root / "orchestrator").is_dir():
        raise ImageBuildError(
            f"the orchestrator image is built from a checkout of the project, and {root} is "
            "not one (no pyproject.toml); run `orchestrator images build --with-orchestrator` "
            "from a checkout's virtualenv (`make images-orchestrator`)"
        )
    return root


def build_wheels(source: Path, into: Path, progress: Progress) -> None:
    """``pip wheel`` the project and its dependencies with this interpreter: the
    dependencies' wheels into ``into / "wheels"``, the project's own into
    ``into / "project"`` (the Dockerfile installs them in layers of their own, so that a
    change to the project alone reuses the cached layer of its dependencies).

    The wheels are made for this Python (their tags say so); the image's Dockerfile
    checks that its own python3 is the same version before installing them.
    """
    progress("building wheels of the orchestrator and its dependencies (pip wheel)")
    made = into / "all"
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(made)]
    done = subprocess.run(
        [*command, str(source)], capture_output=True, text=True, errors="replace", check=False
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
        raise ImageBuildError(
            f"pip wheel of {source} failed (exit {done.returncode}); is pip installed in "
            f"{sys.prefix}? Last output:\n{tail}"
        )
    wheels = sorted(made.glob("*.whl"))
    # A wheel's file name starts with its distribution name, '-' in it written '_'.
    own = [wheel for wheel in wheels if wheel.name.startswith("orchestrator-")]
    if len(own) != 1:
        raise ImageBuildError(f"pip wheel of {source} made no single orchestrator wheel: {own}")
    for folder, group in (("project", own), ("wheels", [w for w in wheels if w not in own])):
        (into / folder).mkdir(parents=True)
        for wheel in group:
            wheel.rename(into / folder / wheel.name)
    shutil.rmtree(made)
    progress(f"{len(wheels)} wheels ready")


def build_orchestrator_image(engine: DockerClient, base: str, progress: Progress) -> None:
    """Build ``orchestrator/orchestrator`` on ``base`` from wheels made here (no index in
    the build): ``images/orchestrator/Dockerfile`` with the wheels beside it, the
    dependencies' in ``wheels/`` and the project's in ``project/``."""
    source = source_checkout()
    with tempfile.TemporaryDirectory(prefix="orchestrator-image-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(images_dir() / "orchestrator", context)
        build_wheels(source, context, progress)
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        build_image(
            engine,
            "orchestrator",
            ORCHESTRATOR_IMAGE,
            base,
            progress,
            context=context,
            buildargs={"PYTHON_VERSION": python},
        )
