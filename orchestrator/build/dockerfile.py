"""A Dockerfile read into stages of instructions, and what can never be built refused.

The text is parsed by the ``dockerfile`` package (BuildKit's own parser, built as a
wheel): line continuations, escapes, JSON and shell forms, heredocs, comments and parser
directives are its business. This module groups the instructions into stages, checks each
instruction against what the builder can do safely, and picks the stages a target needs.
Every refusal is one line naming ``FILE:LINE``, the instruction and why. Pure: it reads
the file it is given and nothing else; no engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile as parser

from orchestrator.build.words import WordError, expand
from orchestrator.errors import OrchestratorError

__all__ = [
    "BuildRefused",
    "Dockerfile",
    "Instruction",
    "SecretMount",
    "Stage",
    "is_url",
    "parse",
    "secret_mounts",
]

#: Instructions that change the image's configuration only (no layer).
METADATA = frozenset(
    {"ENV", "WORKDIR", "USER", "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "SHELL", "STOPSIGNAL",
     "HEALTHCHECK", "VOLUME", "ARG", "MAINTAINER"}
)  # fmt: skip
#: Instructions that make a layer.
LAYERS = frozenset({"RUN", "COPY", "ADD"})
#: ``RUN --mount`` types served as a fresh tmpfs (never committed, as in BuildKit).
SCRATCH_MOUNTS = frozenset({"cache", "tmpfs"})
#: The one platform built here.
PLATFORMS = frozenset({"linux/amd64", "linux/x86_64", "$BUILDPLATFORM", "$TARGETPLATFORM",
                       "${BUILDPLATFORM}", "${TARGETPLATFORM}"})  # fmt: skip
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_ESCAPE = re.compile(r"^#\s*escape\s*=\s*(\S)\s*$", re.IGNORECASE)


#: The options of ``RUN --mount=type=secret``.
_SECRET_OPTIONS = frozenset({"type", "id", "target", "dst", "destination", "required", "mode",
                             "uid", "gid"})  # fmt: skip


class BuildRefused(OrchestratorError):
    """A Dockerfile, or its context, asks for what the builder will not do."""


@dataclass(frozen=True)
class Instruction:
    """One instruction as written."""

    keyword: str
    """``RUN``, ``COPY``... (upper case)."""
    flags: tuple[str, ...]
    """``--from=build``, ``--chown=1000``..., as written."""
    words: tuple[str, ...]
    """Its arguments as the parser split them (JSON form: the list's strings)."""
    json: bool
    heredocs: tuple[tuple[str, str], ...]
    """``(name, content)`` of each heredoc."""
    line: int
    original: str

    def flag(self, name: str) -> str | None:
        """The value of ``--name=value`` (the last one given), or None."""
        found = None
        for flag in self.flags:
            key, _, value = flag.partition("=")
            if key == f"--{name}":
                found = value
        return found

    def flag_values(self, name: str) -> list[str]:
        return [f.partition("=")[2] for f in self.flags if f.partition("=")[0] == f"--{name}"]


@dataclass(frozen=True)
class SecretMount:
    """``RUN --mount=type=secret,id=NAME[,target=...,required=...,mode=...,uid=...,gid=...]``."""

    id: str
    """The name of the secret: one the project declares under ``build.secrets``."""
    target: str
    """Where the step sees it (default ``/run/secrets/<id>``; relative: under WORKDIR)."""
    required: bool
    """Fail the step when its value cannot be read (else the step runs without it)."""
    mode: int = 0o400
    uid: int = 0
    gid: int = 0


@dataclass
class Stage:
    """``FROM base [AS name]`` and the instructions up to the next ``FROM``."""

    index: int
    base: str
    """The base as written (may hold ``$ARG``)."""
    name: str | None
    line: int
    instructions: list[Instruction] = field(default_factory=list)


@dataclass
class Dockerfile:
    path: Path
    text: str
    escape: str
    global_args: list[Instruction]
    """``ARG`` instructions before the first ``FROM``."""
    stages: list[Stage]

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"

    def refuse(self, instruction: Instruction, why: str) -> BuildRefused:
        return BuildRefused(f"{self.where(instruction.line)}: {instruction.keyword}: {why}")

    def stage_named(self, name: str) -> Stage | None:
        lowered = name.lower()
        for stage in self.stages:
            if stage.name == lowered:
                return stage
        if name.isdigit() and int(name) < len(self.stages):
            return self.stages[int(name)]
        return None

    def target(self, name: str | None) -> Stage:
        if name is None:
            return self.stages[-1]
        stage = self.stage_named(name)
        if stage is None:
            named = ", ".join(s.name for s in self.stages if s.name) or "none"
            raise BuildRefused(f"{self.path}: no stage named '{name}' (stages: {named})")
        return stage

    def needed(self, target: Stage, global_vars: Mapping[str, str]) -> list[Stage]:
        """The stages ``target`` depends on (its base, ``COPY --from``), then itself, each
        once, in file order."""
        wanted: set[int] = set()
        todo = [target]
        while todo:
            stage = todo.pop()
            if stage.index in wanted:
                continue
            wanted.add(stage.index)
            sources = [self.base_of(stage, global_vars)]
            sources += [
                i.flag("from") or "" for i in stage.instructions if i.keyword in ("COPY", "ADD")
            ]
            for source in sources:
                found = self.stage_named(source) if source else None
                if found is not None and found.index < stage.index:
                    todo.append(found)
        return [s for s in self.stages if s.index in wanted]

    def base_of(self, stage: Stage, global_vars: Mapping[str, str]) -> str:
        try:
            return expand(stage.base, global_vars, escape=self.escape)
        except WordError as exc:
            raise BuildRefused(f"{self.where(stage.line)}: FROM: {exc}") from None


def parse(path: Path, text: str) -> Dockerfile:
    """``text`` (the Dockerfile at ``path``) as stages; static refusals raised here."""
    try:
        commands = parser.parse_string(text)
    except parser.GoParseError as exc:
        raise BuildRefused(f"{path}: not a Dockerfile the parser reads: {exc}") from None
    found = Dockerfile(path=path, text=text, escape=_escape_of(text), global_args=[], stages=[])
    for command in commands:
        instruction = Instruction(
            keyword=command.cmd.upper(),
            flags=tuple(command.flags),
            words=tuple(command.value),
            json=command.json,
            heredocs=tuple((h.name, h.content) for h in command.heredocs),
            line=command.start_line,
            original=command.original,
        )
        _check(found, instruction)
        if instruction.keyword == "FROM":
            found.stages.append(_stage(found, instruction, len(found.stages)))
        elif not found.stages:
            if instruction.keyword != "ARG":
                raise found.refuse(instruction, "only ARG may come before the first FROM")
            found.global_args.append(instruction)
        else:
            found.stages[-1].instructions.append(instruction)
    if not found.stages:
        raise BuildRefused(f"{path}: no FROM instruction: nothing to build")
    return found


def _escape_of(text: str) -> str:
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        match = _ESCAPE.match(line)
        if match:
            return match.group(1)
    return "\\"


def _stage(found: Dockerfile, instruction: Instruction, index: int) -> Stage:
    words = list(instruction.words)
    name = None
    if len(words) == 3 and words[1].upper() == "AS":
        name = words[2].lower()
    elif len(words) != 1:
        raise found.refuse(instruction, "expected `FROM IMAGE [AS NAME]`")
    platform = instruction.flag("platform")
    if platform is not None and platform not in PLATFORMS:
        raise found.refuse(
            instruction, f"--platform={platform}: only linux/amd64 is built here (no emulation)"
        )
    return Stage(index=index, base=words[0], name=name, line=instruction.line)


def _check(found: Dockerfile, instruction: Instruction) -> None:
    """Refuse what cannot be made safe, or what this builder does not do."""
    keyword = instruction.keyword
    known = METADATA | LAYERS | {"FROM"}
    if keyword == "ONBUILD":
        raise found.refuse(
            instruction, "ONBUILD is not supported (it runs in someone else's build)"
        )
    if keyword not in known:
        raise found.refuse(instruction, "unknown instruction")
    allowed = {"FROM": {"platform"}, "RUN": {"mount", "network", "security"},
               "COPY": {"from", "chown", "chmod", "link"},
               "ADD": {"chown", "chmod", "link", "checksum"},
               "HEALTHCHECK": {"interval", "timeout", "start-period", "start-interval",
                               "retries"}}  # fmt: skip
    for flag in instruction.flags:
        name = flag.partition("=")[0].removeprefix("--")
        if name not in allowed.get(keyword, set()):
            why = "runs with every privilege" if name == "privileged" else "is not supported"
            raise found.refuse(instruction, f"--{name} {why}")
    if keyword == "RUN":
        _check_run(found, instruction)
    if keyword == "ADD":
        _check_add(found, instruction)
    if keyword in LAYERS - {"RUN"} and len(instruction.words) < 2:
        raise found.refuse(instruction, "needs a source and a destination")


def is_url(word: str) -> bool:
    """Whether an ``ADD`` source is a URL (any scheme) or a git remote, not a context path."""
    return bool(_URL.match(word)) or word.startswith("git@")


def _check_add(found: Dockerfile, instruction: Instruction) -> None:
    """``ADD <url>``: http and https only (fetched through the build allowlist's proxy
    when the step runs); a git repository is refused; ``--checksum`` only for a URL."""
    urls = [w for w in instruction.words[:-1] if is_url(w)]
    for word in urls:
        lowered = word.lower()
        if lowered.startswith(("git@", "git://", "git+")) or lowered.split("#")[0].endswith(".git"):
            raise found.refuse(
                instruction,
                f"{word}: ADD of a git repository is not supported: clone it in a RUN step "
                "under the project's build allowlist",
            )
        if not lowered.startswith(("http://", "https://")):
            raise found.refuse(instruction, f"{word}: only http and https URLs are fetched")
    if instruction.flag("checksum") is not None and len(urls) != len(instruction.words) - 1:
        raise found.refuse(instruction, "--checksum is only for a URL source")


def _check_run(found: Dockerfile, instruction: Instruction) -> None:
    security = instruction.flag("security")
    if security not in (None, "sandbox"):
        raise found.refuse(
            instruction, f"--security={security} would run the step with every privilege"
        )
    network = instruction.flag("network")
    if network not in (None, "default", "none"):
        raise found.refuse(
            instruction,
            f"--network={network}: a step gets no network, or the project's build allowlist",
        )
    for mount in instruction.flag_values("mount"):
        options = mount_options(mount)
        kind = options.get("type", "bind")
        if kind == "ssh":
            raise found.refuse(
                instruction,
                "--mount=type=ssh: a build never gets the host's SSH agent or keys",
            )
        if kind == "secret":
            _secret_mount(found, instruction, mount, options)
            continue
        if kind not in SCRATCH_MOUNTS:
            raise found.refuse(
                instruction,
                f"--mount=type={kind} is not supported (cache and tmpfs are: a fresh, "
                "empty folder for the step)",
            )
        if not (options.get("target") or options.get("dst") or options.get("destination")):
            raise found.refuse(instruction, f"--mount={mount}: no target")


def mount_options(mount: str) -> dict[str, str]:
    """``type=secret,id=x,required`` as ``{"type": "secret", "id": "x", "required": ""}``."""
    return dict(part.strip().partition("=")[::2] for part in mount.split(","))


def secret_mounts(found: Dockerfile, instruction: Instruction) -> list[SecretMount]:
    """The ``--mount=type=secret`` flags of a ``RUN``, checked."""
    return [
        _secret_mount(found, instruction, mount, options)
        for mount in instruction.flag_values("mount")
        if (options := mount_options(mount)).get("type") == "secret"
    ]


def _secret_mount(
    found: Dockerfile, instruction: Instruction, mount: str, options: Mapping[str, str]
) -> SecretMount:
    unknown = sorted(set(options) - _SECRET_OPTIONS)
    if "env" in unknown:
        raise found.refuse(
            instruction,
            f"--mount={mount}: env=: a build secret is only ever a file (an environment "
            "variable is seen by every process of the step); read it from its target",
        )
    if unknown:
        raise found.refuse(
            instruction,
            f"--mount={mount}: {', '.join(unknown)}: not an option of a secret mount "
            "(id, target, required, mode, uid, gid)",
        )
    target = options.get("target") or options.get("dst") or options.get("destination") or ""
    name = options.get("id") or (target.rstrip("/").rpartition("/")[2] if target else "")
    if not name:
        raise found.refuse(instruction, f"--mount={mount}: needs id=NAME")
    required = options.get("required", "false").lower()
    if required not in ("", "true", "false"):
        raise found.refuse(instruction, f"--mount={mount}: required={required}: true or false")

    def number(key: str, default: int, base: int) -> int:
        text = options.get(key)
        if text is None:
            return default
        try:
            value = int(text, base)
        except ValueError:
            value = -1
        if not 0 <= value <= (0o777 if key == "mode" else 0xFFFFFFFE):
            kind = "an octal mode such as 0400" if key == "mode" else "a number"
            raise found.refuse(instruction, f"--mount={mount}: {key}={text}: expected {kind}")
        return value

    return SecretMount(
        id=name,
        target=target or f"/run/secrets/{name}",
        required=required in ("", "true"),
        mode=number("mode", 0o400, 8),
        uid=number("uid", 0, 10),
        gid=number("gid", 0, 10),
    )
