"""Opening and closing a sample's sessions, through the public library API.

One :class:`~orchestrator.Orchestrator` per project in this process; one warm pool per
environment that asks for one (``pool: N``), kept until the task ends; every session the
provider opened and has not closed, so that the task's end can close or keep them.

Each run also gets a writable, size-capped ``/var/tmp`` (a tmpfs: the one thing added to
the worker's plan), where Inspect places the helper its ``bash_session`` and
``text_editor`` tools run; ``tools_tmp: null`` leaves it out.

Blocking (engine calls): the provider calls these from worker threads. No Inspect import.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.config import Worker
from orchestrator.errors import OrchestratorError
from orchestrator.integrations.inspect.config import Environment, Settings
from orchestrator.integrations.projects import orchestrator_for
from orchestrator.integrations.tmpfs import with_tmpfs
from orchestrator.prepare import Prepared
from orchestrator.runner import Orchestrator
from orchestrator.runtime.pool import WarmPool
from orchestrator.runtime.session import Session

log = logging.getLogger(__name__)

__all__ = ["Opened", "close_task", "open_sample"]

#: Where Inspect's injected tools live (their helper goes in a folder below it).
TOOLS_DIR = "/var/tmp"


@dataclass(frozen=True)
class Opened:
    """One environment's live session, and what the provider needs to know of its run."""

    name: str
    session: Session
    workdir: str
    uid: int
    gid: int
    key: str
    image_user: bool = False
    """The run is the image's user's (``image_user``): commands may name any user of it."""


def _tailor(tools_tmp: int | None) -> Callable[[Prepared], Prepared]:
    """What each prepared run of an environment gets: :data:`TOOLS_DIR` (unless
    ``tools_tmp`` is None), for the sessions it opens and its warm pool's runs alike."""

    def tailor(prepared: Prepared) -> Prepared:
        if tools_tmp is None:
            return prepared
        return with_tmpfs(prepared, [(TOOLS_DIR, tools_tmp)])

    return tailor


_lock = threading.Lock()
_pools: dict[tuple[str, str], WarmPool] = {}
_live: dict[str, Opened] = {}


def _orchestrator(settings: Settings) -> Orchestrator:
    return orchestrator_for(settings.project)


def _options(env: Environment) -> dict[str, Any]:
    return {} if env.worker is None or env.trust is None else {"trust": env.trust}


def _worker(settings: Settings, name: str) -> str | Worker:
    """Environment ``name``'s worker; one given a Dockerfile runs the image the project's
    builder makes of it (each ``RUN`` a hardened run under gVisor, cached by content)."""
    dockerfile = settings.dockerfile(name)
    if dockerfile is None:
        return settings.worker(name)
    from orchestrator.build import build_image

    built = build_image(dockerfile.parent, dockerfile=dockerfile, project=settings.project.root)
    return settings.worker(name, image=built.image_id)


def start_pools(settings: Settings) -> None:
    """Open the warm pools the environments ask for (at the task's start)."""
    for name, env in settings.environments:
        if env.pool:
            _pool(settings, name, env)


def _pool(settings: Settings, name: str, env: Environment) -> WarmPool:
    key = (settings.key, name)
    with _lock:
        pool = _pools.get(key)
    if pool is not None:
        return pool
    made = _orchestrator(settings).pool(
        _worker(settings, name), size=env.pool, tailor=_tailor(env.tools_tmp), **_options(env)
    )
    with _lock:
        pool = _pools.setdefault(key, made)
    if pool is not made:  # another sample made it meanwhile
        made.close()
    return pool


def open_sample(settings: Settings) -> list[Opened]:
    """One session per environment, the default first; on failure none is left open."""
    opened: list[Opened] = []
    try:
        for name, env in settings.environments:
            opened.append(_open(settings, name, env))
    except BaseException:
        for item in opened:
            close(item)
        raise
    return opened


def _open(settings: Settings, name: str, env: Environment) -> Opened:
    limits = {"idle_timeout": env.idle_timeout, "max_lifetime": env.max_lifetime}
    if env.pool:
        session = _pool(settings, name, env).open_session(**limits)
    else:
        orch = _orchestrator(settings)
        prepared = _tailor(env.tools_tmp)(orch.prepare(_worker(settings, name), **_options(env)))
        session = orch.open_session(prepared, **limits)
    spec = session.spec
    item = Opened(name, session, spec.workdir, spec.uid, spec.gid, settings.key, spec.image_user)
    with _lock:
        _live[session.id] = item
    return item


def close(item: Opened) -> None:
    """Close one session (staging its outbox, removing its container); never raises for
    the orchestrator's own failures, which are logged (``orchestrator gc`` removes what
    is left)."""
    with _lock:
        _live.pop(item.session.id, None)
    try:
        item.session.close()
    except (OrchestratorError, OSError) as exc:
        log.warning("closing the sandbox %s (session %s) failed: %s", item.name, item.session.id,
                    exc)  # fmt: skip


def close_task(settings: Settings, *, cleanup: bool) -> list[Opened]:
    """The task's end: close its warm pools; close the sessions still open, or with
    ``cleanup`` False keep them (detached, for ``orchestrator gc``). What was kept."""
    with _lock:
        pools = [pool for (key, _), pool in _pools.items() if key == settings.key]
        for key in [k for k in _pools if k[0] == settings.key]:
            del _pools[key]
        left = [item for item in _live.values() if item.key == settings.key]
    for pool in pools:
        pool.close()
    kept: list[Opened] = []
    for item in left:
        if cleanup:
            close(item)
            continue
        with _lock:
            _live.pop(item.session.id, None)
        try:
            item.session.detach()
        except OrchestratorError:
            continue  # closed meanwhile (its idle timeout): nothing to keep
        kept.append(item)
    return kept
