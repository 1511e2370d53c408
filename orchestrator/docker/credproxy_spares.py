"""Spare credential proxies: started ahead of need, taken by a run at its start.

Starting one costs about a second (mitmproxy's imports), so a run takes a *spare* when
there is one: a proxy started earlier, with no network (started in ``none``, then taken out
of it: loopback only) and an empty state folder, that has imported everything and waits
(``CREDPROXY_SPARE_IDLE``). Taking it is atomic across processes (its folder is renamed
away: one taker wins); the container is then renamed after the run's state folder, which
names its owner (before any value is in it), the run's state is moved in (config.json
last) and the spare attached to the run's network: from then on it is the run's proxy
and ``gc`` treats it as the run's (:func:`owner_labels`). A spare holds nothing before it
is taken and serves one run only. After each start one spare is made ready for the next
run (``ORCHESTRATOR_CREDPROXY_SPARES``: how many, 0: make none); an untaken spare exits
by itself after :data:`SPARE_IDLE_S`, and ``gc`` removes it then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.credproxy import CONFIG_NAME, CREDPROXY_ALIAS, CREDPROXY_IMAGE, proxy_ids
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.docker.credproxy import ROLE_LABEL, SPARE_ROLE, host_config, remove_proxy
from orchestrator.docker.netnames import network_name
from orchestrator.errors import ImageMissing, OrchestratorError
from orchestrator.plan import ContainerSpec
from orchestrator.policy.grant import SECRETS_PREFIX
from orchestrator.runtime.secrets import folder_owner

__all__ = [
    "ENV_SPARES",
    "SPARE_PREFIX",
    "SPARE_STATE_LABEL",
    "TAKEN_PREFIX",
    "SparePool",
    "owner_labels",
    "remove_spares",
    "spares_wanted",
    "take_spare",
    "undo_take",
]

log = logging.getLogger(__name__)

#: The label holding a spare's host state folder (until a run takes it).
SPARE_STATE_LABEL = f"{labels.PREFIX}.credproxy-state"
#: The label holding the user a spare runs as (a run takes only one of its own user).
_USER_LABEL = f"{labels.PREFIX}.credproxy-user"
#: The label holding the pid namespace of the process that made a spare: a spare is taken
#: (and then judged by gc) only in that namespace, where its taker's pid means something.
_NS_LABEL = f"{labels.PREFIX}.credproxy-pidns"
#: The label holding the pid of the process that made a spare (for cleaning up after tests).
_MAKER_LABEL = f"{labels.PREFIX}.credproxy-made-by"
#: The name of a spare (its container and its state folder in /dev/shm) before it is taken.
SPARE_PREFIX = "orchestrator-credproxy-spare-"
#: The name of a taken spare: this, then its run's state folder's name (its owner's).
TAKEN_PREFIX = "orchestrator-credproxy-"
#: The environment variable saying how many spares to keep ready (default 1, 0: none).
ENV_SPARES = "ORCHESTRATOR_CREDPROXY_SPARES"
#: How long a spare waits for a run before it exits by itself.
SPARE_IDLE_S = 600
#: A spare this old is not taken any more (it could exit while being taken).
_SPARE_MAX_AGE_S = SPARE_IDLE_S - 60
_SHM = Path("/dev/shm")


class SparePool:
    """This process's part in the pool of spares: it makes spares ready for the next runs
    in the background, one at a time (:meth:`replenish`), and can wait for them
    (:meth:`wait`). The pool itself is the engine's containers, shared by every process
    of the user (taking one is atomic across processes: :meth:`take`)."""

    def __init__(self) -> None:
        self._starting: list[threading.Thread] = []
        self._lock = threading.Lock()

    @staticmethod
    def wanted() -> int:
        """How many spares to keep ready (:func:`spares_wanted`)."""
        return spares_wanted()

    @staticmethod
    def take(
        engine: DockerClient, spec: ContainerSpec, state: Path, user: str, image: str
    ) -> str | None:
        """A spare of ``image`` taken for this run, or None (:func:`take_spare`)."""
        return take_spare(engine, spec, state, user, image)

    @staticmethod
    def undo(engine: DockerClient, container: str, state: Path) -> None:
        """Remove a taken spare that failed; the run's state back (:func:`undo_take`)."""
        undo_take(engine, container, state)

    def replenish(self, engine: DockerClient, user: str, wanted: int, image: str) -> None:
        """Make spares ready for the next runs, in the background (the run goes on)."""
        thread = threading.Thread(
            target=self.keep_ready, args=(engine, user, wanted, image), name="credproxy-spare"
        )
        with self._lock:
            self._starting[:] = [t for t in self._starting if t.is_alive()]
            if self._starting:
                return  # one at a time per process
            self._starting.append(thread)
        thread.start()

    def wait(self) -> None:
        """Wait until the spares being made are made (tests, before cleaning up)."""
        with self._lock:
            starting = list(self._starting)
        for thread in starting:
            thread.join()

    @staticmethod
    def keep_ready(
        engine: DockerClient, user: str, wanted: int, image: str = CREDPROXY_IMAGE
    ) -> None:
        """Remove old free spares, then start spares until ``wanted`` are ready."""
        try:
            remove_spares(engine, _SPARE_MAX_AGE_S)
            for _ in range(wanted - len(_takeable(engine, user, image))):
                _start_spare(engine, user, image)
        except (OrchestratorError, OSError) as exc:
            log.warning("could not make a spare credential proxy ready: %s", exc)


def spares_wanted() -> int:
    """How many spares to keep ready (``ORCHESTRATOR_CREDPROXY_SPARES``, default 1; with
    0, a run still takes one that is there, and makes none)."""
    text = os.environ.get(ENV_SPARES, "1").strip()
    if not text.isdigit() or int(text) > 8:
        raise OrchestratorError(
            f"{ENV_SPARES}={text!r}: say how many spare credential proxies to keep ready, "
            "a whole number from 0 (none) to 8"
        )
    return int(text)


def _spares(engine: DockerClient) -> list[dict[str, Any]]:
    """Every spare container (running or not, taken or not), newest first."""
    with engine_errors("listing spare credential proxies"):
        found = engine.api.containers(all=True, filters={"label": f"{ROLE_LABEL}={SPARE_ROLE}"})
    return sorted(found, key=lambda c: -int(c.get("Created") or 0))


def _is_free(spare: Mapping[str, Any]) -> bool:
    """A spare no run took (its name still a spare's)."""
    name = str((spare.get("Names") or [""])[0]).lstrip("/")
    return name.startswith(SPARE_PREFIX)


def _takeable(engine: DockerClient, user: str, image: str) -> list[dict[str, Any]]:
    """Free, running spares of the proxy image ``image``, for ``user``, young enough."""
    with engine_errors(f"inspecting image {image}"):
        try:
            image_id = engine.api.inspect_image(image)["Id"]  # type: ignore[no-untyped-call]
        except docker_errors.ImageNotFound:
            raise ImageMissing(image) from None
    oldest = time.time() - _SPARE_MAX_AGE_S
    return [
        c
        for c in _spares(engine)
        if _is_free(c)
        and c.get("State") == "running"
        and c.get("ImageID") == image_id
        and (c.get("Labels") or {}).get(_USER_LABEL) == user
        and (c.get("Labels") or {}).get(_NS_LABEL) == labels.current_owner().pid_ns
        and int(c.get("Created") or 0) > oldest
    ]


def take_spare(
    engine: DockerClient, spec: ContainerSpec, state: Path, user: str, image: str
) -> str | None:
    """Take a spare for this run: claim its folder (moved into the run's own state folder,
    where nobody else can act on it), name the container after the run's state folder
    (from then on gc judges it as the run's: before any value is in it), move the run's
    state in, attach it to the run's network. None when there is none to take (or taking
    one failed: the caller starts a new proxy, and a half-taken spare is removed)."""
    for spare in _takeable(engine, user, image):
        folder = Path((spare.get("Labels") or {}).get(SPARE_STATE_LABEL, ""))
        if folder.parent != _SHM or not folder.name.startswith(SPARE_PREFIX):
            continue
        try:
            os.rename(folder, state / _TAKEN)  # the claim: only one taker's rename finds it
        except OSError:
            continue
        container = str(spare["Id"])
        try:
            with engine_errors("taking a spare credential proxy"):  # the run's, for gc
                engine.api.rename(container, TAKEN_PREFIX + state.name)
            _hand_over(state)  # it starts reading while its network is attached
            networks = (spare.get("NetworkSettings") or {}).get("Networks") or {}
            _attach(engine, container, spec, detach="none" in networks)
        except (OSError, OrchestratorError) as exc:
            log.warning("could not take a spare credential proxy (%s); starting one", exc)
            undo_take(engine, container, state)
            return None
        return container
    return None


#: The claimed spare's folder, inside the run's state folder (its bind source since the
#: spare started: the mount follows the folder).
_TAKEN = "spare"


def _hand_over(state: Path) -> None:
    """Move the run's state files into the claimed spare's folder (the configuration last:
    the spare starts reading when it appears)."""
    claimed = state / _TAKEN
    info = os.lstat(claimed)
    owners = {os.getuid(), proxy_ids()[0]}
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in owners or any(claimed.iterdir()):
        raise OSError(f"{claimed} is not an empty spare folder of this user")
    names = sorted(entry.name for entry in state.iterdir() if entry.name != _TAKEN)
    names.sort(key=lambda name: name == CONFIG_NAME)
    for name in names:
        os.rename(state / name, claimed / name)


def undo_take(engine: DockerClient, container: str, state: Path) -> None:
    """Remove a half-taken spare and put the run's state back where it was."""
    try:
        remove_proxy(engine, container)
    finally:
        claimed = state / _TAKEN
        if claimed.is_dir() and not claimed.is_symlink():
            for entry in claimed.iterdir():
                os.rename(entry, state / entry.name)
            shutil.rmtree(claimed, ignore_errors=True)


def _attach(engine: DockerClient, container: str, spec: ContainerSpec, *, detach: bool) -> None:
    """The taken spare: into the run's network as ``credproxy`` (out of ``none`` first if
    it still is in it; a spare leaves it once started, see :meth:`SparePool.keep_ready`)."""
    with engine_errors("attaching a spare credential proxy to the run's network"):
        if detach:
            engine.api.disconnect_container_from_network(container, "none")
        engine.api.connect_container_to_network(
            container, network_name(spec), aliases=[CREDPROXY_ALIAS]
        )


def owner_labels(name: str, found: Mapping[str, str]) -> dict[str, str]:
    """The labels ``gc`` judges a spare container by: a taken one is its run's (owned by
    the process its name says, in the pid namespace it was made and taken in, with its
    run's id, see :func:`take_spare`); a free one is shared (no owner)."""
    taken = name.removeprefix(TAKEN_PREFIX)
    if found.get(ROLE_LABEL) != SPARE_ROLE or not taken.startswith(SECRETS_PREFIX):
        return dict(found)
    owned = {k: v for k, v in found.items() if k != labels.SHARED}
    run_id = taken.removesuffix("-credproxy").split("-", 4)[-1]  # prefix, pid, start, run
    owner = {**folder_owner(taken), labels.OWNER_NS: found.get(_NS_LABEL, "")}
    return {**owned, **owner, labels.RUN_ID: run_id}


def _start_spare(engine: DockerClient, user: str, image: str) -> None:
    """Start a spare: an empty state folder in memory, no network, mitmproxy imported."""
    name = f"{SPARE_PREFIX}{secrets.token_hex(8)}"
    folder = _SHM / name
    folder.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(folder, *proxy_ids())
    spare_labels = labels.explicit({
        labels.MANAGED: "true",
        labels.SHARED: "true",
        ROLE_LABEL: SPARE_ROLE,
        SPARE_STATE_LABEL: str(folder),
        _USER_LABEL: user,
        _NS_LABEL: labels.current_owner().pid_ns,
        _MAKER_LABEL: str(os.getpid()),
    })  # fmt: skip
    try:
        with engine_errors(f"starting the spare credential proxy {name}"):
            created = engine.api.create_container(
                image=image,
                name=name,
                user=user,
                labels=spare_labels,
                environment={"CREDPROXY_SPARE_IDLE": str(SPARE_IDLE_S)},
                host_config=host_config(engine, "none", folder),
                use_config_proxy=False,
            )
            try:
                retrying(lambda: engine.api.start(created["Id"]))
                # Out of ``none`` now (it keeps its loopback only): taking it then needs one
                # engine call less, the attach to the run's network.
                engine.api.disconnect_container_from_network(created["Id"], "none")
            except BaseException:
                remove_proxy(engine, str(created["Id"]))
                raise
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _remove_spare(engine: DockerClient, spare: Mapping[str, Any]) -> bool:
    """Remove a free spare, claiming its folder first as a taker would (so that a spare a
    run is taking at this moment is left to it); whether it was removed."""
    folder = Path((spare.get("Labels") or {}).get(SPARE_STATE_LABEL, ""))
    trash = Path(tempfile.mkdtemp(dir=_SHM, prefix=".orchestrator-spare-gone-"))
    try:
        claimed = False
        if folder.parent == _SHM and folder.name.startswith(SPARE_PREFIX):
            with contextlib.suppress(OSError):
                os.rename(folder, trash / "spare")
                claimed = True
        if not claimed and spare.get("State") == "running":
            return False  # its folder is gone: a run is taking it (it can only be)
        remove_proxy(engine, str(spare["Id"]))
        return True
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def remove_spares(
    engine: DockerClient, idle_seconds: float, *, made_by: int | None = None
) -> list[str]:
    """``gc``'s pass over free spares: remove those that exited or are older than
    ``idle_seconds`` (0: every one), with their folders; return their names. With
    ``made_by`` (a pid): only those that process made, whatever their age."""
    removed = []
    oldest = time.time() - idle_seconds
    spares = _spares(engine)
    for spare in spares:
        created = int(spare.get("Created") or 0)
        if made_by is not None:
            chosen = (spare.get("Labels") or {}).get(_MAKER_LABEL) == str(made_by)
        else:
            chosen = spare.get("State") != "running" or created <= oldest
        if not (_is_free(spare) and chosen):
            continue
        name = str((spare.get("Names") or [""])[0]).lstrip("/")
        try:
            if _remove_spare(engine, spare):
                removed.append(name)
        except (OrchestratorError, OSError) as exc:
            log.warning("could not remove the spare credential proxy %s: %s", name, exc)
    # Folders whose spare is gone (removed by hand, or its start failed half-way): once
    # they are older than a start takes, so that a spare being made keeps its own.
    known = {(c.get("Labels") or {}).get(SPARE_STATE_LABEL) for c in spares}
    leftover = [*_SHM.glob(f"{SPARE_PREFIX}*"), *_SHM.glob(".orchestrator-spare-gone-*")]
    for folder in leftover:
        with contextlib.suppress(OSError):
            if str(folder) not in known and folder.lstat().st_mtime < time.time() - 60:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
    return removed
