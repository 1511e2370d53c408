"""Reading declarations from disk: the one place that parses YAML.

Files are parsed with a ``SafeLoader`` that bounds the nesting depth and refuses duplicate
keys, then validated by the strict models. Every problem becomes one line:
``FILE:LINE: FIELD: what is wrong; how to fix it``.
"""

from __future__ import annotations

import copy
import os
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.config.models import ProjectConfig, WorkerConfig, ZoneConfig
from orchestrator.errors import ConfigError
from orchestrator.hostfs.paths import PathRefused, check_path
from orchestrator.vocabulary import did_you_mean

PROJECT_FILE = "orchestrator.yaml"
WORKER_SUFFIX = ".worker"
MAX_FILE_BYTES = 1 << 20
#: Deepest nesting of collections a declaration may use (ours need about five).
MAX_DEPTH = 32
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
    lines: dict[tuple[str | int, ...], int] = field(default_factory=dict, compare=False)
    """The line of each field in the file (``("sandbox", "zones", 0)`` -> 7)."""

    @property
    def name(self) -> str:
        return self.config.name

    def where(self, *loc: str | int) -> str:
        """``FILE:LINE: FIELD`` for a problem at ``loc`` (the line when it is known)."""
        shown = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
        line = self.lines.get(loc)
        return f"{self.file}{f':{line}' if line else ''}: {shown.removeprefix('.')}"


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
        written = root / Path(declared.path).expanduser()
        host = Path(os.path.normpath(written))
        problem = _zone_path_problem(host) or _link_problem(written)
        if problem:
            line = _line_of(node, ("zones", name, "path"), 0)
            problems.append(f"{file}{line}: zones.{name}.path: '{declared.path}' {problem}")
            continue
        zones[name] = Zone(name=name, host_path=host, mode=declared.mode, config=declared)
    problems += _build_secret_problems(config, file, node)
    own = {
        "sandbox.root": (("sandbox", "root"), config.sandbox.root),
        "workers": (("workers",), config.workers),
        "repo": (("repo",), config.repo),
    }
    folders: dict[str, Path] = {}
    for field_name, (loc, value) in own.items():
        written = root / Path(value).expanduser()
        folders[field_name] = Path(os.path.normpath(written))
        if problem := _link_problem(written):
            line = _line_of(node, loc, 0)
            problems.append(f"{file}{line}: {field_name}: '{value}' {problem}")
    if problems:
        raise ConfigError(problems)
    sandbox_root = folders["sandbox.root"]
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
        workers_dir=folders["workers"],
        repo=folders["repo"],
    )


def _build_secret_problems(config: ProjectConfig, file: Path, node: yaml.Node | None) -> list[str]:
    """``build.secrets``: each a credential of the project holding a value of its own (an
    egress credential's value is only ever written by its proxy)."""
    problems = []
    known = config.credentials
    for index, name in enumerate(config.build.secrets):
        where = f"{file}{_line_of(node, ('build', 'secrets', index), 0)}: build.secrets[{index}]"
        credential = known.get(name)
        if credential is None:
            hint = did_you_mean(name, known)
            problems.append(
                f"{where}: '{name}' is not in credentials (known: "
                f"{', '.join(sorted(known)) or 'none'}); {hint + ' ' if hint else ''}"
                "declare it under credentials or remove it"
            )
        elif credential.egress is not None:
            problems.append(
                f"{where}: '{name}' is an egress credential (its value only ever goes into "
                "requests through its proxy); declare a credential of its own for builds"
            )
        elif credential.mode == "inherit":
            problems.append(
                f"{where}: '{name}' is mode inherit and holds no value to mount; use mode explicit"
            )
    return problems


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
    if close := did_you_mean(spec, known):
        hint = f"{close} ({hint})"
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
    instructions = body.strip("\n")
    try:
        config = _validate(WorkerConfig, data, file, node, line_offset=offset)
    except ConfigError as exc:
        partial = _without_failing_fields(WorkerConfig, data)
        if partial is None:
            raise
        worker = Worker(file, partial, instructions, _field_lines(node, offset))
        raise ConfigError(exc.problems, partial=worker) from None
    return Worker(file, config, instructions, _field_lines(node, offset))


def load_model(file: Path, model: type[M]) -> M:
    """Read a YAML file of another declaration (an integration's settings) into ``model``,
    with the same checks and one-line problems (``FILE:LINE: FIELD: fix``) as the project
    and worker files."""
    text = _read(file)
    data, node = _parse_yaml(file, text, line_offset=0)
    if not isinstance(data, dict):
        raise ConfigError([f"{file}:1: must be a mapping of fields such as 'name: value'"])
    return _validate(model, data, file, node, line_offset=0)


def _field_lines(node: yaml.Node | None, line_offset: int) -> dict[tuple[str | int, ...], int]:
    """The line of every field and list item under ``node``, by its path."""
    lines: dict[tuple[str | int, ...], int] = {}
    for current, path in _nodes(node) if node else ():
        if isinstance(current, yaml.MappingNode):
            for key, _ in current.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[(*path, key.value)] = key.start_mark.line + 1 + line_offset
        elif isinstance(current, yaml.SequenceNode):
            for index, item in enumerate(current.value):
                lines[(*path, index)] = item.start_mark.line + 1 + line_offset
    return lines


def _nodes(root: yaml.Node) -> Iterator[tuple[yaml.Node, tuple[str | int, ...]]]:
    """Every node under ``root`` once, with its path (``("sandbox", "zones", 0)``); aliases
    may share nodes, or even cycle back to one, so a node met again is not walked again."""
    seen: set[int] = set()
    pending: list[tuple[yaml.Node, tuple[str | int, ...]]] = [(root, ())]
    while pending:
        node, path = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node, path
        if isinstance(node, yaml.SequenceNode):
            pending += [(item, (*path, i)) for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
                pending.append((value, (*path, name)))


#: Fields whose errors leave no useful partial declaration: what the grant is computed from.
_ESSENTIAL = frozenset({"name", "trust", "network", "sandbox", "isolation"})


def _without_failing_fields(model: type[M], data: dict[str, Any]) -> M | None:
    """``data`` validated with its failing fields left out, or None when that cannot work
    (an error in a field the grant depends on, or nothing left to drop)."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
    else:
        return None
    trimmed = copy.deepcopy(data)
    for error in errors:
        loc = tuple(error["loc"])
        if not loc or loc[0] in _ESSENTIAL:
            return None
        parent: Any = trimmed
        for part in loc[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or loc[-1] not in parent:
            return None
        del parent[loc[-1]]
    try:
        return model.model_validate(trimmed)
    except ValidationError:
        return None


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


class _DeclarationLoader(yaml.SafeLoader):
    """``SafeLoader`` with a bounded nesting depth, checked while composing.

    PyYAML composes nested collections recursively, so a small file of ``[[[[...`` would
    otherwise end in a ``RecursionError``; declarations never need more than a few levels.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested deeper than {MAX_DEPTH} levels; declarations are flat, "
                    "check the brackets and indentation",
                    mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _parse_yaml(file: Path, text: str, line_offset: int) -> tuple[Any, yaml.Node | None]:
    """Compose (depth-bounded), refuse duplicate keys, then construct plain data."""
    loader = _DeclarationLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            duplicates = _duplicate_keys(file, node, line_offset)
            if duplicates:
                raise ConfigError(duplicates)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1 + line_offset}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{file}{where}: invalid YAML: {problem}"]) from None
    except RecursionError:  # a backstop: the loader bounds the depth before this can happen
        raise ConfigError(
            [f"{file}: invalid YAML: nested too deeply; declarations are flat"]
        ) from None
    finally:
        loader.dispose()
    return data, node


def _duplicate_keys(file: Path, root: yaml.Node, line_offset: int) -> list[str]:
    """One line per key given twice in a mapping, at any level, naming both lines."""
    problems: list[tuple[int, str]] = []
    for node, loc in _nodes(root):
        if not isinstance(node, yaml.MappingNode):
            continue
        path = ".".join(str(part) for part in loc) or "(top level)"
        first: dict[tuple[str, str], yaml.Node] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            ident = (key.tag, key.value)
            if ident not in first:
                first[ident] = key
                continue
            line = key.start_mark.line + 1 + line_offset
            earlier = first[ident].start_mark.line + 1 + line_offset
            problems.append(
                (
                    line,
                    f"{file}:{line}: {path}: duplicate key '{key.value}' (first at line "
                    f"{earlier}); keep one",
                )
            )
    return [problem for _, problem in sorted(problems)]


def _validate(model: type[M], data: Any, file: Path, node: yaml.Node | None, line_offset: int) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            field = ".".join(str(part) for part in loc) or "(top level)"
            line = _line_of(node, loc, line_offset)
            problems.append(f"{file}{line}: {field}: {_explain(error, model)}")
        raise ConfigError(problems) from None


def _explain(error: Any, model: type[BaseModel]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        loc = tuple(error["loc"])
        hint = did_you_mean(str(loc[-1]), _fields_at(model, loc[:-1])) if loc else ""
        if hint:
            return f"unknown field; {hint} (or remove it)"
        return "unknown field; remove it or check its spelling"
    if kind == "missing":
        return "required field is missing; add it"
    ctx = error.get("ctx", {})
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    if kind in _TYPE_FIXES:
        return _TYPE_FIXES[kind]
    bounds = {"greater_than_equal": ("ge", "at least"), "less_than_equal": ("le", "at most")}
    if kind in bounds and bounds[kind][0] in ctx:
        key, word = bounds[kind]
        return f"must be {word} {ctx[key]}; write {ctx[key]} or {'more' if key == 'ge' else 'less'}"
    if kind in ("greater_than", "less_than"):
        limit = ctx.get("gt", ctx.get("lt"))
        return f"must be {'more' if kind == 'greater_than' else 'less'} than {limit}"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names a mapping at ``loc`` of ``model`` may hold (for a spelling hint):
    follows fields, dict values, list items and union members (pydantic names a union
    member in ``loc`` by its class or tag)."""
    here: list[Any] = [model]
    for part in loc:
        found: list[Any] = []
        for kind in _unwrapped(here):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                if isinstance(part, str) and part in kind.model_fields:
                    found.append(kind.model_fields[part].annotation)
                elif part == kind.__name__:
                    found.append(kind)
            elif typing.get_origin(kind) is dict and isinstance(part, str):
                found.append(typing.get_args(kind)[1])
            elif typing.get_origin(kind) in (list, tuple) and isinstance(part, int):
                found.append(typing.get_args(kind)[0])
        here = found
    return [
        name
        for kind in _unwrapped(here)
        if isinstance(kind, type) and issubclass(kind, BaseModel)
        for name in kind.model_fields
    ]


def _unwrapped(kinds: list[Any]) -> list[Any]:
    """Annotations with ``Annotated`` and unions opened up (``X | None`` is ``X``)."""
    out: list[Any] = []
    for kind in kinds:
        origin = typing.get_origin(kind)
        if origin is typing.Annotated:
            out += _unwrapped([typing.get_args(kind)[0]])
        elif origin in (typing.Union, types.UnionType):
            out += _unwrapped(list(typing.get_args(kind)))
        else:
            out.append(kind)
    return out


#: What to write instead, for pydantic's type errors (its own words name no fix).
_TYPE_FIXES = {
    "string_type": "must be text; quote it (YAML reads true, 1.0 or null as other types)",
    "list_type": "must be a list; write [a, b] or one '- item' per line",
    "dict_type": "must be a mapping; write 'name: value' pairs",
    "model_type": "must be a mapping; write 'name: value' pairs",
    "model_attributes_type": "must be a mapping; write 'name: value' pairs",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
}


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


#: Host folders no zone may resolve into: the kernel's interfaces, devices, and the engine's
#: sockets and state (a worker reaching them would own the host).
HOST_ONLY = {
    "/proc": "the host's process and kernel interface",
    "/sys": "the host's kernel interface",
    "/dev": "the host's devices",
    "/run": "the host's runtime folder, which holds the engine's socket",
    "/var/run": "the host's runtime folder, which holds the engine's socket",
    "/var/lib/docker": "the engine's state",
    "/var/lib/containerd": "the engine's state",
}


def _link_problem(path: Path) -> str | None:
    """Why ``path`` cannot be used as it is written: a symbolic link on it. A worker that
    can write a folder on the path could have planted it, and every later run would mount
    (or read, or grant access to) wherever it points; so no link is ever followed."""
    try:
        check_path(path, file_ok=True)
    except PathRefused as refused:
        if refused.link is None:
            return None  # not a folder: said where it is used
        return (
            f"leads through a symbolic link: {refused.component} -> {refused.link}; links "
            "are never followed on these paths (a worker could have planted one): name the "
            "real path, or remove the link if a worker made it"
        )
    return None


def _zone_path_problem(host: Path) -> str | None:
    if host == Path("/"):
        return "is the host's root folder, which cannot be a zone; name a project folder"
    for folder, what in HOST_ONLY.items():
        real = Path(os.path.realpath(folder))
        if host.is_relative_to(real) or host.is_relative_to(folder):
            return f"resolves to {host}, inside {folder} ({what}); name a project folder"
        if real.is_relative_to(host):
            return f"resolves to {host}, which holds {folder} ({what}); name a narrower folder"
    sockets = [Path("/var/run/docker.sock"), Path("/run/docker.sock")]
    docker_host = os.environ.get("DOCKER_HOST", "")
    if docker_host.startswith("unix://"):  # a rootless or relocated engine: its socket's folder
        sockets.append(Path(docker_host.removeprefix("unix://")).parent)
    for socket in sockets:
        real = Path(os.path.realpath(socket))
        if _overlaps(host, real) or _overlaps(host, socket):
            return f"({host}) would expose the Docker socket {socket}; name a narrower folder"
    return None


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents
