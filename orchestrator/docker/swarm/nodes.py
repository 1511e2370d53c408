"""Before a swarm run: do the host paths and images it needs exist on every node?

A run's zones, inputs and results are bind mounts of host paths, and a task may land on any
ready, active node. Before a run (once per batch), :func:`check_nodes` makes one short
``global-job`` service per image the run needs (labelled like every swarm object, removed
after, and left to ``orchestrator gc`` if the orchestrator dies meanwhile): one task on
each candidate node, which mounts every path read-only and tests its kind. A node where a
path is missing rejects the task ("bind source path does not exist"), one without the image
cannot pull it (there is no registry), and the task's exit code names a path of the wrong
kind. Folders under the sandbox root (the run's folder, its inputs and results, sessions)
are made per run, so the sandbox root itself is checked, with a marker file written on this
node for the probe to find: that proves the node sees the same folder, not one of the same
name.

The pure part (which paths, the probe's command, reading its tasks, the refusal) is
separate from the requests (:func:`check_nodes`), and tested without an engine.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator import labels
from orchestrator.errors import EngineError
from orchestrator.plan import SECRETS_DIR, ContainerSpec

if TYPE_CHECKING:
    from orchestrator.docker.swarm.engine import SwarmEngine

__all__ = [
    "BindCheck",
    "Node",
    "NodeProblem",
    "bind_checks",
    "candidates",
    "check_nodes",
    "probe_command",
    "problems",
    "refusal",
]

Kind = Literal["folder", "file"]
#: Where the probe mounts the i-th path.
PROBE_ROOT = "/probe"
#: The probe's exit code for a failed check of path i is FIRST_CODE + i.
FIRST_CODE = 10
MARKER_PREFIX = ".node-check-"
_MISSING = re.compile(r"bind source path does not exist:\s*(\S+)")
_NO_IMAGE = re.compile(
    r"No such image|pull access denied|manifest unknown|repository does not exist"
)


@dataclass(frozen=True)
class Node:
    id: str
    hostname: str

    @property
    def name(self) -> str:
        return f"{self.hostname} ({self.id[:10]})"


@dataclass(frozen=True)
class BindCheck:
    """A host path the run binds, its kind, and (for the sandbox root) the marker file the
    probe must find in it."""

    path: str
    kind: Kind
    marker: str | None = None


@dataclass(frozen=True)
class NodeProblem:
    node: Node
    what: str
    path: str | None = None
    image: str | None = None


# -- pure ---------------------------------------------------------------------------------


def candidates(nodes: Iterable[dict[str, Any]]) -> list[Node]:
    """The nodes a task may land on: ready, with availability ``active``."""
    found = []
    for n in nodes:
        if (n.get("Status") or {}).get("State") != "ready":
            continue
        if (n.get("Spec") or {}).get("Availability") != "active":
            continue
        hostname = str(((n.get("Description") or {}).get("Hostname")) or "?")
        found.append(Node(str(n["ID"]), hostname))
    return sorted(found, key=lambda node: (node.hostname, node.id))


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def bind_checks(
    spec: ContainerSpec,
    sandbox_root: Path,
    *,
    results: bool,
    kind_of: Callable[[Path], Kind | None],
    marker: str,
) -> list[BindCheck]:
    """The host paths to check on each node for ``spec``: every bind mount's source (the
    secrets folder is a swarm secret instead), and the results folder when ``results``.
    Anything under ``sandbox_root`` is checked as the sandbox root with ``marker`` in it;
    a path missing here (made when the run opens) as its nearest existing parent, never
    ``/``. ``kind_of`` tells a path's kind on this node (None: missing)."""
    checks: dict[str, BindCheck] = {}
    sources = [Path(m.source) for m in spec.mounts if m.target != SECRETS_DIR]
    if results or spec.inputs is not None:
        sources.append(sandbox_root)
    for source in sources:
        if _within(source, sandbox_root):
            checks.setdefault(str(sandbox_root), BindCheck(str(sandbox_root), "folder", marker))
            continue
        path, kind = source, kind_of(source)
        while kind is None and path.parent != path:
            path = path.parent
            kind = kind_of(path)
        if kind is None or path == Path("/"):
            continue
        checks.setdefault(str(path), BindCheck(str(path), kind))
    return sorted(checks.values(), key=lambda c: c.path)


def probe_command(checks: list[BindCheck]) -> list[str]:
    """``sh -c`` testing each check at its mount point; exit FIRST_CODE + i names check i."""
    tests = []
    for i, check in enumerate(checks):
        target = f"{PROBE_ROOT}/{i}"
        test = f"test -d {target}" if check.kind == "folder" else f"test -f {target}"
        if check.marker is not None:
            test += f" && test -f {target}/{check.marker}"
        tests.append(f"{{ {test}; }} || exit {FIRST_CODE + i}")
    return ["sh", "-c", "; ".join([*tests, "exit 0"])]


def probe_mounts(checks: list[BindCheck]) -> list[dict[str, Any]]:
    return [
        {"Type": "bind", "Source": c.path, "Target": f"{PROBE_ROOT}/{i}", "ReadOnly": True}
        for i, c in enumerate(checks)
    ]


def _latest(tasks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each node's latest task."""
    by_node: dict[str, dict[str, Any]] = {}
    for task in sorted(tasks, key=lambda t: str(t.get("CreatedAt", ""))):
        node = task.get("NodeID")
        if node:
            by_node[str(node)] = task
    return by_node


def problems(
    nodes: list[Node],
    tasks: list[dict[str, Any]],
    checks: list[BindCheck],
    image: str,
) -> list[NodeProblem]:
    """What the probe of ``image`` found on each node, from its tasks (engine data)."""
    by_node = _latest(tasks)
    found = []
    for node in nodes:
        task = by_node.get(node.id)
        status = (task or {}).get("Status") or {}
        state = status.get("State")
        if task is None or state not in ("complete", "failed", "rejected", "shutdown"):
            what = f"the check did not finish there in time (its task: {state or 'none'})"
            if state == "preparing":  # an engine tries to pull a task's image first
                what += (
                    "; with no registry to pull from, start that node's engine with "
                    "DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1"
                )
            found.append(NodeProblem(node, what))
            continue
        if state == "complete":
            continue
        error = str(status.get("Err") or "")
        code = (status.get("ContainerStatus") or {}).get("ExitCode")
        missing = _MISSING.search(error)
        if missing:
            found.append(NodeProblem(node, "does not exist", path=missing.group(1)))
        elif _NO_IMAGE.search(error):
            found.append(NodeProblem(node, "image missing", image=image))
        elif isinstance(code, int) and 0 <= code - FIRST_CODE < len(checks):
            check = checks[code - FIRST_CODE]
            what = (
                "is not the folder this node sees (no marker file there: not shared)"
                if check.marker is not None
                else f"is not a {check.kind}"
            )
            found.append(NodeProblem(node, what, path=check.path))
        else:
            found.append(NodeProblem(node, f"the check failed there ({error or state})"))
    return found


def refusal(worker: str, found: list[NodeProblem]) -> str:
    """One line naming each node's problem and the ways out."""
    parts = []
    for p in found:
        if p.image is not None:
            parts.append(f"node {p.node.name} lacks image {p.image}")
        elif p.path is not None:
            parts.append(f"on node {p.node.name}, {p.path} {p.what}")
        else:
            parts.append(f"node {p.node.name}: {p.what}")
    fixes = []
    if any(p.path is not None for p in found):
        fixes.append(
            "make every host path the same folder on every node (e.g. NFS mounted at the same path)"
        )
    if any(p.image is not None for p in found):
        images = sorted({p.image for p in found if p.image is not None})
        fixes.append(
            f"load the images on each node (`docker save {' '.join(images)} | docker -H "
            "NODE load`: there is no registry to pull from)"
        )
    drain = "drain the node (`docker node update --availability drain NODE`)"
    fixes.append(f"or {drain}" if fixes else drain)
    return (
        f"--engine swarm: worker '{worker}' cannot run on every node a task may land on: "
        f"{'; '.join(parts)}; {', '.join(fixes)} (docs/scale-out.md)"
    )


def probe_template(image: str, checks: list[BindCheck], uid: int, gid: int) -> dict[str, Any]:
    """The probe service's task: ``image`` running :func:`probe_command` as ``uid:gid``
    (whose access to the paths the orchestrator has), read-only, nothing kept, no retry."""
    return {
        "ContainerSpec": {
            "Image": image,
            "Labels": labels.explicit({}),  # every label gc reads: never the image's
            "Command": probe_command(checks),
            "User": f"{uid}:{gid}",
            "ReadOnly": True,
            "Mounts": probe_mounts(checks),
            "CapabilityDrop": ["ALL"],
            "StopGracePeriod": 0,
        },
        "Resources": {"Limits": {"MemoryBytes": 32 << 20, "Pids": 16}},
        "RestartPolicy": {"Condition": "none", "MaxAttempts": 0},
    }


def _kind(path: Path) -> Kind | None:
    if path.is_dir():
        return "folder"
    if path.exists():
        return "file"
    return None


# -- requests -----------------------------------------------------------------------------


def check_nodes(
    engine: SwarmEngine,
    spec: ContainerSpec,
    sandbox_root: Path,
    *,
    results: bool,
    images: list[str],
    force: bool = False,
    timeout: float = 90,
) -> list[Node]:
    """Refuse (:class:`EngineError`, one line) unless every candidate node has the paths
    ``spec`` binds and ``images``. A swarm whose only candidate is this node is not
    probed (its paths are checked when the run opens) unless ``force``. Returns the
    candidate nodes."""
    nodes = candidates(engine.all_nodes())
    if not nodes:
        raise EngineError(
            "--engine swarm: the swarm has no ready node with availability active: "
            "`docker node ls` shows them; `docker node update --availability active NODE`"
        )
    if not force and [n.id for n in nodes] == [engine.local_node_id()]:
        return nodes
    token = secrets.token_hex(6)
    marker = f"{MARKER_PREFIX}{token}"
    checks = bind_checks(spec, sandbox_root, results=results, kind_of=_kind, marker=marker)
    marker_file = sandbox_root / marker
    made: list[str] = []
    try:
        if any(c.marker for c in checks):
            sandbox_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            marker_file.write_text("")
        for n, image in enumerate(images):
            # The first image with every path; the others only to show they are there.
            template = probe_template(image, checks if n == 0 else [], os.getuid(), os.getgid())
            made.append(engine.create_probe(f"orchestrator-nodes-{token}-{n}", template))
        found: list[NodeProblem] = []
        for n, (service, image) in enumerate(zip(made, images, strict=True)):
            tasks = _wait(engine, service, nodes, timeout)
            found += problems(nodes, tasks, checks if n == 0 else [], image)
    finally:
        for service in made:
            try:
                engine.remove("service", service)
                engine.remove_containers(service)
            except EngineError:
                pass  # gc removes it: it carries its owner's labels
        marker_file.unlink(missing_ok=True)
    if found:
        raise EngineError(refusal(spec.worker, found))
    return nodes


def _wait(
    engine: SwarmEngine, service: str, nodes: list[Node], timeout: float
) -> list[dict[str, Any]]:
    """The probe's tasks, once every node's has ended (or at the timeout)."""
    final = {"complete", "failed", "rejected", "shutdown"}
    wanted = {n.id for n in nodes}
    deadline = time.monotonic() + timeout
    while True:
        tasks: list[dict[str, Any]] = engine.service_tasks(service)
        ended = {
            node
            for node, task in _latest(tasks).items()
            if ((task.get("Status") or {}).get("State")) in final
        }
        if wanted <= ended or time.monotonic() >= deadline:
            return tasks
        time.sleep(0.2)
