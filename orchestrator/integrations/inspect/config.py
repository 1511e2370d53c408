"""What an Inspect sample's sandboxes are: :class:`OrchestratorSandboxConfig`.

Given to Inspect as the sandbox's config, either as the model itself or as a path:

- a YAML file holding the same fields (relative paths in it are relative to its folder);
- a ``.worker`` file: one environment running that worker, in the project found in its
  folder or the nearest folder above holding ``orchestrator.yaml``.

Pure: no Inspect import, no engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pydantic import Field, field_validator, model_validator

from orchestrator.config import (
    PROJECT_FILE,
    Project,
    Resources,
    SandboxRequest,
    Worker,
    WorkerConfig,
    ZoneRequest,
    load_model,
    load_project,
)
from orchestrator.config.models import EnvValue, Isolation, Network, Size, Strict, Trust
from orchestrator.errors import ConfigError
from orchestrator.timeouts import MAX_SESSION_S

__all__ = ["Environment", "OrchestratorSandboxConfig", "Settings", "resolve"]

#: The name Inspect knows the provider by (``sandbox="orchestrator"``).
PROVIDER = "orchestrator"
#: The settings file Inspect finds by itself next to a task (``sandbox="orchestrator"``).
SETTINGS_FILE = "orchestrator-sandbox.yaml"
#: The default size of the ``/var/tmp`` tmpfs that Inspect's tools are placed in.
TOOLS_TMP = 128 << 20
#: The default longest life of a sample's sandbox (seconds).
MAX_LIFETIME = 8 * 3600.0
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: The fields that describe a worker inline (instead of naming a worker file).
INLINE = ("image", "dockerfile", "zones", "network", "resources", "isolation", "workdir", "env",
          "image_user")  # fmt: skip


class Environment(Strict):
    """One sandbox of a sample: a worker file, or a worker described inline."""

    worker: str | None = None
    """A worker's name in the project's workers folder, or a path to a ``.worker`` file.
    Leave it out to describe the worker with the fields below instead."""
    image: str | None = None
    """Inline: the image (default: the project's)."""
    dockerfile: str | None = None
    """Inline, instead of ``image``: a Dockerfile (relative to the settings file's folder)
    built by the project's builder, its folder the build context (see docs/build.md).
    Compose files are refused."""
    zones: list[ZoneRequest] | None = None
    """Inline: the project's zones it gets, with modes (none: no mounts at all)."""
    network: Network | None = None
    """Inline: ``none`` (the default), ``{allow: [HOST, ...]}`` or ``full`` where the
    project allows it."""
    resources: Resources | None = None
    """Inline: memory, cpus, pids, timeout (the default for a command without one), tmp."""
    isolation: Isolation | None = None
    """Inline: ``gvisor`` or ``runc`` (never weaker than the project gives the trust
    level)."""
    workdir: str | None = None
    """Inline: the working folder, where relative paths and ``cwd`` resolve (``/tmp``)."""
    env: dict[str, EnvValue] | None = None
    """Inline: plain environment values."""
    image_user: bool | None = None
    """Inline: run as the image's own user (often root) on a writable root filesystem,
    only under gVisor (see ``image_user`` in docs/configuration.md)."""
    trust: Trust | None = None
    """The trust level (inline: default ``untrusted``; with ``worker``: at most the
    worker's own)."""
    pool: int = Field(default=0, ge=0, le=64)
    """Keep this many sandboxes opened ahead of need (a warm pool for the task); 0: none."""
    tools_tmp: Size | None = TOOLS_TMP
    """Size of a writable ``/var/tmp`` (a tmpfs, counted in the memory limit) where
    Inspect's ``bash_session`` and ``text_editor`` place their helper; null: none (those
    tools then fail to start)."""
    idle_timeout: float | None = Field(default=None, gt=0, le=MAX_SESSION_S)
    """Close the sandbox after this many idle seconds (default: never; the sample's end
    closes it)."""
    max_lifetime: float | None = Field(default=MAX_LIFETIME, gt=0, le=MAX_SESSION_S)
    """Close the sandbox after this many seconds in any case (null: no limit)."""

    @field_validator("dockerfile")
    @classmethod
    def _not_compose(cls, dockerfile: str | None) -> str | None:
        if dockerfile is not None and _is_compose(dockerfile):
            raise ValueError(
                f"'{dockerfile}' is a compose file, which is not supported (one container "
                "per environment); name a Dockerfile"
            )
        return dockerfile

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.image is not None and self.dockerfile is not None:
            raise ValueError("give image or dockerfile, not both")
        given = [name for name in INLINE if getattr(self, name) is not None]
        if self.worker is not None and given:
            raise ValueError(
                f"worker names a worker file, which declares {', '.join(given)} itself; "
                "drop them here or describe the worker inline without 'worker'"
            )
        return self

    def inline_worker(self, name: str, file: Path) -> Worker:
        """The worker this environment describes inline (``file``: where it is declared)."""
        config = WorkerConfig(
            name=name,
            image=self.image,
            workdir=self.workdir,
            env=dict(self.env or {}),
            resources=self.resources or Resources(),
            sandbox=None if self.zones is None else SandboxRequest(zones=self.zones),
            network=self.network,
            trust=self.trust or "untrusted",
            isolation=self.isolation,
            image_user=bool(self.image_user),
        )
        return Worker(file=file, config=config, instructions="")


class OrchestratorSandboxConfig(Strict):
    """The sandboxes of a sample, in a project. The first environment is the default one
    (``sandbox()``); the fields of :class:`Environment` may also be given at the top level
    for a single environment named ``default``."""

    project: str = "."
    """The project folder (holding ``orchestrator.yaml``)."""
    environments: dict[str, Environment] = Field(min_length=1)
    """Named sandboxes; the first is the default."""

    @model_validator(mode="before")
    @classmethod
    def _single(cls, data: Any) -> Any:
        if isinstance(data, dict) and "environments" not in data:
            single = {key: value for key, value in data.items() if key != "project"}
            return {**({"project": data["project"]} if "project" in data else {}),
                    "environments": {"default": single}}  # fmt: skip
        return data

    @field_validator("environments")
    @classmethod
    def _names(cls, environments: dict[str, Environment]) -> dict[str, Environment]:
        for name in environments:
            if not NAME.match(name):
                raise ValueError(
                    f"environment name '{name}' must be letters, digits, '_', '.' or '-' "
                    "(starting with a letter or digit, at most 64 characters)"
                )
        return environments

    def __hash__(self) -> int:  # Inspect keeps sandbox specs in sets
        return hash(self.model_dump_json())


@dataclass(frozen=True)
class Settings:
    """A config resolved against the file system: absolute paths, the loaded project."""

    project: Project
    environments: tuple[tuple[str, Environment], ...]
    source: Path
    """Where the environments are declared (the settings file, or the project file)."""
    base: Path
    """The folder relative worker paths are relative to."""

    @property
    def key(self) -> str:
        """Identifies these settings (for the task's warm pools)."""
        envs = {name: env.model_dump(mode="json") for name, env in self.environments}
        return f"{self.project.root}|{self.source}|{envs}"

    def dockerfile(self, name: str) -> Path | None:
        """The Dockerfile environment ``name`` is built from, if any (absolute)."""
        env = dict(self.environments)[name]
        return None if env.dockerfile is None else (self.base / env.dockerfile).resolve()

    def worker(self, name: str, image: str | None = None) -> str | Worker:
        """What :meth:`orchestrator.Orchestrator.prepare` takes for environment ``name``
        (``image``: the one built from its Dockerfile)."""
        env = dict(self.environments)[name]
        if env.worker is None:
            if image is not None:
                env = env.model_copy(update={"image": image, "dockerfile": None})
            return env.inline_worker(name, self.source)
        spec = env.worker
        if "/" in spec or spec.endswith(".worker"):
            return str((self.base / spec).resolve())
        return spec


def resolve(config: OrchestratorSandboxConfig | str | None, cwd: Path) -> Settings:
    """The settings ``config`` names (relative paths against ``cwd``); a ConfigError of
    one line per problem, naming the file and field, when they are wrong."""
    if config is None:
        raise ConfigError(
            [
                f"the '{PROVIDER}' sandbox needs a config: "
                f"SandboxEnvironmentSpec('{PROVIDER}', OrchestratorSandboxConfig(project=..., "
                f"worker=...)), a path to a .worker file, or {SETTINGS_FILE} beside the task"
            ]
        )
    if isinstance(config, OrchestratorSandboxConfig):
        return _settings(config, cwd, source=None)
    file = (cwd / config).resolve()
    if not file.is_file():
        raise ConfigError(
            [f"{file}: no such file; the '{PROVIDER}' sandbox's config names a missing file"]
        )
    if _is_compose(file.name):
        raise ConfigError(
            [f"{file}: compose files are not supported by the '{PROVIDER}' sandbox (one "
             "container per environment); name a Dockerfile or a settings file"]
        )  # fmt: skip
    if file.name == "Dockerfile" or file.name.endswith(".Dockerfile"):
        root = _project_above(file)
        single = {"project": str(root), "dockerfile": str(file)}
        return _settings(OrchestratorSandboxConfig.model_validate(single), root, source=None)
    if file.suffix == ".worker":
        root = _project_above(file)
        single = {"project": str(root), "worker": str(file)}
        return _settings(OrchestratorSandboxConfig.model_validate(single), root, source=None)
    return _settings(load_model(file, OrchestratorSandboxConfig), file.parent, source=file)


def _is_compose(name: str) -> bool:
    """Whether a file name is a compose file's (``compose.yaml``, ``docker-compose.yml``...)."""
    base = Path(name).name.lower()
    return base.removeprefix("docker-").removesuffix(".yaml").removesuffix(".yml") == "compose"


def _settings(config: OrchestratorSandboxConfig, base: Path, source: Path | None) -> Settings:
    project = load_project((base / config.project).resolve())
    return Settings(
        project=project,
        environments=tuple(config.environments.items()),
        source=source or project.file,
        base=base,
    )


def _project_above(file: Path) -> Path:
    for folder in file.parents:
        if (folder / PROJECT_FILE).is_file():
            return folder
    raise ConfigError(
        [
            f"{file}: no {PROJECT_FILE} in its folder or any folder above; give an "
            "OrchestratorSandboxConfig with project= instead"
        ]
    )
