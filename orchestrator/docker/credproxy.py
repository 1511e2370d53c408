"""The credential proxy of :mod:`orchestrator.credproxy` as a container of one run, on Docker.

One proxy per run holding egress credentials: a container from ``orchestrator/credproxy``
on the run's own internal network (alias ``credproxy``), whose only way out is the run's
allowlist proxy on that same network. Its state (configuration, the values, the run CA's
key) comes read-only from a host folder in memory that only it mounts. It carries the
run's labels and its owner's, so ``gc`` removes it after a crash like the run's container.

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

Also here: reading an image's own CA bundle, which the worker's bundle starts from (once
per image: kept by image id in memory and in the user's cache folder).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker.types
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.credproxy import (
    CONFIG_NAME,
    CREDPROXY_ALIAS,
    CREDPROXY_IMAGE,
    CREDPROXY_MEMORY,
    CREDPROXY_PIDS,
    CREDPROXY_TMP_SIZE,
    READY_MARK,
    STATE_DIR,
    WORKER_BUNDLE,
    proxy_ids,
)
from orchestrator.docker import podman
from orchestrator.docker.cache import user_cache
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.docker.netnames import network_name
from orchestrator.docker.seccomp import default_security_opt
from orchestrator.egress import PROXY_LOG_OPTIONS, PROXY_NANO_CPUS, PROXY_NOFILE
from orchestrator.errors import EngineError, ImageMissing, OrchestratorError
from orchestrator.plan import ContainerSpec
from orchestrator.policy.grant import SECRETS_PREFIX
from orchestrator.runtime.secrets import folder_owner

__all__ = [
    "ROLE",
    "SPARE_ROLE",
    "image_bundle",
    "owner_labels",
    "proxy_log",
    "remove_spares",
    "start_proxy",
    "wait_for_spares",
]

log = logging.getLogger(__name__)

#: The label value (``io.orchestrator.role``) of a run's credential proxy.
ROLE_LABEL = f"{labels.PREFIX}.role"
ROLE = "credproxy"
#: The label value of a spare proxy (also once a run took it).
SPARE_ROLE = "credproxy-spare"
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
#: The largest CA bundle read from an image.
_MAX_BUNDLE = 4 << 20
#: The end of the proxy's log kept while waiting for it (for an error's tail).
_MAX_LOG = 64 << 10
#: Bundles already read, by image id (an image's files never change).
_BUNDLES: dict[str, bytes] = {}


def image_bundle(engine: DockerClient, image: str) -> bytes:
    """The system CA bundle inside ``image`` (empty when it has none), read from a
    container created, never started, and removed."""
    with engine_errors(f"inspecting image {image}"):
        try:
            image_id = str(engine.api.inspect_image(image)["Id"])  # type: ignore[no-untyped-call]
        except docker_errors.ImageNotFound:
            raise ImageMissing(image) from None
    if image_id in _BUNDLES:
        return _BUNDLES[image_id]
    cached = _cached_bundle(image_id)
    if cached is not None:
        _BUNDLES[image_id] = cached
        return cached
    with engine_errors(f"reading the CA bundle of {image}"):
        created = engine.api.create_container(
            image_id,
            command=["/nonexistent"],
            labels=engine.labels_for({ROLE_LABEL: "ca-reader"}),
            network_disabled=True,
            host_config=engine.api.create_host_config(network_mode="none"),
        )
        try:
            try:
                stream, _ = engine.api.get_archive(created["Id"], WORKER_BUNDLE)
                raw = b"".join(stream)
            except docker_errors.NotFound:
                raw = b""
        finally:
            retrying(lambda: engine.api.remove_container(created["Id"], force=True))
    bundle = _member(raw)
    _BUNDLES[image_id] = bundle
    _cache_bundle(image_id, bundle)
    return bundle


def _cache_file(image_id: str) -> Path | None:
    """The cache file of an image id (a content hash: its files never change), in a folder
    only this user may write; None when there is no such folder."""
    digest = image_id.removeprefix("sha256:")
    if not digest.isalnum():
        return None
    folder = user_cache("ca-bundles")
    return None if folder is None else folder / f"{digest}.pem"


def _cached_bundle(image_id: str) -> bytes | None:
    """A bundle read by an earlier process (a regular file of this user), else None."""
    path = _cache_file(image_id)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return None
        return handle.read(_MAX_BUNDLE + 1)[:_MAX_BUNDLE]


def _cache_bundle(image_id: str, bundle: bytes) -> None:
    """Keep a bundle for the next process (best effort: written whole, then renamed)."""
    path = _cache_file(image_id)
    if path is None:
        return
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".bundle-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(bundle)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _member(archive: bytes) -> bytes:
    """The one regular file in a ``get_archive`` tar stream (a link: its target is not
    followed; empty)."""
    if not archive:
        return b""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar:
            if member.isfile() and member.size <= _MAX_BUNDLE:
                handle = tar.extractfile(member)
                return handle.read() if handle is not None else b""
    return b""


def _host_config(engine: DockerClient, network: str, state: Path) -> Any:
    """How a credential proxy runs: read-only, no capabilities, capped, its state mounted."""
    return engine.api.create_host_config(
        network_mode=network,
        binds={str(state): {"bind": STATE_DIR, "mode": "ro"}},
        read_only=True,
        cap_drop=["ALL"],
        security_opt=podman.security_opt_for(engine, default_security_opt()),
        tmpfs={"/tmp": f"rw,nosuid,nodev,noexec,size={CREDPROXY_TMP_SIZE >> 20}m,mode=0700"},
        mem_limit=CREDPROXY_MEMORY,
        memswap_limit=CREDPROXY_MEMORY,
        pids_limit=CREDPROXY_PIDS,
        nano_cpus=PROXY_NANO_CPUS,
        init=True,
        ipc_mode="private",
        ulimits=[
            docker.types.Ulimit(name="nofile", soft=PROXY_NOFILE, hard=PROXY_NOFILE),
            docker.types.Ulimit(name="core", soft=0, hard=0),
        ],
        log_config=docker.types.LogConfig(type="json-file", config=dict(PROXY_LOG_OPTIONS)),
    )


def start_proxy(
    engine: DockerClient, spec: ContainerSpec, state: Path, user: str, *, timeout: float = 30.0
) -> str:
    """Give the run's credential proxy on its network the state in ``state``: a spare when
    there is one (:func:`_take_spare`), else a new one; return its id once it accepts
    connections, and make a spare ready for the next run. On any failure it is removed and
    EngineError raised (with the end of its log, which never holds a value)."""
    deadline = time.monotonic() + timeout
    wanted = spares_wanted()
    container = _take_spare(engine, spec, state, user)
    if container is not None:
        try:
            _wait_ready(engine, container, deadline)
        except EngineError as exc:  # a spare that died: the run gets a proxy of its own
            log.warning("a spare credential proxy failed (%s); starting one", exc)
            _undo_take(engine, container, state)
            container = None
        except BaseException:
            _undo_take(engine, container, state)
            raise
    if container is None:
        container = _start_new(engine, spec, state, user)
        try:
            _wait_ready(engine, container, deadline)
        except BaseException:
            _remove(engine, container)
            raise
    if wanted:
        _replenish(engine, user, wanted)
    return container


def _start_new(engine: DockerClient, spec: ContainerSpec, state: Path, user: str) -> str:
    """Create and start a proxy for this run on its network (no spare at hand)."""
    network = network_name(spec)
    networking = engine.api.create_networking_config(
        {network: engine.api.create_endpoint_config(aliases=[CREDPROXY_ALIAS])}  # type: ignore[arg-type]
    )
    run_labels = {labels.RUN_ID: spec.run_id, labels.WORKER: spec.worker, ROLE_LABEL: ROLE}
    name = f"orchestrator-credproxy-{spec.run_id}"
    with engine_errors(f"creating the credential proxy {name}"):
        try:
            created = engine.api.create_container(
                image=CREDPROXY_IMAGE,
                name=name,
                user=user,
                labels=engine.labels_for(run_labels),
                host_config=_host_config(engine, network, state),
                networking_config=networking,
                use_config_proxy=False,
            )
        except docker_errors.ImageNotFound:
            raise ImageMissing(CREDPROXY_IMAGE) from None
    container = str(created["Id"])
    try:
        with engine_errors(f"starting the credential proxy {name}"):
            retrying(lambda: engine.api.start(container))
    except BaseException:
        _remove(engine, container)
        raise
    return container


def _remove(engine: DockerClient, container: str) -> None:
    with (
        engine_errors(f"removing the credential proxy {container[:12]}"),
        contextlib.suppress(docker_errors.NotFound),
    ):
        engine.api.remove_container(container, force=True, v=True)


# -- spares ----------------------------------------------------------------------------------


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


def _takeable(engine: DockerClient, user: str) -> list[dict[str, Any]]:
    """Free, running spares of the current proxy image, for ``user``, young enough."""
    with engine_errors(f"inspecting image {CREDPROXY_IMAGE}"):
        try:
            image_id = engine.api.inspect_image(CREDPROXY_IMAGE)["Id"]  # type: ignore[no-untyped-call]
        except docker_errors.ImageNotFound:
            raise ImageMissing(CREDPROXY_IMAGE) from None
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


def _take_spare(engine: DockerClient, spec: ContainerSpec, state: Path, user: str) -> str | None:
    """Take a spare for this run: claim its folder (moved into the run's own state folder,
    where nobody else can act on it), name the container after the run's state folder
    (from then on gc judges it as the run's: before any value is in it), move the run's
    state in, attach it to the run's network. None when there is none to take (or taking
    one failed: the caller starts a new proxy, and a half-taken spare is removed)."""
    for spare in _takeable(engine, user):
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
            _undo_take(engine, container, state)
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


def _undo_take(engine: DockerClient, container: str, state: Path) -> None:
    """Remove a half-taken spare and put the run's state back where it was."""
    try:
        _remove(engine, container)
    finally:
        claimed = state / _TAKEN
        if claimed.is_dir() and not claimed.is_symlink():
            for entry in claimed.iterdir():
                os.rename(entry, state / entry.name)
            shutil.rmtree(claimed, ignore_errors=True)


def _attach(engine: DockerClient, container: str, spec: ContainerSpec, *, detach: bool) -> None:
    """The taken spare: into the run's network as ``credproxy`` (out of ``none`` first if
    it still is in it; a spare leaves it once started, see :func:`_start_spare`)."""
    with engine_errors("attaching a spare credential proxy to the run's network"):
        if detach:
            engine.api.disconnect_container_from_network(container, "none")
        engine.api.connect_container_to_network(
            container, network_name(spec), aliases=[CREDPROXY_ALIAS]
        )


def owner_labels(name: str, found: Mapping[str, str]) -> dict[str, str]:
    """The labels ``gc`` judges a spare container by: a taken one is its run's (owned by
    the process its name says, in the pid namespace it was made and taken in, with its
    run's id, see :func:`_take_spare`); a free one is shared (no owner)."""
    taken = name.removeprefix(TAKEN_PREFIX)
    if found.get(ROLE_LABEL) != SPARE_ROLE or not taken.startswith(SECRETS_PREFIX):
        return dict(found)
    owned = {k: v for k, v in found.items() if k != labels.SHARED}
    run_id = taken.removesuffix("-credproxy").split("-", 4)[-1]  # prefix, pid, start, run
    owner = {**folder_owner(taken), labels.OWNER_NS: found.get(_NS_LABEL, "")}
    return {**owned, **owner, labels.RUN_ID: run_id}


_STARTING: list[threading.Thread] = []
_STARTING_LOCK = threading.Lock()


def _replenish(engine: DockerClient, user: str, wanted: int) -> None:
    """Make spares ready for the next runs, in the background (the run goes on)."""
    thread = threading.Thread(
        target=_keep_ready, args=(engine, user, wanted), name="credproxy-spare"
    )
    with _STARTING_LOCK:
        _STARTING[:] = [t for t in _STARTING if t.is_alive()]
        if _STARTING:
            return  # one at a time per process
        _STARTING.append(thread)
    thread.start()


def wait_for_spares() -> None:
    """Wait until this process's spares being made are made (tests, before cleaning up)."""
    with _STARTING_LOCK:
        starting = list(_STARTING)
    for thread in starting:
        thread.join()


def _keep_ready(engine: DockerClient, user: str, wanted: int) -> None:
    try:
        remove_spares(engine, _SPARE_MAX_AGE_S)
        for _ in range(wanted - len(_takeable(engine, user))):
            _start_spare(engine, user)
    except (OrchestratorError, OSError) as exc:
        log.warning("could not make a spare credential proxy ready: %s", exc)


def _start_spare(engine: DockerClient, user: str) -> None:
    """Start a spare: an empty state folder in memory, no network, mitmproxy imported."""
    name = f"{SPARE_PREFIX}{secrets.token_hex(8)}"
    folder = _SHM / name
    folder.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(folder, *proxy_ids())
    spare_labels = {
        labels.MANAGED: "true",
        labels.SHARED: "true",
        ROLE_LABEL: SPARE_ROLE,
        SPARE_STATE_LABEL: str(folder),
        _USER_LABEL: user,
        _NS_LABEL: labels.current_owner().pid_ns,
        _MAKER_LABEL: str(os.getpid()),
    }
    try:
        with engine_errors(f"starting the spare credential proxy {name}"):
            created = engine.api.create_container(
                image=CREDPROXY_IMAGE,
                name=name,
                user=user,
                labels=spare_labels,
                environment={"CREDPROXY_SPARE_IDLE": str(SPARE_IDLE_S)},
                host_config=_host_config(engine, "none", folder),
                use_config_proxy=False,
            )
            try:
                retrying(lambda: engine.api.start(created["Id"]))
                # Out of ``none`` now (it keeps its loopback only): taking it then needs one
                # engine call less, the attach to the run's network.
                engine.api.disconnect_container_from_network(created["Id"], "none")
            except BaseException:
                _remove(engine, str(created["Id"]))
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
        _remove(engine, str(spare["Id"]))
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


def _wait_ready(engine: DockerClient, container: str, deadline: float) -> None:
    """Follow the proxy's log until it says it accepts connections: the engine pushes each
    line as it is written, so the wait ends with the line (no poll interval). The log ends
    when the proxy exits, and is closed at ``deadline``: both are errors (fail closed)."""
    with engine_errors("reading the credential proxy's log"):
        stream = engine.api.logs(container, stdout=True, stderr=True, stream=True, follow=True)
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), stream.close)
    timer.daemon = True
    timer.start()
    seen = b""
    try:
        for chunk in stream:
            seen = (seen + chunk)[-_MAX_LOG:]
            if READY_MARK in seen:
                return
    except (OSError, ValueError, AttributeError, docker_errors.DockerException):
        pass  # closed at the deadline (the socket goes away under the reader)
    finally:
        timer.cancel()
        stream.close()
    with engine_errors("inspecting the credential proxy"):
        state: dict[str, Any] = engine.api.inspect_container(container)["State"]
    if state.get("Status") in ("exited", "dead"):
        tail = "\n".join(seen.decode(errors="replace").splitlines()[-15:])
        raise EngineError(
            f"the credential proxy {container[:12]} exited with code "
            f"{state.get('ExitCode')} before accepting connections; no worker starts "
            f"without it:\n{tail}"
        )
    raise EngineError(
        f"the credential proxy {container[:12]} did not accept connections in time; "
        "no worker starts without it"
    )


def proxy_log(engine: DockerClient, container: str) -> str:
    """The credential proxy's log (its event lines among mitmproxy's own)."""
    with engine_errors("reading the credential proxy's events"):
        try:
            raw: bytes = engine.api.logs(container, stdout=True, stderr=False)
        except docker_errors.NotFound:
            return ""
    return raw.decode(errors="replace")
