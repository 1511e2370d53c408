"""The Docker Swarm adapter: services, their tasks, overlay networks and secrets.

Every request goes through the SDK's low-level client of :class:`DockerClient` and its
:func:`engine_errors`. Each object carries the owner labels (pid, start time, pid
namespace) and :data:`SWARM`, so that :func:`collect` can remove what a dead orchestrator
left: services first (the engine removes their tasks' containers), then networks and
secrets. The ``io.orchestrator.managed`` label is left off on purpose: the Docker engine's
own gc lists objects by it, and would try an overlay network before its service is gone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.docker.swarm.render import ServiceSpec
from orchestrator.errors import EngineError, ImageMissing

log = logging.getLogger(__name__)

#: Marks every swarm object the orchestrator makes.
SWARM = f"{labels.PREFIX}.swarm"
#: Task states after which nothing more happens to a task.
FINAL_STATES = frozenset({"complete", "failed", "rejected", "shutdown", "orphaned", "remove"})
_ORDER = {"service": 0, "network": 1, "secret": 2}

__all__ = ["SWARM", "SwarmEngine", "SwarmGc", "SwarmObject", "TaskEnd"]


@dataclass(frozen=True)
class TaskEnd:
    """How a service's one task ended (or did not: ``state`` None after the timeout)."""

    state: str | None
    exit_code: int | None
    container_id: str | None
    error: str | None
    node_id: str | None = None


@dataclass(frozen=True)
class SwarmObject:
    kind: str
    id: str
    name: str
    labels: dict[str, str]


@dataclass
class SwarmGc:
    removed: list[SwarmObject] = field(default_factory=list)
    kept: list[SwarmObject] = field(default_factory=list)
    failed: list[tuple[SwarmObject, str]] = field(default_factory=list)


class SwarmEngine(DockerClient):
    """A swarm manager's API, as the swarm runs need it."""

    def swarm_labels(self, extra: dict[str, str]) -> dict[str, str]:
        owner = {k: v for k, v in self.labels_for({}).items() if k != labels.MANAGED}
        return {**extra, **owner, SWARM: "true"}

    # -- the swarm itself -----------------------------------------------------------------

    def is_manager(self) -> bool:
        with engine_errors("asking whether the engine is in a swarm"):
            state = (self.api.info() or {}).get("Swarm") or {}
        return state.get("LocalNodeState") == "active" and bool(state.get("ControlAvailable"))

    def check_manager(self) -> None:
        if not self.is_manager():
            raise EngineError(
                "--engine swarm: this Docker engine is not a swarm manager; run the "
                "orchestrator on a manager node (`docker swarm init` makes one here, "
                "`docker swarm join` adds nodes), or use --engine docker"
            )

    def default_runtime(self) -> str:
        """The runtime this engine gives a container that names none: a service cannot name
        one, so its task runs on its node's default (this manager's is the one recorded)."""
        with engine_errors("asking the engine for its default runtime"):
            info = self.api.info() or {}
        return str(info.get("DefaultRuntime") or "runc")

    def all_nodes(self) -> list[dict[str, Any]]:
        with engine_errors("listing the swarm's nodes"):
            return list(self.api.nodes())

    def local_node_id(self) -> str:
        with engine_errors("asking which swarm node this engine is"):
            state = (self.api.info() or {}).get("Swarm") or {}
        return str(state.get("NodeID") or "")

    def create_probe(self, name: str, template: dict[str, Any]) -> str:
        """A short check: one task on every eligible node (a ``global-job``), never
        restarted; see :mod:`orchestrator.docker.swarm.nodes`."""
        with engine_errors(f"creating the node check service {name}"):
            made = self.api.create_service(  # type: ignore[no-untyped-call]
                template,
                name=name,
                labels=self.swarm_labels({}),
                mode={"GlobalJob": {}},
            )
        return str(made["ID"])

    def service_tasks(self, service_id: str) -> list[dict[str, Any]]:
        with engine_errors("reading the service's tasks"):
            return list(self.api.tasks(filters={"service": service_id}))  # type: ignore[no-untyped-call]

    def image_argv(self, image: str, command: list[str] | None) -> list[str]:
        with engine_errors(f"reading the command of image '{image}'"):
            try:
                config = self.api.inspect_image(image).get("Config") or {}  # type: ignore[no-untyped-call]
            except docker_errors.ImageNotFound:
                raise ImageMissing(image) from None
        return [*(config.get("Entrypoint") or []), *(command or config.get("Cmd") or [])]

    # -- a run's objects ------------------------------------------------------------------

    def create_network(
        self, name: str, plan_labels: dict[str, str], *, internal: bool = True
    ) -> str:
        """An overlay network of the run's: internal (the worker task's: no route out), or
        the proxy's way out."""
        with engine_errors(f"creating the swarm network {name}"):
            made = retrying(
                lambda: self.api.create_network(
                    name,
                    driver="overlay",
                    internal=internal,
                    attachable=False,
                    labels=self.swarm_labels(plan_labels),
                    check_duplicate=True,
                )
            )
        return str(made["Id"])

    def create_secret(self, name: str, value: str, plan_labels: dict[str, str]) -> str:
        with engine_errors(f"creating the swarm secret {name}"):
            made = self.api.create_secret(
                name, value.encode(), labels=self.swarm_labels(plan_labels)
            )
        return str(made["ID"])

    def create_service(self, service: ServiceSpec) -> str:
        mode = {"ReplicatedJob": {"MaxConcurrent": 1, "TotalCompletions": 1}}
        with engine_errors(f"creating the swarm service {service.name}"):
            made = self.api.create_service(  # type: ignore[no-untyped-call]
                service.task_template,
                name=service.name,
                labels=self.swarm_labels(service.labels),
                mode=mode,
            )
        return str(made["ID"])

    def create_proxy(self, name: str, template: dict[str, Any], plan_labels: dict[str, str]) -> str:
        """A run's egress proxy: one replica, never restarted, removed with the run."""
        with engine_errors(f"creating the egress proxy service {name}"):
            made = self.api.create_service(  # type: ignore[no-untyped-call]
                template,
                name=name,
                labels=self.swarm_labels(plan_labels),
                mode={"Replicated": {"Replicas": 1}},
                # Its name answers with the task's own address: no virtual IP, whose load
                # balancing an internal overlay does not give.
                endpoint_spec={"Mode": "dnsrr"},
            )
        return str(made["ID"])

    def wait_running(self, service_id: str, timeout: float) -> None:
        """Wait until the service's task runs (healthy, when it has a health check)."""
        deadline = time.monotonic() + timeout
        last = "no task yet"
        while time.monotonic() < deadline:
            with engine_errors("reading the proxy's task"):
                tasks = self.api.tasks(filters={"service": service_id})  # type: ignore[no-untyped-call]
            for task in tasks:
                status = task.get("Status") or {}
                if status.get("State") == "running":
                    return
                last = f"{status.get('State')}: {status.get('Err') or status.get('Message')}"
                if status.get("State") in FINAL_STATES:
                    raise EngineError(f"the egress proxy service did not start ({last})")
            time.sleep(0.2)
        raise EngineError(f"the egress proxy service was not ready after {timeout:g} s ({last})")

    def swarm_subnets(self, network: str) -> list[str]:
        """The IPv4 subnets of a swarm-scoped network; refused for a local one."""
        with engine_errors(f"inspecting network {network}"):
            try:
                info = self.api.inspect_network(network)
            except docker_errors.NotFound:
                raise EngineError(
                    f"network '{network}' (network.services in the project file) does not "
                    "exist: create it as a swarm overlay (`docker network create -d overlay "
                    f"--attachable {network}`) or remove it from the project file"
                ) from None
        if info.get("Scope") != "swarm":
            raise EngineError(
                f"network '{network}' (network.services in the project file) is local to "
                "this node, and a swarm service joins only swarm networks: create it with "
                f"`docker network create -d overlay --attachable {network}`"
            )
        configs = (info.get("IPAM") or {}).get("Config") or []
        return [str(c["Subnet"]) for c in configs if c.get("Subnet") and ":" not in c["Subnet"]]

    def service_stdout(self, service_id: str) -> str:
        with engine_errors("reading the egress proxy's log"):
            try:
                return b"".join(
                    self.api.service_logs(service_id, stdout=True, stderr=False)
                ).decode(errors="replace")
            except docker_errors.NotFound:
                return ""

    def task_end(self, service_id: str, timeout: float, *, poll: float = 0.2) -> TaskEnd:
        """Wait for the service's task to end, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with engine_errors("reading the service's task"):
                try:
                    tasks = self.api.tasks(filters={"service": service_id})  # type: ignore[no-untyped-call]
                except docker_errors.NotFound:  # removed meanwhile (a batch cancelling it)
                    return TaskEnd("remove", None, None, "the service was removed")
            for task in tasks:
                status = task.get("Status") or {}
                state = status.get("State")
                if state in FINAL_STATES:
                    container = status.get("ContainerStatus") or {}
                    return TaskEnd(
                        state,
                        container.get("ExitCode"),
                        container.get("ContainerID"),
                        status.get("Err"),
                        task.get("NodeID"),
                    )
            if not tasks and not self._service_exists(service_id):
                return TaskEnd("remove", None, None, "the service was removed")
            if time.monotonic() >= deadline:
                return TaskEnd(None, None, None, None)
            time.sleep(poll)

    def _service_exists(self, service_id: str) -> bool:
        with engine_errors("inspecting the service"):
            try:
                self.api.inspect_service(service_id)  # type: ignore[no-untyped-call]
            except docker_errors.NotFound:
                return False
        return True

    def remove_run(self, run_id: str) -> None:
        """Remove a run's service by its name (a batch cancelling a running input)."""
        self.remove("service", f"orchestrator-{run_id}")

    def output(self, service_id: str, container_id: str | None) -> tuple[bytes, bytes]:
        """The task's stdout and stderr: from its container on this node, else the
        service's logs (gathered by the swarm from the node that ran it)."""
        with engine_errors("reading the task's output"):
            if container_id is not None:
                try:
                    out = self.api.logs(container_id, stdout=True, stderr=False)
                    err = self.api.logs(container_id, stdout=False, stderr=True)
                    return bytes(out), bytes(err)
                except docker_errors.NotFound:
                    pass
            out = self.api.service_logs(service_id, stdout=True, stderr=False)
            err = self.api.service_logs(service_id, stdout=False, stderr=True)
            return b"".join(out), b"".join(err)

    def oom_killed(self, container_id: str | None) -> bool:
        if container_id is None:
            return False
        with engine_errors("inspecting the task's container"):
            try:
                state = self.api.inspect_container(container_id).get("State") or {}
            except docker_errors.NotFound:
                return False
        return bool(state.get("OOMKilled"))

    def remove(self, kind: str, ident: str) -> None:
        """Remove a service, network or secret; one already gone is fine."""
        with engine_errors(f"removing the swarm {kind} {ident}"):
            try:
                if kind == "service":
                    self.api.remove_service(ident)  # type: ignore[no-untyped-call]
                elif kind == "network":
                    self._remove_network(ident)
                else:
                    self.api.remove_secret(ident)
            except docker_errors.NotFound:
                pass

    def _remove_network(self, ident: str) -> None:
        # The task's endpoint leaves the network a moment after its service is removed.
        for attempt in range(50):
            try:
                self.api.remove_network(ident)
                return
            except docker_errors.APIError as exc:
                if exc.status_code == 404:
                    return
                if "in use" not in str(exc.explanation or "") or attempt == 49:
                    raise
            time.sleep(0.2)

    def settle(self, service_id: str, *, within: float = 15) -> None:
        """Wait (at most ``within`` s) until no task of the service is on its way to a
        container: one removed while its node prepares it can leave a created container
        behind that nothing removes."""
        deadline = time.monotonic() + within
        early = {"new", "pending", "assigned", "accepted", "preparing", "ready", "starting"}
        while time.monotonic() < deadline:
            with engine_errors("reading the service's tasks"):
                try:
                    tasks = self.api.tasks(filters={"service": service_id})  # type: ignore[no-untyped-call]
                except docker_errors.NotFound:
                    return
            if not any((t.get("Status") or {}).get("State") in early for t in tasks):
                return
            time.sleep(0.2)

    def remove_containers(self, service_id: str, *, within: float = 15) -> None:
        """Remove what is left on this node of a removed service's task containers, and
        wait (at most ``within`` s) until none is left: the engine keeps a finished job's
        exited container after its service is gone, and stops a running one on its own
        schedule."""
        deadline = time.monotonic() + within
        label = {"label": f"com.docker.swarm.service.id={service_id}"}
        while True:
            with engine_errors("removing the service's task containers"):
                left = self.api.containers(all=True, filters=label)
                for container in left:
                    try:
                        self.api.remove_container(container["Id"], force=True, v=True)
                    except docker_errors.NotFound:
                        pass
                    except docker_errors.APIError as exc:
                        if "already in progress" not in str(exc.explanation or ""):
                            raise
            if not left or time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    # -- gc -------------------------------------------------------------------------------

    def list_managed(self) -> list[SwarmObject]:
        found: list[SwarmObject] = []
        label = {"label": SWARM}
        with engine_errors("listing the orchestrator's swarm objects"):
            for s in self.api.services(filters=label):  # type: ignore[no-untyped-call]
                spec = s.get("Spec") or {}
                name, tags = spec.get("Name", ""), spec.get("Labels") or {}
                found.append(SwarmObject("service", s["ID"], name, tags))
            for n in self.api.networks(filters=label):
                found.append(SwarmObject("network", n["Id"], n["Name"], n.get("Labels") or {}))
            for c in self.api.secrets(filters=label):
                spec = c.get("Spec") or {}
                name, tags = spec.get("Name", ""), spec.get("Labels") or {}
                found.append(SwarmObject("secret", c["ID"], name, tags))
        return found


def collect(engine: SwarmEngine, *, everything: bool = False) -> SwarmGc:
    """Remove the swarm objects whose owner process is gone (services first)."""
    report = SwarmGc()
    if not engine.is_manager():
        return report
    objects = sorted(engine.list_managed(), key=lambda o: _ORDER.get(o.kind, 9))
    for obj in objects:
        state = labels.owner_state(obj.labels)
        if state == "alive" or (state == "foreign" and not everything):
            report.kept.append(obj)
            continue
        try:
            if obj.kind == "service":
                engine.settle(obj.id)
            engine.remove(obj.kind, obj.id)
            if obj.kind == "service":  # its task containers, before its network
                engine.remove_containers(obj.id)
        except EngineError as exc:
            log.warning("gc could not remove swarm %s %s: %s", obj.kind, obj.name, exc)
            report.failed.append((obj, str(exc)))
        else:
            report.removed.append(obj)
    return report
