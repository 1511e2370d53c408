"""The Docker engine adapter: what the runtime asks of an engine, done with the SDK.

:class:`DockerEngine` implements :class:`orchestrator.runtime.engine.Engine` with the
low-level client (one request per step, no implicit inspects): it stamps the owner labels
on everything it creates, retries transient failures a bounded number of times (see
:mod:`.client`), and leaves networks and egress proxies to :mod:`.networks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import requests
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.docker import networks
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.errors import ImageMissing
from orchestrator.plan import ContainerSpec
from orchestrator.runtime.engine import EgressDecision, ExitState, ManagedObject, Stream


class DockerExec:
    """One exec'd command: its output frames, then its exit code."""

    def __init__(self, engine: DockerEngine, exec_id: str, frames: Iterator[tuple[Stream, bytes]]):
        self.engine = engine
        self.exec_id = exec_id
        self.frames = frames

    def exit_code(self) -> int | None:
        with engine_errors("reading a command's exit code"):
            code = self.engine.api.exec_inspect(self.exec_id).get("ExitCode")
        return None if code is None else int(code)


class DockerEngine(DockerClient):
    """:class:`~orchestrator.runtime.engine.Engine` over the Docker SDK's low-level client."""

    # -- one container's life -------------------------------------------------------------

    def create(self, spec: ContainerSpec) -> str:
        host_config = self.api.create_host_config(
            binds={
                m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
                for m in spec.mounts
            },
            network_mode=spec.network_mode,
            read_only=spec.read_only_rootfs,
            cap_drop=spec.cap_drop,
            cap_add=spec.cap_add or None,
            security_opt=spec.security_opt,
            pids_limit=spec.pids_limit,
            mem_limit=spec.mem_limit,
            memswap_limit=spec.memswap_limit,
            nano_cpus=spec.nano_cpus,
            tmpfs=spec.tmpfs,
            init=spec.init,
            privileged=spec.privileged,
            ipc_mode="private",
            devices=spec.devices or None,
        )

        # With an outbox, the container only keeps its mounts alive (as a user of its own)
        # while the worker runs by exec; see orchestrator.runtime.run.
        supervised = spec.supervisor_user is not None

        # Named after the run: a create retried after a lost reply finds the first one
        # instead of leaving a second, unnoticed container behind.
        name = f"orchestrator-{spec.run_id}" if spec.run_id else None

        def create() -> str:
            try:
                result = self.api.create_container(
                    name=name,
                    image=spec.image,
                    entrypoint=["sleep"] if supervised else None,
                    command=["infinity"] if supervised else spec.command,
                    user=spec.supervisor_user or spec.user,
                    environment=spec.env,
                    working_dir=spec.working_dir,
                    labels=self.labels_for(spec.labels),
                    host_config=host_config,
                    network_disabled=spec.network_mode == "none",
                    use_config_proxy=False,  # a worker gets exactly the plan's proxy settings
                    stdin_open=False,
                    tty=False,
                )
            except docker_errors.APIError as exc:
                if exc.status_code != 409 or name is None:
                    raise
                existing = self.api.inspect_container(name)
                if (existing["Config"].get("Labels") or {}).get(labels.RUN_ID) != spec.run_id:
                    raise
                return str(existing["Id"])
            return str(result["Id"])

        with engine_errors(f"creating the container for '{spec.worker}'"):
            try:
                return retrying(create)
            except docker_errors.ImageNotFound:
                raise ImageMissing(spec.image) from None
            except docker_errors.NotFound as exc:
                if "image" in str(exc.explanation or "").lower():
                    raise ImageMissing(spec.image) from None
                raise

    def attach(self, container_id: str) -> Iterator[tuple[Stream, bytes]]:
        with engine_errors("attaching to the container"):
            frames = self.api.attach(
                container_id, stdout=True, stderr=True, stream=True, logs=True, demux=True
            )
        return self._frames(frames)

    @staticmethod
    def _frames(frames: Any) -> Iterator[tuple[Stream, bytes]]:
        try:
            for out, err in frames:
                if out:
                    yield "stdout", out
                if err:
                    yield "stderr", err
        except (requests.exceptions.RequestException, OSError, ValueError):
            return  # the connection closed as the container went away
        finally:
            # Closes the hijacked connection's fd. The SDK leaves the socket wrapper itself
            # to the garbage collector, which then warns about an already closed socket
            # (docker/docker-py#3282); pyproject's pytest settings filter exactly that.
            frames.close()

    def start(self, container_id: str) -> None:
        with engine_errors("starting the container"):
            retrying(lambda: self.api.start(container_id))

    def wait(self, container_id: str, timeout: float | None) -> int | None:
        with engine_errors("waiting for the container"):
            try:
                result = self.api.wait(container_id, timeout=timeout)  # type: ignore[arg-type]
            except requests.exceptions.ReadTimeout:
                return None
            except requests.exceptions.ConnectionError as exc:
                if "timed out" in str(exc).lower():
                    return None
                raise
        return int(result.get("StatusCode", -1))

    def exit_state(self, container_id: str) -> ExitState:
        with engine_errors("reading the container's exit state"):
            state = retrying(lambda: self.api.inspect_container(container_id))["State"]
        return ExitState(
            exit_code=int(state.get("ExitCode", -1)), oom_killed=bool(state.get("OOMKilled"))
        )

    def kill(self, container_id: str) -> None:
        with engine_errors("killing the container"):
            try:
                self.api.kill(container_id)
            except docker_errors.APIError as exc:
                if exc.status_code in (404, 409):  # gone, or not running any more
                    return
                raise

    def remove(self, container_id: str) -> bool:
        def remove() -> None:
            try:
                self.api.remove_container(container_id, force=True, v=True)
            except docker_errors.NotFound:
                return
            except docker_errors.APIError as exc:
                if "already in progress" not in str(exc.explanation or ""):
                    raise

        with engine_errors("removing the container"):
            retrying(remove)
        return True

    # -- garbage collection ---------------------------------------------------------------

    def image_argv(self, image: str, command: list[str] | None) -> list[str]:
        with engine_errors(f"reading the command of image '{image}'"):
            config = self.api.inspect_image(image).get("Config") or {}  # type: ignore[no-untyped-call]
        return [*(config.get("Entrypoint") or []), *(command or config.get("Cmd") or [])]

    def exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> DockerExec:
        with engine_errors("starting a command in the container"):
            exec_id = self.api.exec_create(
                container_id,
                argv,
                stdout=True,
                stderr=True,
                user=user,
                environment=env,
                workdir=workdir,
            )["Id"]
            frames = self.api.exec_start(exec_id, stream=True, demux=True)
        return DockerExec(self, exec_id, self._frames(frames))

    def prepare_network(self, spec: ContainerSpec) -> None:
        networks.prepare_network(self, spec)

    def network_decisions(self, spec: ContainerSpec, since: datetime) -> list[EgressDecision]:
        return networks.network_decisions(self, spec, since)

    def collect_shared(self, idle_seconds: float) -> list[str]:
        return networks.collect_shared(self, idle_seconds)

    def list_managed(self) -> list[ManagedObject]:
        label = {"label": labels.MANAGED}
        found: list[ManagedObject] = []
        with engine_errors("listing the orchestrator's objects"):
            for c in self.api.containers(all=True, filters=label):
                name = (c.get("Names") or [""])[0].lstrip("/")
                found.append(ManagedObject("container", c["Id"], name, c.get("Labels") or {}))
            for n in self.api.networks(filters=label):
                found.append(ManagedObject("network", n["Id"], n["Name"], n.get("Labels") or {}))
            for v in self.api.volumes(filters=label).get("Volumes") or []:
                found.append(ManagedObject("volume", v["Name"], v["Name"], v.get("Labels") or {}))
        return found

    def remove_object(self, obj: ManagedObject) -> bool:
        with engine_errors(f"removing {obj.kind} {obj.name}"):
            try:
                if obj.kind == "container":
                    self.api.remove_container(obj.id, force=True, v=True)
                elif obj.kind == "network":
                    self.api.remove_network(obj.id)
                else:
                    self.api.remove_volume(obj.id, force=True)
            except docker_errors.NotFound:
                pass
            except docker_errors.APIError as exc:
                if "already in progress" not in str(exc.explanation or ""):
                    raise  # another gc is removing it: as good as gone
        return True
