"""Untrusted Dockerfiles built step by step, each ``RUN`` a hardened run under gVisor.

::

    from orchestrator.build import build_image

    result = build_image("task/environment", tag="task:latest", project=".")
    result.image_id, result.cached_steps

See docs/build.md. The modules: :mod:`.dockerfile` (parse, check, stages; pure),
:mod:`.words` (quotes and ``$VAR``; pure), :mod:`.context` (the context as hostile input),
:mod:`.engine` (the engine seam), :mod:`.secrets` (``RUN --mount=type=secret``: the
project's declared build secrets, a file for one step), :mod:`.bases` (the images a
project's builds may name), :mod:`.scope` (the project's cache key), :mod:`.builder` (the
steps, the cache, the audit); :mod:`.agent` builds the agent image with it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.build.builder import BuildResult, StepFailed, StepRecord
from orchestrator.build.dockerfile import BuildRefused
from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.audit import AuditLog
    from orchestrator.build.context import Context
    from orchestrator.build.engine import StepEngine
    from orchestrator.build.secrets import BuildSecrets
    from orchestrator.config import Project

__all__ = [
    "DEFAULT_DISK",
    "DEFAULT_DISK_TOTAL",
    "BuildRefused",
    "BuildResult",
    "StepFailed",
    "StepRecord",
    "build_image",
]

#: Bytes a step may add to its layer, unless the build says otherwise.
DEFAULT_DISK = 4 << 30
#: Bytes all the steps a build runs may add together, unless the build says otherwise.
DEFAULT_DISK_TOTAL = 16 << 30


def build_image(
    context: str | os.PathLike[str],
    *,
    dockerfile: str | os.PathLike[str] | None = None,
    tag: str | None = None,
    project: str | os.PathLike[str] = ".",
    target: str | None = None,
    no_cache: bool = False,
    build_args: dict[str, str] | None = None,
    memory: int | None = None,
    cpus: float | None = None,
    pids: int | None = None,
    timeout: float | None = None,
    disk: int | None = None,
    disk_total: int | None = None,
    allow: list[str] | None = None,
    say: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    engine: StepEngine | None = None,
    labels: dict[str, str] | None = None,
    cache_key: bytes | None = None,
) -> BuildResult:
    """Build the Dockerfile (``dockerfile``, default ``CONTEXT/Dockerfile``) of the folder
    ``context`` with the project's limits (``memory``... override them for this build;
    ``disk``: bytes a step may add, ``disk_total``: bytes all its steps may add together),
    audited in the project's log; tag the image ``tag``. ``allow``: destinations this
    build's steps may reach too, on top of the project's ``build.allow`` (given at run
    time, never written into a file: the host's apt archives for ``orchestrator images
    build``). ``labels``: labels of the orchestrator's own to put on the image (the
    agent image's; a Dockerfile may not set them). ``cache_key``: the cache's key, instead
    of the project's (see :mod:`.scope`). ``say`` gets each line of the build's progress (a
    step's output among it: untrusted text), ``warn`` a warning (default: ``say``). Raises
    :class:`BuildRefused`
    (one line: ``FILE:LINE: INSTRUCTION: why``) or :class:`StepFailed` (a ``RUN`` failed:
    its exit code is ``exit_code``)."""
    from orchestrator.build.bases import BaseImages
    from orchestrator.build.builder import Builder
    from orchestrator.build.context import Context
    from orchestrator.build.dockerfile import parse
    from orchestrator.build.engine import StepLimits
    from orchestrator.build.scope import project_cache_key
    from orchestrator.config import Resources, load_project
    from orchestrator.policy.grant import resolve_limits
    from orchestrator.runtime import open_audit

    if allow:
        from orchestrator.config.allowlist import validate_allowlist

        try:
            validate_allowlist(allow)
        except ValueError as exc:
            raise BuildRefused(f"the build's allowlist: {exc}") from None
    loaded = load_project(Path(project))
    settings = loaded.config.build
    overrides = Resources(memory=memory, cpus=cpus, pids=pids, timeout=timeout)
    limits = resolve_limits(overrides, settings.resources, loaded.config.defaults.resources)
    step_limits = StepLimits.of(
        limits,
        disk=disk or settings.disk or DEFAULT_DISK,
        disk_total=disk_total or settings.disk_total or DEFAULT_DISK_TOTAL,
    )
    cache_key = cache_key or project_cache_key(loaded)
    images = BaseImages(tuple(settings.images), str(loaded.file))
    audit = open_audit(loaded)
    try:
        try:
            folder = Context.open(Path(context))
        except BuildRefused as exc:
            audit.record("build.refused", allowed=False, reason=str(exc), path=str(context))
            raise
        try:
            try:
                path, text = _dockerfile(folder, dockerfile)
                parsed = parse(path, text)
            except BuildRefused as exc:
                audit.record("build.refused", allowed=False, reason=str(exc), path=str(context))
                raise
            if engine is None:
                from orchestrator.docker.build import DockerStepEngine

                engine = DockerStepEngine()
            builder = Builder(engine, audit, folder, parsed, step_limits,
                              build_args=build_args, no_cache=no_cache,
                              allow=[*settings.allow, *(allow or [])],
                              services=[s.network for s in loaded.config.network.services],
                              secrets=_secrets(loaded, audit), say=say, warn=warn,
                              host_rule_missing=_host_rule_missing, cache_key=cache_key,
                              images=images, labels=labels,
                              ca=_build_cas(loaded))  # fmt: skip
            return builder.build(target, tag)
        finally:
            folder.close()
    finally:
        audit.close()


#: Where a host keeps the bundle of every CA it trusts (Debian's first: its local CAs,
#: /usr/local/share/ca-certificates, are in it once ``update-ca-certificates`` ran).
HOST_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def _build_cas(project: Project) -> bytes:
    """The project's ``build.ca``: the host's CA bundle (``host``), or its PEM files."""
    from orchestrator.runtime.credproxy import read_cas

    setting = project.config.build.ca
    if setting == "host":
        for path in HOST_BUNDLES:
            try:
                with open(path, "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise BuildRefused(f"build.ca: host: cannot read {path}: {exc.strerror}") from None
        raise BuildRefused(
            f"build.ca: host: this machine has no CA bundle ({' or '.join(HOST_BUNDLES)}); "
            "name the CA files instead"
        )
    paths = [os.path.normpath(project.root / Path(name).expanduser()) for name in setting]
    try:
        return read_cas(paths, "build.ca")
    except OrchestratorError as exc:
        raise BuildRefused(f"{project.file}: {exc}") from None


def _host_rule_missing() -> bool:
    """Whether the host's firewall rule for the egress bridges is missing (checked once
    per process, as root only, as ``run`` checks it)."""
    from orchestrator.doctor.firewall import missing_rule_warning

    return missing_rule_warning() is not None


def _secrets(project: Project, audit: AuditLog) -> BuildSecrets:
    """The project's ``build.secrets``, each read from its credential's source (and
    registered with the audit log's redaction) when a step first mounts it."""
    from orchestrator.build.secrets import BuildSecrets
    from orchestrator.credentials import resolve

    credentials = project.config.credentials

    def reader(name: str) -> Callable[[], str]:
        return lambda: resolve(name, credentials[name], audit=audit, base=project.root).reveal()

    names = project.config.build.secrets
    return BuildSecrets({name: reader(name) for name in names}, str(project.file))


def _dockerfile(context: Context, named: str | os.PathLike[str] | None) -> tuple[Path, str]:
    from orchestrator.build.context import TEXT_LIMIT
    from orchestrator.hostfs.files import read_limited
    from orchestrator.hostfs.paths import PathRefused, open_path

    if named is None:
        text = context.read_text("Dockerfile")
        if text is None:
            raise BuildRefused(f"{context.root}: no Dockerfile (name one with -f)")
        return context.root / "Dockerfile", text
    path = Path(named).absolute()
    try:
        folder = open_path(path.parent.resolve(strict=True))
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        finally:
            os.close(folder)
    except (OSError, PathRefused) as exc:
        raise BuildRefused(f"{path}: cannot read the Dockerfile ({exc})") from None
    try:
        return path, read_limited(fd, TEXT_LIMIT).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
