"""Build steps on Docker: a step's container, hardened as a run, its layer committed.

:class:`DockerStepEngine` implements :class:`orchestrator.build.engine.StepEngine`. A ``RUN``
step's container runs under gVisor's build runtime (``orchestrator-runsc-build``: its writes
reach the container's layer, see :mod:`.runtimes`), as root inside the sandbox with
Docker's default capabilities less ``NET_RAW``, ``MKNOD`` and ``AUDIT_WRITE``,
``no-new-privileges``, the project's seccomp profile, no network, the build's memory,
CPU and process limits, a file-size limit and a watch on what it adds to its layer (the
disk limit: the engine's size of the layer and a block for every entry of its changes),
the resolver "this host" (no DNS query leaves it), its output read through an attach and
clipped (the logging driver is ``none``: the
engine keeps nothing of it on the host).

A step's container carries no labels: labels would pass into the committed image and from
there into every container made from it. It is owned by its name instead,
``orchestrator-build-<pid>-<start>-<pid namespace>-<token>``, which :func:`.buildnames.owner_labels`
reads back for ``gc``: a build SIGKILLed mid-step leaves a container that ``orchestrator
gc`` removes.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import requests
from docker import errors as docker_errors
from docker.types import LogConfig, Mount, Ulimit

from orchestrator import labels
from orchestrator.build.engine import (
    ENTRY_BYTES,
    STEP_CAPABILITIES,
    Folder,
    Output,
    StepLimits,
    StepOutcome,
    StepSpec,
)
from orchestrator.credproxy import WORKER_BUNDLE
from orchestrator.docker import networks, podman, runtimes, seccomp
from orchestrator.docker.buildnames import container_name
from orchestrator.docker.cabundle import CaBundles
from orchestrator.docker.client import DockerClient, engine_errors, retrying, wait_exit
from orchestrator.docker.hostconfig import NO_NEW_PRIVILEGES, NO_RESOLVER
from orchestrator.docker.netnames import network_name
from orchestrator.errors import EngineError
from orchestrator.plan import SECCOMP_PROFILE, ContainerSpec, Network
from orchestrator.plan import Limits as PlanLimits
from orchestrator.runtime.engine import EgressLog

#: How often a running step's layer size is measured (seconds).
DISK_POLL_S = 1.0
#: Bytes of a step's output kept for the message when it fails.
TAIL = 2048
#: The label a committed image's cache key is under.
CACHE_LABEL = f"{labels.PREFIX}.build.key"
#: Go's ``os.ModeDir``, in the mode the engine's path stat reports.
GO_MODE_DIR = 1 << 31
#: The key of each entry in the engine's list of a container's changes.
_PATH_KEY = b'"Path":'
#: A tmpfs for ``RUN --mount=type=cache|tmpfs``.
SCRATCH_SIZE = 256 << 20


#: Images' CA bundles read for ``build.ca`` (by image id).
_CA_BUNDLES = CaBundles()


class DockerStepEngine:
    """Build steps on the Docker engine ``client``."""

    def __init__(self, client: DockerClient | None = None) -> None:
        self.client = client or DockerClient()
        self.api = self.client.api
        self._empty: str | None = None
        self._cache: dict[tuple[str, str], str] | None = None

    def runtime(self) -> str:
        return runtimes.build_runtime_name("none")

    # -- the build's network, when the project declares a build allowlist ------------------

    @staticmethod
    def _network_spec(build_id: str, allow: list[str], services: list[str]) -> ContainerSpec:
        limits = PlanLimits(memory=0, cpus=0.0, pids=0, timeout_s=0.0)
        return ContainerSpec(image="", command=None, uid=0, gid=0, limits=limits,
                             network=Network(mode="allowlist", allow=list(allow),
                                             services=sorted(set(services))),
                             run_id=f"build-{build_id}", worker="build")  # fmt: skip

    def open_network(self, build_id: str, allow: list[str], services: list[str]) -> str:
        """An internal network of the build's own (owner-labelled: ``gc`` removes it after
        a crash) with the shared egress proxy attached, as an allowlisted run gets."""
        spec = self._network_spec(build_id, allow, services)
        networks.set_up_network(self.client, spec)
        return network_name(spec)

    def close_network(self, network: str) -> None:
        networks.release_network(self.client, network)

    def egress_decisions(
        self, build_id: str, allow: list[str], services: list[str], since: datetime
    ) -> EgressLog:
        """The step's decisions, followed since the step began (a flood rotating the
        proxy's log erases none); then the next step's are followed."""
        spec = self._network_spec(build_id, allow, services)
        found = networks.network_decisions(self.client, spec, since)
        networks.follow_decisions(self.client, spec, datetime.now(UTC))
        return found

    def image(self, ref: str) -> tuple[str, dict[str, Any]] | None:
        with engine_errors(f"looking up image '{ref}'"):
            try:
                found = self.api.inspect_image(ref)  # type: ignore[no-untyped-call]
            except docker_errors.NotFound:
                return None
        return str(found["Id"]), dict(found.get("Config") or {})

    def cached(self, key: str, parent: str) -> str | None:
        """One listing of the cache's images per build (by their label), then lookups in
        it. An image made from one of ours inherits its label: only an image whose parent
        is ``parent`` is the step's."""
        if self._cache is None:
            with engine_errors("looking up the build cache"):
                found = self.api.images(all=True, filters={"label": CACHE_LABEL})
            self._cache = {}
            for image in sorted(found, key=lambda i: -int(i.get("Created") or 0)):
                label = (image.get("Labels") or {}).get(CACHE_LABEL)
                if label:
                    self._cache[(label, str(image.get("ParentId") or ""))] = str(image["Id"])
        return self._cache.get((key, parent))

    def empty_image(self) -> str:
        if self._empty is None:
            buffer = io.BytesIO()
            tarfile.open(fileobj=buffer, mode="w").close()
            with engine_errors("making an empty image (FROM scratch)"):
                answer = self.api.import_image_from_data(
                    buffer.getvalue(), repository="orchestrator/scratch", tag="latest"
                )
            self._empty = self.api.inspect_image("orchestrator/scratch:latest")["Id"]  # type: ignore[no-untyped-call]
            del answer
        return self._empty

    def ca_bundle(self, image: str) -> bytes:
        return _CA_BUNDLES.read(self.client, image)

    def create(self, spec: StepSpec, limits: StepLimits) -> str:
        runtime = runtimes.build_runtime_name("allowlist" if spec.network else "none")
        # The step finds its proxy in /etc/hosts: it needs no answer from the engine's DNS,
        # which a loaded engine may fail to give (the step's requests would fail with it).
        hosts = podman.proxy_hosts(self.client, spec.network) if spec.network else None
        host = self.api.create_host_config(
            runtime=runtime,
            network_mode=spec.network or "none",
            cap_drop=["ALL"],
            cap_add=list(STEP_CAPABILITIES),
            security_opt=seccomp.security_opt(
                [NO_NEW_PRIVILEGES, f"seccomp={SECCOMP_PROFILE}"], gvisor=True
            ),
            mem_limit=limits.memory,
            memswap_limit=limits.memory,
            nano_cpus=round(limits.cpus * 1e9),
            pids_limit=runtimes.host_pids_limit(runtime, limits.pids),
            ulimits=[
                Ulimit(name="nproc", soft=limits.pids, hard=limits.pids),
                Ulimit(name="fsize", soft=limits.disk, hard=limits.disk),
            ],
            tmpfs={t: f"rw,nosuid,nodev,exec,size={SCRATCH_SIZE}" for t in spec.scratch},
            mounts=[
                Mount(target, source, type="bind", read_only=True)
                for source, target in [
                    *spec.secrets,
                    *([(spec.ca_bundle, WORKER_BUNDLE)] if spec.ca_bundle else []),
                ]
            ],
            log_config=LogConfig(type=LogConfig.types.NONE),
            privileged=False,
            ipc_mode="private",
            extra_hosts=hosts,
            # As a run's: the engine's DNS answers the build network's names (``proxy``)
            # and forwards any other to "this host" in the step's own namespace, where
            # nothing answers; no query leaves it (CVE-2024-29018's channel).
            dns=NO_RESOLVER,
        )
        # The command as the entrypoint and an empty Cmd: a commit then takes nothing of
        # either from the container (see orchestrator.build.builder.commit_config).
        name = container_name()

        def create() -> str:
            made = self.api.create_container(
                spec.image,
                name=name,
                entrypoint=spec.command or ["/nonexistent-build-step"],
                command=[],
                user=spec.user,
                environment=spec.env,
                working_dir=spec.workdir or None,
                network_disabled=spec.network is None,
                host_config=host,
                labels={},
            )
            return str(made["Id"])

        with engine_errors("creating a build step's container"):
            return retrying(create)

    def put_archive(self, container: str, data: Iterable[bytes]) -> None:
        # A generator: the SDK sends it as it comes (chunked), nothing is staged.
        chunks = iter(data)
        with engine_errors("copying files into a build step"):
            if not self.api.put_archive(container, "/", chunks):
                raise EngineError("Docker refused the files of a build step")

    def is_folder(self, container: str, path: str) -> bool:
        mode = self._stat_mode(container, path)
        return mode is not None and bool(mode & GO_MODE_DIR)

    def _stat_mode(self, container: str, path: str) -> int | None:
        """Go's mode bits of ``path`` (the engine does not follow its last part), or None."""
        api: Any = self.api
        with engine_errors(f"looking at {path} in a build step"):
            answer = api.head(api._url("/containers/{0}/archive", container), params={"path": path})
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise EngineError(
                f"Docker refused looking at {path} in a build step ({answer.status_code})"
            )
        found = json.loads(base64.b64decode(answer.headers.get("X-Docker-Container-Path-Stat", "")))
        return int(found.get("mode", 0))

    def exists(self, container: str, path: str) -> bool:
        return self._stat_mode(container, path) is not None

    def folder(self, container: str, path: str) -> Folder | None:
        mode = self._stat_mode(container, path)
        if mode is None or not mode & GO_MODE_DIR:
            return None
        # Its archive, read up to its second member (the first is the folder itself).
        api: Any = self.api
        with engine_errors(f"reading {path} in a build step"):
            answer = api._get(api._url("/containers/{0}/archive", container),
                              params={"path": path}, stream=True)  # fmt: skip
            try:
                api._raise_for_status(answer)
                answer.raw.decode_content = True  # (the engine may send it gzipped)
                with tarfile.open(fileobj=answer.raw, mode="r|") as tar:
                    first, second = tar.next(), tar.next()
            except tarfile.TarError as exc:
                raise EngineError(f"Docker sent an unreadable archive of {path}: {exc}") from None
            finally:
                answer.close()
        return Folder(mode=mode & 0o777, empty=first is not None and second is None)

    def get_archive(self, container: str, path: str) -> Iterator[bytes]:
        with engine_errors(f"reading {path} of an image"):
            try:
                stream, _ = self.api.get_archive(container, path)
            except docker_errors.NotFound:
                raise FileNotFoundError(path) from None
        return iter(stream)

    def run(
        self, container: str, limits: StepLimits, deadline: float, output: Output
    ) -> StepOutcome:
        with engine_errors("attaching to a build step"):
            frames = self.api.attach(container, stdout=True, stderr=True, stream=True, logs=False)
        reader = _Output(frames, limits.output, output)
        reader.start()
        with engine_errors("starting a build step"):
            self.api.start(container)
        timed_out = disk = False
        added = 0
        next_poll = time.monotonic() + DISK_POLL_S
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                if self._exited(container, min(left, DISK_POLL_S)):
                    break
                if time.monotonic() >= next_poll:
                    began = time.monotonic()
                    added = self.added(container)
                    if added > limits.disk:
                        disk = True
                        break
                    # A measure walks the layer: the engine spends at most a third of
                    # its time on it, however large the layer grew.
                    spent = time.monotonic() - began
                    next_poll = time.monotonic() + max(DISK_POLL_S, 2 * spent)
            if timed_out or disk:
                with engine_errors("stopping a build step"), suppress(docker_errors.APIError):
                    self.api.kill(container)  # (an error: it ended meanwhile)
            with engine_errors("reading a build step's exit state"):
                state = self.api.inspect_container(container)["State"]
            if not disk and not timed_out:  # (a step that failed on a full file, too)
                added = self.added(container)
                disk = added > limits.disk
        finally:
            reader.join(5)
            reader.close()
        return StepOutcome(
            exit_code=int(state.get("ExitCode", -1)),
            timed_out=timed_out,
            disk_exceeded=disk,
            added=added,
            oom=bool(state.get("OOMKilled")),
            tail=reader.tail.decode("utf-8", errors="replace"),
            clipped=reader.clipped,
        )

    def _exited(self, container: str, timeout: float) -> bool:
        action = "waiting for a build step"
        return wait_exit(self.api, container, max(timeout, 0.05), action) is not None

    def added(self, container: str) -> int:
        """What the container added to its layer: the engine's ``SizeRw`` (the apparent
        sizes of its files, a sparse file's holes too, and its links' targets; a folder or
        an empty file counts nothing there, and a file of many hard links once) and
        :data:`ENTRY_BYTES` for each entry of the layer's changes (files, folders, links,
        deletions, whatever their number)."""
        api: Any = self.api
        # Both walk the layer (with fuse-overlayfs, the image under it too): asked at once,
        # the measure takes as long as the longer of the two.
        with engine_errors("measuring a build step's layer"), ThreadPoolExecutor(1) as pool:
            entries = pool.submit(self._entries, container)
            # The SDK's inspect has no ``size``; the API does.
            url = api._url("/containers/{0}/json", container)
            found = api._result(api._get(url, params={"size": 1}), json=True)
            count = entries.result()
        return int(found.get("SizeRw") or 0) + ENTRY_BYTES * count

    def _entries(self, container: str) -> int:
        """The number of entries in the container's layer's changes, counted as the
        engine's answer streams in (one ``"Path":`` each: a quote inside a path is
        escaped, so a path cannot forge one), never held whole."""
        api: Any = self.api
        answer = api._get(api._url("/containers/{0}/changes", container), stream=True)
        try:
            api._raise_for_status(answer)
            count, carry = 0, b""
            for chunk in answer.iter_content(1 << 16):
                data = carry + chunk
                count += data.count(_PATH_KEY)
                # What could be the start of a key cut between two chunks.
                carry = data[-(len(_PATH_KEY) - 1) :]
            return count
        finally:
            answer.close()

    def commit(self, container: str, config: Mapping[str, Any]) -> str:
        with engine_errors("committing a build step"):
            made = self.api.commit(container, conf=dict(config))
        return str(made["Id"])

    def remove(self, container: str) -> None:
        def remove() -> None:
            try:
                self.api.remove_container(container, force=True, v=True)
            except docker_errors.NotFound:
                return

        with engine_errors("removing a build step's container"):
            retrying(remove)

    def remove_image(self, image: str) -> None:
        with engine_errors("removing a build's image"):
            try:
                self.api.remove_image(image)
            except docker_errors.NotFound:
                pass
            except docker_errors.APIError as exc:
                if exc.status_code != 409:  # in use or a parent: it stays
                    raise

    def tag(self, image: str, name: str) -> None:
        repository, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "")
        with engine_errors(f"tagging the image as '{name}'"):
            self.api.tag(image, repository, tag or "latest", force=True)


class _Output(threading.Thread):
    """Reads a step's output to its end: the first ``limit`` bytes go to ``output``, the
    rest is dropped (the step is never blocked on a full pipe); the last bytes are kept."""

    def __init__(self, frames: Any, limit: int, output: Output) -> None:
        super().__init__(name="build-step-output", daemon=True)
        self.frames, self.limit, self.output = frames, limit, output
        self.seen = 0
        self.tail = b""
        self.clipped = False

    def run(self) -> None:
        try:
            for chunk in self.frames:
                if self.seen < self.limit:
                    self.output(chunk[: self.limit - self.seen])
                elif not self.clipped:
                    self.clipped = True
                self.seen += len(chunk)
                self.tail = (self.tail + chunk)[-TAIL:]
        except (requests.exceptions.RequestException, OSError, ValueError):
            return

    def close(self) -> None:
        close = getattr(self.frames, "close", None)
        if close is not None:
            close()
