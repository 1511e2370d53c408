"""A run's credential proxy, serving before its worker starts and gone before its end.

:class:`CredentialProxy` is a part of the container backend's launch
(:class:`~orchestrator.runtime.container.ContainerLaunch`) for a plan with egress
credentials (``spec.network.credentials``). Once the run's network exists (the launch's
``prepare``) it makes the run's CA (:mod:`orchestrator.runca`), writes the proxy's state
(configuration, each value as a 0400 file, the CA's key) into a private folder in the
host's memory (``/dev/shm``) that only the proxy mounts, writes the worker's CA bundle
(the image's own certificates plus the run's CA) where the plan mounts it, and starts the
proxy through the engine. The proxy's start (its container, mitmproxy's start) runs in the
background while the run goes on and creates the worker's container; the launch's
``create`` waits for it (:meth:`CredentialProxy.ready`) before the worker's container can
start, so nothing of the worker starts unless all of this succeeded (fails closed). The
launch's ``remove`` reads the proxy's events (each substitution and block: the run audits
them), deletes the folder with the values and the key and starts removing the proxy in
the background; its ``release`` waits for that before removing the network.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from orchestrator.credproxy import (
    CA_NAME,
    CONFIG_NAME,
    TRUST_NAME,
    WORKER_BUNDLE,
    CredentialEvent,
    parse_events,
    proxy_config,
    proxy_ids,
    value_file,
)
from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.paths import PathRefused, open_path
from orchestrator.plan import ContainerSpec
from orchestrator.prepare import Prepared
from orchestrator.runca import make_run_ca
from orchestrator.runtime.engine import Containers, CredentialProxies
from orchestrator.runtime.secrets import is_tmpfs

__all__ = ["CredentialProxy", "state_dir"]

log = logging.getLogger(__name__)

#: How long a run whose container idles (a session, a pooled run: work arrives by exec)
#: may wait for work, for its CA's validity: past it, TLS to the bound hosts fails (closed).
KEEP_ALIVE_S = 24 * 3600.0
#: Largest ``trust_ca`` file read (a bundle of CA certificates).
TRUST_LIMIT = 1 << 20


class _Engine(Containers, CredentialProxies, Protocol):
    """What the proxy needs of an engine."""


class CredentialProxy:
    """One run's credential proxy, a part of its container launch: :meth:`start` (the
    launch's prepare), :meth:`ready` (its create, before the worker may start), :meth:`end`
    (its remove: the events), :meth:`removed` (its release, before the network goes)."""

    def __init__(self, engine: _Engine, prepared: Prepared, values: Mapping[str, str]) -> None:
        self.engine = engine
        self.prepared = prepared
        self.values = dict(values)
        self.container: str | None = None
        self._state: Path | None = None
        self._ended = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._removal: threading.Thread | None = None
        self._removal_error: BaseException | None = None

    def start(self) -> None:
        """Check the values, write the proxy's state (in memory, for it only) and the
        worker's CA bundle, and start the proxy in the background. What was written is
        removed by :meth:`end`, also when this fails half-way."""
        engine, spec = self.engine, self.prepared.spec
        bindings = spec.network.credentials
        missing = [b.name for b in bindings if not self.values.get(b.name)]
        if missing:
            raise OrchestratorError(
                f"egress credential(s) {', '.join(missing)} for '{spec.worker}' were not "
                "resolved; check the project's credentials"
            )
        state = state_dir(self.prepared)
        if not is_tmpfs(state.parent):
            raise OrchestratorError(
                f"{state.parent} is not an in-memory filesystem; credential values are only "
                "ever handed to the proxy from memory (mount a tmpfs there)"
            )
        hosts = [host.rpartition(":")[0] for b in bindings for host in b.hosts]
        waits = KEEP_ALIVE_S if spec.supervisor_user is not None else 0.0
        ca = make_run_ca(spec.run_id, hosts, lifetime_s=spec.limits.timeout_s + waits)
        bundle = _bundle_source(spec)
        trust = _trusted(spec.network.trust_ca)
        state.mkdir(mode=0o700)
        self._state = state
        _write(state / CONFIG_NAME, json.dumps(proxy_config(bindings)).encode(), 0o400)
        for index, binding in enumerate(bindings):
            _write(state / value_file(index), self.values[binding.name].encode(), 0o400)
        _write(state / CA_NAME, ca.key + ca.certificate, 0o400)
        if trust:
            _write(state / TRUST_NAME, trust, 0o400)
        uid, gid = proxy_ids()
        if os.geteuid() == 0:
            for entry in (*state.iterdir(), state):
                os.chown(entry, uid, gid)
        user = f"{uid}:{gid}"
        bundle.parent.mkdir(parents=True, exist_ok=True)
        image_bundle = engine.image_ca_bundle(spec.image).rstrip(b"\n")
        _write(bundle, image_bundle + b"\n" + ca.certificate, 0o644)
        self._thread = threading.Thread(
            target=self._start, args=(state, user), name="credproxy-start", daemon=True
        )
        self._thread.start()

    def _start(self, state: Path, user: str) -> None:
        try:
            self.container = self.engine.start_credential_proxy(self.prepared.spec, state, user)
        except BaseException as exc:  # noqa: BLE001 - handed over: ready() raises it
            self._error = exc

    def ready(self) -> None:
        """Return once the proxy accepts connections; raise why it does not (it is gone
        then). Called before the worker's container may start."""
        self._finish()
        if self._error is not None:
            raise self._error

    def _finish(self) -> str | None:
        """Wait for the start to end, however it ends; the proxy's container, if any."""
        if self._thread is not None:
            self._thread.join()
        return self.container

    def end(self) -> list[CredentialEvent]:
        """The proxy's events (each substitution and block, values redacted); its removal
        starts in the background (:meth:`removed` waits for it) and its state is deleted.
        Once: later calls return nothing."""
        if self._ended:
            return []
        self._ended = True
        try:
            container = self._finish()
            if container is None:
                return []
            events = _events(self.engine, container, self.values)
            self._removal = threading.Thread(
                target=self._remove, args=(container,), name="credproxy-remove", daemon=True
            )
            self._removal.start()
            return events
        finally:
            if self._state is not None:
                shutil.rmtree(self._state, ignore_errors=True)

    def _remove(self, container: str) -> None:
        try:
            self.engine.remove(container)
        except BaseException as exc:  # noqa: BLE001 - handed over: removed() raises it
            self._removal_error = exc

    def removed(self) -> None:
        """Return once the proxy is gone (at once if it never started); raise why it could
        not be removed."""
        if self._removal is not None:
            self._removal.join()
            self._removal = None
        error, self._removal_error = self._removal_error, None
        if error is not None:
            raise error


def state_dir(prepared: Prepared) -> Path:
    """The host folder (in memory) holding the proxy's state for this run; named like the
    run's secrets folder, so ``gc`` sweeps it when its orchestrator was killed."""
    secrets = prepared.paths.secrets_dir
    return secrets.with_name(secrets.name + "-credproxy")


def _bundle_source(spec: ContainerSpec) -> Path:
    found = next((m.source for m in spec.mounts if m.target == WORKER_BUNDLE), None)
    if found is None:
        raise OrchestratorError(
            f"the plan of '{spec.worker}' has egress credentials but no CA bundle mount; "
            "rebuild the plan"
        )
    return Path(found)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def read_cas(paths: list[str], field: str) -> bytes:
    """PEM CA certificate files named in the project file under ``field`` (a policy file
    each, read without following a link); one clear error naming the file otherwise."""
    return _trusted(paths, field)


def _trusted(paths: list[str], field: str = "network.trust_ca") -> bytes:
    """The extra upstream CAs (``network.trust_ca``; ``build.ca``'s too), each a PEM
    certificate file, read without following a link (a policy file: see
    ``grant.policy_paths``)."""
    found = b""
    for name in paths:
        try:
            held = open_path(Path(name), file_ok=True)
            try:
                with open(f"/proc/self/fd/{held}", "rb") as handle:
                    data = handle.read(TRUST_LIMIT + 1)
            finally:
                os.close(held)
        except PathRefused as refused:
            raise OrchestratorError(
                f"{field}: cannot read {name}: {refused.reason}; name the real path "
                "of the certificate in the project file"
            ) from None
        except OSError as exc:
            raise OrchestratorError(
                f"{field}: cannot read {name}: {exc.strerror}; fix the path in the project file"
            ) from None
        if (
            len(data) > TRUST_LIMIT
            or b"-----BEGIN CERTIFICATE-----" not in data
            or b"PRIVATE KEY" in data
        ):
            raise OrchestratorError(
                f"{field}: {name} is not a PEM certificate (or holds a key); "
                "name the CA's certificate only"
            )
        found += data.rstrip(b"\n") + b"\n"
    return found


def _events(engine: _Engine, container: str, values: Mapping[str, str]) -> list[CredentialEvent]:
    try:
        text = engine.credential_proxy_log(container)
    except OrchestratorError as exc:
        log.warning("could not read the credential proxy's events: %s", exc)
        return []
    return parse_events(text, redact=values.values())
