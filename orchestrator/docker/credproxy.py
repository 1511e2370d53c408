"""The credential proxy of :mod:`orchestrator.credproxy` as a container of one run, on Docker.

One proxy per run holding egress credentials: a container from ``orchestrator/credproxy``
on the run's own internal network (alias ``credproxy``), whose only way out is the run's
allowlist proxy on that same network. Its state (configuration, the values, the run CA's
key) comes read-only from a host folder in memory that only it mounts. It carries the
run's labels and its owner's, so ``gc`` removes it after a crash like the run's container.
Also here: reading an image's own CA bundle, which the worker's bundle starts from (once
per image: kept by image id in memory and in the user's cache folder).
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import docker.types
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.credproxy import (
    CREDPROXY_ALIAS,
    CREDPROXY_IMAGE,
    CREDPROXY_MEMORY,
    CREDPROXY_PIDS,
    CREDPROXY_TMP_SIZE,
    READY_MARK,
    STATE_DIR,
    WORKER_BUNDLE,
)
from orchestrator.docker import podman
from orchestrator.docker.cache import user_cache
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.docker.netnames import network_name
from orchestrator.docker.seccomp import default_security_opt
from orchestrator.egress import PROXY_LOG_OPTIONS, PROXY_NANO_CPUS, PROXY_NOFILE
from orchestrator.errors import EngineError, ImageMissing
from orchestrator.plan import ContainerSpec

__all__ = ["ROLE", "image_bundle", "proxy_log", "start_proxy"]

#: The label value (``io.orchestrator.role``) of a run's credential proxy.
ROLE_LABEL = f"{labels.PREFIX}.role"
ROLE = "credproxy"
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


def start_proxy(
    engine: DockerClient, spec: ContainerSpec, state: Path, user: str, *, timeout: float = 30.0
) -> str:
    """Create and start the run's credential proxy on its network; return its id once it
    accepts connections. On any failure it is removed and EngineError raised (with the
    end of its log, which never holds a value)."""
    network = network_name(spec)
    host_config = engine.api.create_host_config(
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
                host_config=host_config,
                networking_config=networking,
                use_config_proxy=False,
            )
        except docker_errors.ImageNotFound:
            raise ImageMissing(CREDPROXY_IMAGE) from None
    container = str(created["Id"])
    try:
        with engine_errors(f"starting the credential proxy {name}"):
            retrying(lambda: engine.api.start(container))
        _wait_ready(engine, container, time.monotonic() + timeout)
    except BaseException:
        with (
            engine_errors(f"removing the credential proxy {name}"),
            contextlib.suppress(docker_errors.NotFound),
        ):
            engine.api.remove_container(container, force=True, v=True)
        raise
    return container


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
