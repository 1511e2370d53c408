"""What an Inspect sample's sandboxes are: :class:`OrchestratorSandboxConfig`.

Given to Inspect as the sandbox's config, either as the model itself or as a path:

- a YAML file holding the same fields (relative paths in it are relative to its folder);
- a ``.worker`` file: one environment running that worker, in the project found in its
  folder or the nearest folder above holding ``orchestrator.yaml``.

A config can come from data: a dataset's sample names its sandbox (a path, or the fields
as a mapping, which Inspect hands to ``config_deserialize``; an eval log read back does
the same). So a config given as a path or read from data names only files inside the
task's own folder (where Inspect starts the task): no absolute path or ``..`` out of it,
no link on the way (each folder opened without following one). Only a model built in Python
(the task's own code) may name a project elsewhere. Whatever the config, the project file
and the worker files it leads to must be files no other local user can change
(:mod:`orchestrator.hostfs.owners`): each names host folders a container gets.

Pure: no Inspect import, no engine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pydantic import Field, PrivateAttr, field_validator, model_validator

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
from orchestrator.hostfs.owners import others_can_write
from orchestrator.hostfs.paths import PathRefused, open_path
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
    _from_data: bool = PrivateAttr(default=False)

    @classmethod
    def from_data(cls, data: Any) -> OrchestratorSandboxConfig:
        """The config a dataset or an eval log gives as a mapping: held to the rules of a
        config file (only files inside the task's folder)."""
        config = cls.model_validate(data)
        config._from_data = True
        return config

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
    """The settings ``config`` names (relative paths against ``cwd``, the task's folder);
    a ConfigError of one line per problem, naming the file and field, when they are wrong
    or name what the config may not (see the module docstring)."""
    if config is None:
        raise ConfigError(
            [
                f"the '{PROVIDER}' sandbox needs a config: "
                f"SandboxEnvironmentSpec('{PROVIDER}', OrchestratorSandboxConfig(project=..., "
                f"worker=...)), a path to a .worker file, or {SETTINGS_FILE} beside the task"
            ]
        )
    task = Path(os.path.realpath(cwd))
    if isinstance(config, OrchestratorSandboxConfig):
        settings = _settings(config, task, None, task if config._from_data else None)
    else:
        file = _inside(task, task, config, "the sandbox config")
        if _is_compose(file.name):
            raise ConfigError(
                [f"{file}: compose files are not supported by the '{PROVIDER}' sandbox (one "
                 "container per environment); name a Dockerfile or a settings file"]
            )  # fmt: skip
        if (
            file.name == "Dockerfile"
            or file.name.endswith(".Dockerfile")
            or file.suffix == ".worker"
        ):
            root = _project_above(file, task)
            key = "worker" if file.suffix == ".worker" else "dockerfile"
            single = {"project": os.path.relpath(root, task), key: os.path.relpath(file, task)}
            config_ = OrchestratorSandboxConfig.model_validate(single)
            settings = _settings(config_, task, None, task)
        else:
            model = load_model(file, OrchestratorSandboxConfig)
            settings = _settings(model, file.parent, file, task)
    _check_owners(settings, task)
    return settings


def _is_compose(name: str) -> bool:
    """Whether a file name is a compose file's (``compose.yaml``, ``docker-compose.yml``...)."""
    base = Path(name).name.lower()
    return base.removeprefix("docker-").removesuffix(".yaml").removesuffix(".yml") == "compose"


def _settings(
    config: OrchestratorSandboxConfig, base: Path, source: Path | None, task: Path | None
) -> Settings:
    """``task``: the folder every path must stay in (None: a model built in Python)."""
    if task is None:
        project = load_project((base / config.project).resolve())
    else:
        folder = _inside(task, base, config.project, "project", folder=True)
        _inside(task, folder, PROJECT_FILE, "project file")
        project = load_project(folder)
        for name, env in config.environments.items():
            if env.worker is not None:
                where, spec = (base, env.worker) if _is_path(env.worker) else (
                    project.workers_dir, f"{env.worker}.worker"
                )  # fmt: skip
                _inside(task, where, spec, f"environments.{name}.worker")
            if env.dockerfile is not None:
                _inside(task, base, env.dockerfile, f"environments.{name}.dockerfile")
    return Settings(
        project=project,
        environments=tuple(config.environments.items()),
        source=source or project.file,
        base=base,
    )


def _is_path(spec: str) -> bool:
    return "/" in spec or spec.endswith(".worker")


def _inside(task: Path, base: Path, given: str, what: str, *, folder: bool = False) -> Path:
    """``given`` (relative to ``base``) as a path inside the folder ``task``, every
    component opened without following a link; else one line naming it and the fix."""
    label = f"{what} {given}"
    fix = (
        f"a sandbox config given as a path or as data names only files inside the task's "
        f"folder {task}; build an OrchestratorSandboxConfig in Python for another project"
    )
    # No link on it is followed, so '..' is its lexical parent. (Inspect itself makes a
    # dataset's relative config path absolute, in the dataset's folder.)
    path = Path(os.path.normpath(base / given))
    if not path.is_relative_to(task):
        where = "is outside" if Path(given).is_absolute() else "leads out of ('..')"
        raise ConfigError([f"{label}: {where} the task's folder; {fix}"])
    try:
        os.close(open_path(path, file_ok=not folder))
    except PathRefused as refused:
        if refused.missing:
            raise ConfigError([f"{label}: no such file or folder ({path})"]) from None
        raise ConfigError([f"{label}: {refused.reason}; links are never followed; {fix}"]) from None
    return path


def _check_owners(settings: Settings, task: Path) -> None:
    """Refuse a project file or worker file another local user could change."""
    project = settings.project
    files = [project.file]
    if settings.source != project.file:
        files.append(settings.source)
    for name, env in settings.environments:
        if env.worker is not None:
            spec = settings.worker(name)
            files.append(Path(spec) if isinstance(spec, str) and _is_path(spec)
                         else project.workers_dir / f"{env.worker}.worker")  # fmt: skip
    owner = os.stat(task).st_uid
    problems = [
        f"{file}: {why}; a project or worker file says which host folders a container gets"
        for file in dict.fromkeys(Path(os.path.realpath(f)) for f in files if f.exists())
        if (why := others_can_write(file, trusted={owner}))
    ]
    if problems:
        raise ConfigError(problems)


def _project_above(file: Path, task: Path) -> Path:
    for folder in file.parents:
        if (folder / PROJECT_FILE).is_file():
            return folder
        if folder == task:
            break
    raise ConfigError(
        [
            f"{file}: no {PROJECT_FILE} in its folder or any folder above it inside the "
            f"task's folder {task}; give an OrchestratorSandboxConfig with project= instead"
        ]
    )
