"""The credential proxy of :mod:`orchestrator.credproxy` as a container of one run, on Docker.

One proxy per run holding egress credentials: a container from ``orchestrator/credproxy``
on the run's own internal network (alias ``credproxy``), whose only way out is the run's
allowlist proxy on that same network. Its state (configuration, the values, the run CA's
key) comes read-only from a host folder in memory that only it mounts. It carries the
run's labels and its owner's, so ``gc`` removes it after a crash like the run's container.

Starting one costs about a second (mitmproxy's imports), so a run takes a spare when there
is one (:mod:`orchestrator.docker.credproxy_spares`); the image's own CA bundle, which the
worker's bundle starts from, is read by :mod:`orchestrator.docker.cabundle`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

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
)
from orchestrator.docker import podman
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.docker.netnames import network_name
from orchestrator.docker.seccomp import default_security_opt
from orchestrator.egress import PROXY_LOG_OPTIONS, PROXY_NANO_CPUS, PROXY_NOFILE
from orchestrator.errors import EngineError, ImageMissing
from orchestrator.plan import ContainerSpec

__all__ = [
    "ROLE",
    "ROLE_LABEL",
    "SPARE_ROLE",
    "Spares",
    "host_config",
    "proxy_log",
    "remove_proxy",
    "start_proxy",
]

log = logging.getLogger(__name__)

#: The label value (``io.orchestrator.role``) of a run's credential proxy.
ROLE_LABEL = f"{labels.PREFIX}.role"
ROLE = "credproxy"
#: The label value of a spare proxy (also once a run took it).
SPARE_ROLE = "credproxy-spare"
#: The end of the proxy's log kept while waiting for it (for an error's tail).
_MAX_LOG = 64 << 10


class Spares(Protocol):
    """What a proxy's start needs of the spares
    (:class:`~orchestrator.docker.credproxy_spares.SparePool`)."""

    def wanted(self) -> int:
        """How many spares to keep ready."""

    def take(
        self, engine: DockerClient, spec: ContainerSpec, state: Path, user: str, image: str
    ) -> str | None:
        """A spare of ``image`` taken for the run whose state is ``state``, or None."""

    def undo(self, engine: DockerClient, container: str, state: Path) -> None:
        """Remove a taken spare that failed; the run's state back where it was."""

    def replenish(self, engine: DockerClient, user: str, wanted: int, image: str) -> None:
        """Make spares ready for the next runs, in the background."""


def host_config(engine: DockerClient, network: str, state: Path) -> Any:
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
    engine: DockerClient,
    spec: ContainerSpec,
    state: Path,
    user: str,
    *,
    spares: Spares,
    timeout: float = 30.0,
) -> str:
    """Give the run's credential proxy on its network the state in ``state``: a spare when
    there is one (:meth:`~orchestrator.docker.credproxy_spares.SparePool.take`), else a new
    one; return its id once it accepts connections, and have ``spares`` make a spare ready
    for the next run. On any failure it is removed and EngineError raised (with the end of
    its log, which never holds a value)."""
    deadline = time.monotonic() + timeout
    wanted = spares.wanted()
    container = spares.take(engine, spec, state, user, CREDPROXY_IMAGE)
    if container is not None:
        try:
            _wait_ready(engine, container, deadline)
        except EngineError as exc:  # a spare that died: the run gets a proxy of its own
            log.warning("a spare credential proxy failed (%s); starting one", exc)
            spares.undo(engine, container, state)
            container = None
        except BaseException:
            spares.undo(engine, container, state)
            raise
    if container is None:
        container = _start_new(engine, spec, state, user)
        try:
            _wait_ready(engine, container, deadline)
        except BaseException:
            remove_proxy(engine, container)
            raise
    if wanted:
        spares.replenish(engine, user, wanted, CREDPROXY_IMAGE)
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
                host_config=host_config(engine, network, state),
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
        remove_proxy(engine, container)
        raise
    return container


def remove_proxy(engine: DockerClient, container: str) -> None:
    """Remove a credential proxy container (gone already: nothing to do)."""
    with (
        engine_errors(f"removing the credential proxy {container[:12]}"),
        contextlib.suppress(docker_errors.NotFound),
    ):
        engine.api.remove_container(container, force=True, v=True)


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
