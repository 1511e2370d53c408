"""Building the orchestrator's images without a registry.

The base image is bootstrapped from the host's own apt sources with ``mmdebstrap`` and
imported into the engine; the worker image is then built on it from ``images/worker``.
Both steps are idempotent: an existing base is reused, and the build uses the engine's
cache. With a registry, ``base`` may name an official image (e.g. ``python:3.12-slim``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.docker.client import DockerClient, engine_errors
from orchestrator.errors import ImageBuildError

Progress = Callable[[str], None]

WORKER_IMAGE = "orchestrator/worker:latest"
PROXY_IMAGE = "orchestrator/proxy:latest"
BASE_REPOSITORY = "orchestrator/base"
BASE_PACKAGES = ("python3", "ca-certificates")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def bootstrap_base(engine: DockerClient, tag: str, suite: str, progress: Progress) -> None:
    """Create ``tag`` from a Debian root filesystem bootstrapped from the host's apt sources."""
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
            engine.api.import_image_from_file(
                str(rootfs),
                repository=repository,
                tag=version or "latest",
                changes=[
                    f"ENV PATH={DEFAULT_PATH}",
                    f"LABEL {labels.PREFIX}.image=base {labels.PREFIX}.suite={suite}",
                ],
            )


def build_image(engine: DockerClient, name: str, tag: str, base: str, progress: Progress) -> None:
    """Build ``images/<name>`` on ``base`` as ``tag``, streaming the build's progress."""
    context = images_dir() / name
    with engine_errors(f"building {tag}"):
        try:
            stream = engine.api.build(
                path=str(context),
                tag=tag,
                rm=True,
                forcerm=True,
                decode=True,
                buildargs={"BASE": base},
                labels={f"{labels.PREFIX}.image": name},
            )
            for event in stream:
                if "error" in event:
                    raise ImageBuildError(f"building {tag} failed: {event['error'].strip()}")
                text = str(event.get("stream", "")).strip()
                if text:
                    progress(text)
        except docker_errors.BuildError as exc:
            raise ImageBuildError(f"building {tag} failed: {exc.msg}") from None


def build_all(
    engine: DockerClient,
    *,
    base: str | None = None,
    suite: str | None = None,
    rebuild_base: bool = False,
    progress: Progress = lambda _: None,
) -> BuildResult:
    """Make sure the base exists (bootstrapping it if needed), then build the worker image."""
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
    return BuildResult(base=base, base_built=base_built, images=[WORKER_IMAGE, PROXY_IMAGE])
