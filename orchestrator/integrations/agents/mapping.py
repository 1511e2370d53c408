"""What an agents-SDK sandbox asks for, as this project's declarations; pure (no SDK
import, no engine).

- **The worker.** A worker file (by name in the project's workers folder, or a path to a
  ``.worker`` file), or a worker described inline with the same fields as the Inspect
  provider's (:class:`~orchestrator.integrations.inspect.config.Environment`): image,
  zones, network, resources, isolation, env, trust. Its network, zones, limits and
  isolation are the project's to allow; nothing the SDK sends widens them.
- **The workspace** (the manifest's ``root``, ``/workspace`` by default) is where commands
  run and relative paths resolve. A folder the worker can already write (a ``rw`` zone,
  ``/tmp``) is used as it is; otherwise it becomes a tmpfs of the run's own, owned by the
  worker, counted in its memory limit. Inside a read-only zone it is refused.
- **Refused** (one line each): exposing ports, manifest users or groups (the SDK's
  ``run_as``: a worker runs as its own uid only, no accounts are made), mount entries
  (they need FUSE and ``SYS_ADMIN``, which a worker never gets), path grants with a
  ``host_path`` (host folders are zones). Path grants without one only widen the SDK's
  own checks of file paths; what the worker may do there is the container's to say.

Every refusal is a :class:`~orchestrator.errors.ConfigError` of one problem.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.config import Project, Worker
from orchestrator.errors import ConfigError
from orchestrator.integrations.inspect.config import Environment
from orchestrator.integrations.tmpfs import read_only_at, writable
from orchestrator.plan import ContainerSpec

__all__ = [
    "INLINE_NAME",
    "PREFIX",
    "WORKER_FIELDS",
    "environment_of",
    "refusals",
    "refuse",
    "user_allowed",
    "worker_of",
    "workspace_tmpfs",
]

#: How refusals start.
PREFIX = "orchestrator sandbox: "
#: The worker's name when it is described inline.
INLINE_NAME = "agents-sandbox"
#: The options that describe (or name) the worker; the same as an Inspect environment's.
WORKER_FIELDS = ("worker", "image", "zones", "network", "resources", "isolation", "env", "trust")


def refuse(message: str) -> ConfigError:
    """The one-line refusal (the sandbox's name said first)."""
    return ConfigError([message if message.startswith(PREFIX) else PREFIX + message])


def environment_of(fields: Mapping[str, Any]) -> Environment:
    """The worker the options name or describe (only :data:`WORKER_FIELDS`, unset ones
    left out); a wrong value is one line naming the field."""
    given = {name: fields[name] for name in WORKER_FIELDS if fields.get(name) is not None}
    try:
        return Environment.model_validate({**given, "tools_tmp": None, "max_lifetime": None})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "options"
        raise refuse(f"{where}: {first['msg']}") from None


def worker_of(env: Environment, project: Project, cwd: Path) -> str | Worker:
    """What :meth:`orchestrator.Orchestrator.prepare` takes for ``env``: a worker's name, a
    worker file's absolute path (relative ones against ``cwd``), or the inline worker."""
    if env.worker is None:
        return env.inline_worker(INLINE_NAME, project.file)
    spec = env.worker
    if "/" in spec or spec.endswith(".worker"):
        return str((cwd / spec).resolve())
    return spec


def refusals(
    *,
    exposed_ports: Sequence[int],
    users: Sequence[str],
    groups: Sequence[str],
    mounts: Sequence[str],
    host_grants: Sequence[str] = (),
    root: str,
) -> list[str]:
    """What a sandbox asks for that this project does not do, one line each."""
    problems: list[str] = []
    if exposed_ports:
        problems.append(
            f"exposed_ports {list(exposed_ports)}: not supported; a worker's container "
            "publishes no ports (its network is none, an allowlist through the egress proxy, "
            "or the project's own network)"
        )
    if users or groups:
        names = [*users, *(f"group {g}" for g in groups)]
        problems.append(
            f"manifest users/groups ({', '.join(names)}; run_as adds one): not supported; a "
            "worker runs as its own uid only, with no capability to make accounts or switch "
            "users: leave run_as unset"
        )
    if mounts:
        problems.append(
            f"mount entries ({', '.join(mounts)}): not supported; they need FUSE and "
            "SYS_ADMIN, which a worker never gets: give the data as a zone of the project"
        )
    if host_grants:
        problems.append(
            f"extra_path_grants with host_path ({', '.join(host_grants)}): not supported; "
            "host folders reach a worker only as the project's zones, with their modes"
        )
    if not posixpath.isabs(root) or posixpath.normpath(root) in ("/", "//"):
        problems.append(
            f"manifest root {root!r}: give an absolute folder other than / (default /workspace)"
        )
    return problems


def workspace_tmpfs(spec: ContainerSpec, root: str) -> bool:
    """Whether the workspace ``root`` needs a tmpfs of its own (the worker cannot write it
    yet); refused inside a read-only zone or masked folder."""
    root = posixpath.normpath(root)
    if writable(spec, root):
        return False
    blocked = read_only_at(spec, root)
    if blocked is not None:
        raise refuse(
            f"manifest root {root}: inside {blocked}, which this worker has read-only; "
            "choose another root (default /workspace) or give the worker that zone rw"
        )
    return True


def user_allowed(user: str | None, uid: int, gid: int) -> bool:
    """Whether a command may run as ``user``: none given, or the worker's own uid."""
    return user is None or user in (str(uid), f"{uid}:{gid}")
