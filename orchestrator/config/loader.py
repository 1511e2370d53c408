"""Reading declarations from disk: the one place that parses YAML.

Files are parsed with ``yaml.safe_load``-equivalent composition and validated by the strict
models. Every problem becomes one line: ``FILE:LINE: FIELD: what is wrong; how to fix it``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.config.models import ProjectConfig, WorkerConfig, ZoneConfig
from orchestrator.errors import ConfigError

PROJECT_FILE = "orchestrator.yaml"
WORKER_SUFFIX = ".worker"
MAX_FILE_BYTES = 1 << 20
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Zone:
    """A project zone with its host folder resolved to an absolute, symlink-free path."""

    name: str
    host_path: Path
    mode: str
    config: ZoneConfig


@dataclass(frozen=True)
class Project:
    """A loaded project: its folder, its validated file and the paths derived from it."""

    root: Path
    file: Path
    config: ProjectConfig
    zones: dict[str, Zone]
    sandbox_root: Path
    workers_dir: Path
    repo: Path


@dataclass(frozen=True)
class Worker:
    """A loaded worker file: validated front matter plus its free-text instructions."""

    file: Path
    config: WorkerConfig
    instructions: str

    @property
    def name(self) -> str:
        return self.config.name


def load_project(directory: Path | str = ".") -> Project:
    """Load ``orchestrator.yaml`` from ``directory``."""
    root = Path(directory).expanduser().resolve()
    file = root / PROJECT_FILE
    if not file.is_file():
        raise ConfigError(
            [f"{file}: no project file here; create {PROJECT_FILE} or pass --project DIR"]
        )
    text = _read(file)
    data, node = _parse_yaml(file, text, line_offset=0)
    if data is None:
        data = {}
    config = _validate(ProjectConfig, data, file, node, line_offset=0)
    zones: dict[str, Zone] = {}
    problems: list[str] = []
    for name, declared in config.zones.items():
        host = Path(os.path.realpath(root / Path(declared.path).expanduser()))
        problem = _zone_path_problem(host)
        if problem:
            line = _line_of(node, ("zones", name, "path"), 0)
            problems.append(f"{file}{line}: zones.{name}.path: {problem}")
            continue
        zones[name] = Zone(name=name, host_path=host, mode=declared.mode, config=declared)
    if problems:
        raise ConfigError(problems)
    sandbox_root = Path(os.path.realpath(root / config.sandbox.root))
    for zone in zones.values():
        if _overlaps(zone.host_path, sandbox_root):
            line = _line_of(node, ("zones", zone.name, "path"), 0)
            problems.append(
                f"{file}{line}: zones.{zone.name}.path: {zone.host_path} overlaps the sandbox "
                f"root {sandbox_root}, which holds run state and the audit log; "
                "point the zone elsewhere"
            )
    if problems:
        raise ConfigError(problems)
    return Project(
        root=root,
        file=file,
        config=config,
        zones=zones,
        sandbox_root=sandbox_root,
        workers_dir=(root / config.workers).resolve(),
        repo=(root / config.repo).resolve(),
    )


def find_worker(project: Project, spec: str) -> Path:
    """Resolve ``spec`` (a path to a worker file, or a name in the workers folder)."""
    candidate = Path(spec).expanduser()
    if candidate.suffix == WORKER_SUFFIX or os.sep in spec:
        if candidate.is_file():
            return candidate.resolve()
        raise ConfigError([f"{candidate}: no such worker file; check the path"])
    by_name = project.workers_dir / f"{spec}{WORKER_SUFFIX}"
    if by_name.is_file():
        return by_name
    known = sorted(p.stem for p in project.workers_dir.glob(f"*{WORKER_SUFFIX}"))
    hint = f"known workers: {', '.join(known)}" if known else "the folder has no .worker files"
    raise ConfigError([f"{by_name}: no worker named '{spec}' in {project.workers_dir}; {hint}"])


def load_worker(project: Project, spec: str) -> Worker:
    """Load a worker file by path or by name."""
    file = find_worker(project, spec)
    text = _read(file)
    front, body, offset = _split_front_matter(file, text)
    data, node = _parse_yaml(file, front, line_offset=offset)
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{file}:{offset + 1}: front matter must be a mapping of fields such as 'name:'"]
        )
    stem = file.name.removesuffix(WORKER_SUFFIX)
    declared = data.setdefault("name", stem)
    if isinstance(declared, str) and declared != stem:
        line = _line_of(node, ("name",), offset)
        raise ConfigError(
            [
                f"{file}{line}: name: '{declared}' differs from the file name '{file.name}'; "
                f"rename the file to {declared}{WORKER_SUFFIX} or drop the name field"
            ]
        )
    config = _validate(WorkerConfig, data, file, node, line_offset=offset)
    return Worker(file=file, config=config, instructions=body.strip("\n"))


def _read(file: Path) -> str:
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read: {exc.strerror}"]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError([f"{file}: larger than 1 MiB; declarations must be small"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{file}: not UTF-8 (byte {exc.start}); save it as UTF-8"]) from None


def _split_front_matter(file: Path, text: str) -> tuple[str, str, int]:
    """Return (front matter, body, line number of the front matter's first line - 1)."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ConfigError(
            [f"{file}:1: a worker file starts with a '---' line, then YAML fields, then '---'"]
        )
    for index in range(1, len(lines)):
        if lines[index].strip() == "---":
            return "".join(lines[1:index]), "".join(lines[index + 1 :]), 1
    raise ConfigError([f"{file}: front matter is not closed; add a '---' line after the fields"])


def _parse_yaml(file: Path, text: str, line_offset: int) -> tuple[Any, yaml.Node | None]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1 + line_offset}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{file}{where}: invalid YAML: {problem}"]) from None
    return data, node


def _validate(model: type[M], data: Any, file: Path, node: yaml.Node | None, line_offset: int) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            field = ".".join(str(part) for part in loc) or "(top level)"
            line = _line_of(node, loc, line_offset)
            problems.append(f"{file}{line}: {field}: {_explain(error)}")
        raise ConfigError(problems) from None


def _explain(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field; remove it or check its spelling"
    if kind == "missing":
        return "required field is missing; add it"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"must be one of {expected}"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...], line_offset: int) -> str:
    """Best-effort ``:LINE`` of the YAML node at ``loc``; empty when it cannot be found."""
    best = node
    current = node
    for depth, part in enumerate(loc, start=1):
        if isinstance(current, yaml.MappingNode):
            nxt = None
            for key, value in current.value:
                if key.value == str(part):
                    nxt = key if depth == len(loc) else value
                    break
            current = nxt
        elif isinstance(current, yaml.SequenceNode) and isinstance(part, int):
            current = current.value[part] if part < len(current.value) else None
        else:
            current = None
        if current is None:
            break
        best = current
    if best is None:
        return ""
    return f":{best.start_mark.line + 1 + line_offset}"


def _zone_path_problem(host: Path) -> str | None:
    if host == Path("/"):
        return "the host's root folder cannot be a zone; name a project folder"
    for socket in (Path("/var/run/docker.sock"), Path("/run/docker.sock")):
        real = Path(os.path.realpath(socket))
        if _overlaps(host, real) or _overlaps(host, socket):
            return f"{host} would expose the Docker socket {socket}; name a narrower folder"
    return None


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents
