"""A Harbor task's environment as this project's declarations; pure (no Harbor import, no
engine).

- **Network.** Harbor's ``no-network`` is ``none``; ``public`` is ``full`` (where the
  project allows it for the trust level, otherwise the task is refused); ``allowlist``
  is an allowlist through the egress proxy: each host on the ports given (80 and 443
  unless told otherwise), a ``*.DOMAIN`` entry for the subdomains of DOMAIN, an IPv4
  address for requests naming it literally. IPv6 addresses and CIDR ranges cannot be
  enforced exactly and refuse the task; so do names the project's allowlist refuses
  (single labels such as ``localhost``, loopback or link-local addresses).
- **Mounts** are zones: a bind mount whose source is a zone's folder and whose target is
  that zone's path (``/NAME``), ``read_only`` giving ``ro``, else ``rw``; the project's
  widest mode for the zone applies. Anything else refuses the task.
- **Image.** ``[environment] docker_image`` names an image on this machine; without it,
  ``environment/Dockerfile``: one that only says ``FROM`` an image on this machine (plus
  ``WORKDIR`` and ``ENV``) is run as that image; any other is built by the project's
  builder (``orchestrator build``: each ``RUN`` a hardened run under gVisor, cached by
  content), see :attr:`Image.dockerfile`. Compose files are refused.

Every refusal is one line (a :class:`~orchestrator.errors.ConfigError` of one problem).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from orchestrator.config import Project, ZoneRequest
from orchestrator.config.allowlist import validate_allowlist
from orchestrator.errors import ConfigError

__all__ = [
    "HARBOR_FOLDERS",
    "Image",
    "allowlist_ports",
    "image_of",
    "network_of",
    "refuse",
    "zones_of",
]

#: Where Harbor puts its files in an environment: logs (agent, verifier, artifacts), the
#: task's tests and its solution. Each is a writable tmpfs of the run's own, the worker's.
HARBOR_FOLDERS = ("/logs", "/tests", "/solution")
#: The ports a Harbor host name is allowed on when none are given.
DEFAULT_PORTS = (80, 443)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def refuse(message: str) -> ConfigError:
    """The one-line refusal of a task (the environment's name said first)."""
    return ConfigError([f"orchestrator environment: {message}"])


def allowlist_ports(value: object) -> tuple[int, ...]:
    """The ports an ``allow_ports`` option gives: ``443``, ``"80,443"`` or a list."""
    if value is None:
        return DEFAULT_PORTS
    items: Iterable[object]
    if isinstance(value, str):
        items = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, int):
        items = [value]
    elif isinstance(value, list | tuple):
        items = value
    else:
        raise refuse(f"allow_ports={value!r}: give ports as 443 or '80,443'")
    ports: list[int] = []
    for item in items:
        text = str(item).strip()
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise refuse(f"allow_ports: {text!r} is not a port from 1 to 65535")
        ports.append(int(text))
    if not ports:
        raise refuse("allow_ports is empty; leave it out for ports 80 and 443")
    return tuple(dict.fromkeys(ports))


def network_of(mode: str, hosts: Sequence[str], ports: Sequence[int]) -> Any:
    """The worker's ``network`` for Harbor's policy ``mode`` with ``hosts``."""
    if mode == "no-network":
        return "none"
    if mode == "public":
        return "full"
    if mode != "allowlist":
        raise refuse(f"network_mode {mode!r} is unknown here")
    if not hosts:
        return "none"  # an empty allowlist reaches nothing
    entries: list[str] = []
    for host in hosts:
        if "/" in host:
            raise refuse(
                f"allowed_hosts entry {host!r}: CIDR ranges cannot be enforced exactly "
                "(the egress proxy admits names and single IPv4 addresses); the task is refused"
            )
        if ":" in host:
            raise refuse(
                f"allowed_hosts entry {host!r}: IPv6 addresses cannot be enforced (the "
                "egress networks are IPv4 only); the task is refused"
            )
        entries += [f"{host}:{port}" for port in ports]
    try:
        validate_allowlist(entries)
    except ValueError as exc:
        said = str(exc).splitlines()[0]
        raise refuse(f"allowed_hosts {list(hosts)}: {said}; the task is refused") from None
    return {"allow": entries}


def zones_of(project: Project, mounts: Sequence[Mapping[str, Any]]) -> list[ZoneRequest] | None:
    """The zones Harbor's ``mounts`` stand for (None: no mounts at all)."""
    if not mounts:
        return None
    by_folder = {zone.host_path: zone for zone in project.zones.values()}
    zones: list[ZoneRequest] = []
    for mount in mounts:
        kind, source, target = mount.get("type"), mount.get("source"), mount.get("target")
        if kind != "bind" or not isinstance(source, str) or not isinstance(target, str):
            raise refuse(f"mount {dict(mount)!r}: only bind mounts of a zone's folder can be given")
        zone = by_folder.get(Path(source).resolve())
        if zone is None:
            raise refuse(
                f"mount source {source}: not a zone's folder in {project.file}; declare a "
                "zone for it there"
            )
        if str(PurePosixPath(target)) != f"/{zone.name}":
            raise refuse(
                f"mount target {target}: zone '{zone.name}' is mounted at /{zone.name}; "
                f"give target /{zone.name}"
            )
        zones.append(ZoneRequest(name=zone.name, mode="ro" if mount.get("read_only") else "rw"))
    return zones


@dataclass(frozen=True)
class Image:
    """What a task's environment runs: an image on this machine, with the working
    folder and environment its Dockerfile gives."""

    name: str
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    dockerfile: Path | None = None
    """A Dockerfile to build first (its folder the context): ``name`` is then empty."""


def image_of(environment_dir: Path, docker_image: str | None) -> Image:
    """The image of a task: ``docker_image``, or the ``FROM`` of a Dockerfile that needs no
    build (refused, one line, otherwise). Whether it exists is the engine's to say."""
    if docker_image:
        return Image(docker_image)
    dockerfile = environment_dir / "Dockerfile"
    for compose in ("docker-compose.yaml", "docker-compose.yml"):
        if (environment_dir / compose).exists():
            raise refuse(
                f"{environment_dir / compose}: compose environments are not supported "
                "(one container per trial)"
            )
    if not dockerfile.is_file():
        raise refuse(
            f"{environment_dir}: no Dockerfile and no [environment] docker_image in task.toml"
        )
    return _from_dockerfile(dockerfile)


def check_image(image: Image, listed: list[str], declared_in: str) -> None:
    """A task's image that is run as it is (``docker_image``, or a Dockerfile that only
    says ``FROM``) is one a build of the project could name (``build.images``, on top of
    the images the orchestrator ships): a task never runs another project's image, or a
    proxy's, by naming it. Refused in one line otherwise."""
    from orchestrator.build.bases import BaseImages

    images = BaseImages(tuple(listed), declared_in)
    if image.dockerfile is None and not images.allows(image.name):
        raise refuse(images.refusal(image.name))


#: Instructions a task's Dockerfile may hold and still be run as its ``FROM`` image.
_PLAIN = ("FROM", "WORKDIR", "ENV")


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """A Dockerfile's instructions: (line number, keyword, rest), continuation lines
    joined, comments and blank lines dropped."""
    found: list[tuple[int, str, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(pending).strip()
        pending = []
        keyword, _, rest = joined.partition(" ")
        found.append((start, keyword.upper(), rest.strip()))
    return found


def _from_dockerfile(dockerfile: Path) -> Image:
    name: str | None = None
    workdir: str | None = None
    env: dict[str, str] = {}
    found = _instructions(dockerfile.read_text())
    froms = [rest for _, keyword, rest in found if keyword == "FROM"]
    if len(froms) > 1 or any(keyword not in _PLAIN for _, keyword, _ in found):
        return Image("", dockerfile=dockerfile)  # built by the project's builder
    for number, keyword, rest in found:
        where = f"{dockerfile}:{number}"
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            if name is not None or not words:
                raise refuse(f"{where}: one FROM naming an image is supported (no stages)")
            name = words[0]
        elif keyword == "WORKDIR":
            if not rest.startswith("/"):
                raise refuse(f"{where}: WORKDIR must be an absolute path")
            workdir = rest
        elif keyword == "ENV":
            env.update(_env(rest, where))
    if name is None:
        raise refuse(f"{dockerfile}: no FROM line")
    return Image(name, workdir, env)


def _env(rest: str, where: str) -> dict[str, str]:
    words = shlex.split(rest)
    if len(words) >= 2 and "=" not in words[0]:  # ENV NAME value
        pairs = [(words[0], " ".join(words[1:]))]
    else:
        pairs = [tuple(word.split("=", 1)) for word in words]  # type: ignore[misc]
    env: dict[str, str] = {}
    for pair in pairs:
        if len(pair) != 2 or not _ENV_NAME.match(pair[0]):
            raise refuse(f"{where}: ENV must be NAME=value pairs")
        env[pair[0]] = pair[1]
    return env
