"""Snapshots of live sessions, and forks started from them.

A snapshot holds the sandbox's own state, never the user's files:

- its root filesystem, as a local image committed from the session's container (a
  read-only root commits to an empty layer, which still pins the image it ran). Under
  gVisor a writable root (``image_user``) keeps its writes in the sandbox's memory, where
  a commit never sees them, so only a session opened for snapshots (``snapshots=True``,
  ``session start --snapshots``; :attr:`~orchestrator.plan.ContainerSpec.root_capture`)
  can snapshot one: its root runs on the build runtime (``--overlay2=none``), whose writes
  reach the container's layer;
- its tmpfs folders (``/tmp``, those a harness added; never masks, never the outbox) and
  the folders the session owns (``/session``, a writable ``/workspace``). A tmpfs folder
  is one tar stream read inside the container as the worker's user: the host never
  extracts these bytes; it stores them, capped, and a fork writes them back inside its own
  sandbox, as its own user. A session folder is a host folder: it is copied on the host
  by :func:`~orchestrator.runtime.host_folders.copy_into` (walked by descriptors, no link
  followed, links kept as links, FIFOs, sockets and devices left out, no set-id bit), and
  a fork's new folder is filled the same way before its container starts;
- the recipe: worker, trust, workspace, the image it ran, environment names, limits,
  network and the grant's fingerprint (zones and modes, masks, children, secret names).

Snapshots live under the project's trusted sandbox root, ``<sandbox root>/snapshots/<id>``
(out of every container's reach), one folder holding ``manifest.json`` and the tars. A
snapshot is made in a folder named ``.tmp-<id>-<pid>`` (holding its maker's owner labels, robust to
pid reuse) and renamed into place at its end, so a snapshot whose maker died is never
listed; ``gc`` removes such leftovers (a dead maker's folder and image, an image whose
snapshot folder is gone; a maker of another pid namespace is not judged). ``gc`` never
removes a snapshot: only :func:`remove` and :func:`prune` do.

A fork re-prepares the snapshot's worker at the snapshot's trust and refuses, in one line,
when the grant it would get is not the snapshot's (the declaration changed) or when it
has a writable host zone (the fork would write where its parent wrote; ``ask`` zones are
a private copy per run and are allowed). Each fork gets a new session folder, its own
workspace (``fork-<session id>`` when the snapshot holds one), its own outbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, runtime_checkable

from orchestrator import labels
from orchestrator.errors import OrchestratorError
from orchestrator.hostfs.flags import DIR_FLAGS
from orchestrator.runtime.execs import exec_request
from orchestrator.runtime.host_folders import CopyBudget, copy_into, owned_folder, project_owner
from orchestrator.runtime.session_folders import _remove_tree
from orchestrator.runtime.state_root import open_state_root
from orchestrator.runtime.supervised import TOOL_ENV

#: :class:`orchestrator.Orchestrator` and :class:`~orchestrator.runtime.session.Session`
#: (not imported: they import this module).
Orchestrator = Any
Session = Any

if TYPE_CHECKING:
    from orchestrator.config import Project
    from orchestrator.prepare import Prepared

__all__ = [
    "FOLDER_CAP",
    "Snapshot",
    "SnapshotEngine",
    "SnapshotError",
    "collect_snapshot_garbage",
    "fork",
    "get",
    "list_snapshots",
    "remove",
    "take",
]

SNAPSHOTS = "snapshots"
MANIFEST = "manifest.json"
OWNER = "owner.json"
TEMP_PREFIX = ".tmp-"
#: The local image repository snapshots are committed to (never pushed anywhere).
REPOSITORY = "orchestrator-snapshot"
#: Image labels: which snapshot, and which project's sandbox root it belongs to.
LABEL_ID = "io.orchestrator.snapshot"
LABEL_ROOT = "io.orchestrator.snapshot-root"
#: Largest tar stream one folder of a snapshot may take on the host.
FOLDER_CAP = 4 << 30
ID = re.compile(r"^snap-[0-9a-f]{12}$")
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: The standard zones a session owns (their content is the sandbox's, not the user's).
OWNED_ZONES = ("session", "workspace")


class SnapshotError(OrchestratorError):
    """A snapshot cannot be taken, found, forked or removed (one line, with the fix)."""


@runtime_checkable
class SnapshotEngine(Protocol):
    """What snapshots need of an engine (Docker's: :class:`orchestrator.docker.DockerEngine`)."""

    def pause(self, container_id: str) -> None: ...

    def unpause(self, container_id: str) -> None: ...

    def commit(
        self, container_id: str, repository: str, tag: str, image_labels: dict[str, str]
    ) -> str: ...

    def tag_image(self, image: str, repository: str, tag: str) -> str: ...

    def image_size(self, image: str) -> int: ...

    def remove_image(self, image: str) -> bool: ...

    def images_labelled(self, label: str) -> list[tuple[str, list[str], dict[str, str]]]: ...


def engine_of(launch: object, wanted: str) -> tuple[SnapshotEngine, str]:
    """The snapshot-capable engine and the container of a live run's launch; one line
    naming ``wanted`` otherwise."""
    engine = getattr(launch, "engine", None)
    container = getattr(launch, "container_id", None)
    if not isinstance(engine, SnapshotEngine) or not container:
        raise SnapshotError(f"this backend cannot {wanted} a session: use the docker backend")
    return engine, str(container)


@dataclass
class Snapshot:
    """One snapshot, as its manifest says; :meth:`fork` starts sessions from it."""

    id: str
    created: str
    session: str
    run_id: str
    worker: str
    trust: str
    workspace: str
    image: str
    """The committed image's id (its root filesystem)."""
    tag: str
    base_image: str
    """The image the worker declares (what a fork's plan must still name)."""
    root_capture: bool
    image_user: bool
    run_as: str
    """With ``image_user``: the image's user the session ran as (a fork runs as it)."""
    bytes: int
    seconds: float
    sandbox_root: str
    folders: list[dict[str, Any]] = field(default_factory=list)
    """Each ``{"target", "file", "bytes", "sha256"}``: a tar of one folder."""
    env: list[str] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)
    grant: dict[str, Any] = field(default_factory=dict)
    orchestrator: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(replace(self, orchestrator=None))
        data.pop("orchestrator")
        return data

    def summary(self) -> dict[str, Any]:
        """What ``snapshot list`` shows of it."""
        return {"id": self.id, "bytes": self.bytes, "created": self.created,
                "session": self.session, "worker": self.worker, "trust": self.trust}  # fmt: skip

    def fork(self, count: int = 1, **options: Any) -> list[Session]:
        """``count`` new sessions, each from this snapshot's state (see the module doc)."""
        if self.orchestrator is None:
            raise SnapshotError(f"snapshot {self.id} was not read through an Orchestrator")
        return fork(self.orchestrator, self, count, **options)


# -- the store ------------------------------------------------------------------------


@contextlib.contextmanager
def _store(project: Project) -> Iterator[int]:
    """A descriptor of ``<sandbox root>/snapshots`` (made 0700, never through a link)."""
    root = open_state_root(project)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(SNAPSHOTS, 0o700, dir_fd=root)
        try:
            fd = os.open(SNAPSHOTS, DIR_FLAGS, dir_fd=root)
        except OSError as exc:
            raise SnapshotError(
                f"{project.sandbox_root / SNAPSHOTS} is not a usable folder ({exc.strerror}); "
                "remove it"
            ) from None
    finally:
        os.close(root)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise SnapshotError(
                f"{project.sandbox_root / SNAPSHOTS} must belong to uid {os.geteuid()} with "
                "mode 0700; remove it"
            )
        yield fd
    finally:
        os.close(fd)


def _read_json(store: int, name: str, file: str, limit: int) -> Any:
    """The JSON of ``name/file`` in the store, read through descriptors without following a
    link (at most ``limit`` bytes); None when the folder or the file is not there."""
    try:
        folder = os.open(name, DIR_FLAGS, dir_fd=store)
    except OSError:
        return None
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as handle:
        return json.loads(handle.read(limit))


def _read_manifest(store: int, name: str) -> dict[str, Any] | None:
    data = _read_json(store, name, MANIFEST, 1 << 20)
    return data if isinstance(data, dict) else None


def _snapshot(data: dict[str, Any], orchestrator: Orchestrator | None) -> Snapshot:
    known = {f for f in Snapshot.__dataclass_fields__ if f != "orchestrator"}
    return Snapshot(**{k: v for k, v in data.items() if k in known}, orchestrator=orchestrator)


def list_snapshots(project: Project, orchestrator: Any = None) -> list[Snapshot]:
    """The project's snapshots, oldest first (a temporary folder is never one)."""
    found = []
    with _store(project) as store:
        for name in sorted(os.listdir(store)):
            if not ID.match(name):
                continue
            data = _read_manifest(store, name)
            if data is not None and data.get("sandbox_root") == str(project.sandbox_root):
                found.append(_snapshot(data, orchestrator))
    return sorted(found, key=lambda s: s.created)


def get(project: Project, snapshot_id: str, orchestrator: Any = None) -> Snapshot:
    """The project's snapshot ``snapshot_id``; one line when it is not this project's."""
    data = None
    if ID.match(snapshot_id):
        with _store(project) as store:
            data = _read_manifest(store, snapshot_id)
    if data is None or data.get("sandbox_root") != str(project.sandbox_root):
        raise SnapshotError(
            f"no snapshot '{snapshot_id}' in project {project.root} (a snapshot belongs to "
            "the project that took it); see `orchestrator snapshot list`"
        )
    return _snapshot(data, orchestrator)


def remove(
    project: Project, snapshot_id: str, engine: SnapshotEngine, audit: Any, *, why: str = "asked"
) -> Snapshot:
    """Remove a snapshot: its image and its folder; audited as ``snapshot.removed``."""
    snap = get(project, snapshot_id)
    engine.remove_image(snap.tag)  # the name: a pinned image of others stays theirs
    with _store(project) as store:
        _remove_folder(store, snapshot_id)
    audit.record(
        "snapshot.removed",
        worker=snap.worker,
        session_id=snap.session,
        metadata={"snapshot": snap.id, "bytes": snap.bytes, "image": snap.image, "why": why},
    )
    return snap


def prune(
    project: Project, older_than_s: float, engine: SnapshotEngine, audit: Any
) -> list[Snapshot]:
    """The retention rule: remove the project's snapshots taken more than
    ``older_than_s`` seconds ago (each audited as ``snapshot.removed``); those removed."""
    now = datetime.now(UTC)
    removed = []
    for snap in list_snapshots(project):
        age = (now - datetime.fromisoformat(snap.created)).total_seconds()
        if age > older_than_s:
            why = f"older than {older_than_s:g} s"
            removed.append(remove(project, snap.id, engine, audit, why=why))
    return removed


def _remove_folder(store: int, name: str) -> None:
    """Remove one folder of the store (its files are ours: never a link followed)."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(name, dir_fd=store)


def collect_snapshot_garbage(project: Project, engine: SnapshotEngine | None) -> list[str]:
    """What half-made snapshots left: temporary folders of makers that are gone, and
    images of this project's whose snapshot folder is gone; the names removed."""
    removed: list[str] = []
    with _store(project) as store:
        names = set(os.listdir(store))
        for name in sorted(names):
            if not name.startswith(TEMP_PREFIX):
                continue
            snap_id, _, pid = name.removeprefix(TEMP_PREFIX).rpartition("-")
            maker = _maker(store, name)
            if maker is not None and labels.owner_state(maker) != "gone":
                continue  # alive, or of another pid namespace: not ours to judge
            if maker is None and pid.isdigit() and labels.pid_alive(int(pid)):
                continue
            if engine is not None and ID.match(snap_id):  # its image (or pin), if made
                engine.remove_image(f"{REPOSITORY}:{snap_id}")
            _remove_folder(store, name)
            removed.append(name)
        if engine is None:
            return removed
        busy = {n.removeprefix(TEMP_PREFIX).rsplit("-", 1)[0] for n in os.listdir(store)}
        kept = {n for n in os.listdir(store) if ID.match(n)} | busy
        for image, _tags, image_labels in engine.images_labelled(LABEL_ID):
            if image_labels.get(LABEL_ROOT) != str(project.sandbox_root):
                continue
            if image_labels.get(LABEL_ID) not in kept:
                engine.remove_image(image)
                removed.append(f"image {image_labels.get(LABEL_ID)}")
    return removed


def _maker(store: int, name: str) -> dict[str, str] | None:
    """The owner labels a snapshot's temporary folder records (None: none written)."""
    try:
        data = _read_json(store, name, OWNER, 4096)
    except ValueError:
        return None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


# -- taking one -----------------------------------------------------------------------


def owned_folders(prepared: Prepared) -> list[str]:
    """The container folders a snapshot holds besides the root: tmpfs folders (never a
    mask, never the outbox) and the writable zones the session owns."""
    spec = prepared.spec
    folders = [t.target for t in spec.tmpfs if not t.mask and t.target != spec.outbox]
    folders += [
        z.target
        for z in prepared.grant.zones
        if z.standard and z.name in OWNED_ZONES and not z.read_only
    ]
    return folders


def grant_fingerprint(prepared: Prepared) -> dict[str, Any]:
    """What a fork's grant must equal: everything the worker was allowed (host folders of
    the zones a session does not own included), in plain data."""
    grant, spec = prepared.grant, prepared.spec
    zones = sorted(
        [z.name, z.target, z.mode, None if z.standard and z.name in OWNED_ZONES else
         str(z.ask_base or z.host_path), z.ask_base is not None]
        for z in grant.zones
        if not z.outbox
    )  # fmt: skip
    network = grant.network
    return {
        "trust": grant.trust,
        "zones": zones,
        "network": repr(network),
        "limits": asdict(grant.limits),
        "masks": sorted(grant.masks),
        "children": sorted(grant.children),
        "secrets": sorted(grant.secrets),
        "egress": sorted(grant.egress),
        "isolation": spec.isolation,
        "image_user": spec.image_user,
        "image": spec.image,
    }


def take(session: Session) -> Snapshot:
    """Snapshot a live session (see the module doc); its :class:`Snapshot`."""
    run = session._run
    prepared, spec = run.prepared, run.spec
    project = prepared.project
    engine, container = engine_of(run.live, "snapshot")
    if spec.image_user and spec.isolation == "gvisor" and spec.calls_children:
        raise SnapshotError(
            f"session {session.id} calls child workers, and under gVisor such a session's "
            "root filesystem keeps its writes in the sandbox's memory, where no snapshot can "
            "read them: a worker with image_user and children cannot be snapshotted"
        )
    if spec.image_user and not spec.root_capture and spec.isolation == "gvisor":
        raise SnapshotError(
            f"session {session.id}'s root filesystem keeps its writes in gVisor's memory, "
            "where no snapshot can read them: open it for snapshots (`orchestrator session "
            "start --snapshots`, or open_session(..., snapshots=True))"
        )
    started = time.monotonic()
    snap_id = "snap-" + os.urandom(6).hex()
    temp = f"{TEMP_PREFIX}{snap_id}-{os.getpid()}"
    base = spec.labels.get("io.orchestrator.snapshot-base") or _base_image(prepared)
    with _store(project) as store:
        os.mkdir(temp, 0o700, dir_fd=store)
        try:
            folder = os.open(temp, DIR_FLAGS, dir_fd=store)
            try:  # who makes it (robust to pid reuse and other pid namespaces), for gc
                _write_file(folder, OWNER, json.dumps(labels.current_owner().labels()).encode())
                folders: list[dict[str, Any]] = []
                zones = _owned_zones(prepared)
                for index, target in enumerate(owned_folders(prepared)):
                    if target in zones:  # a host folder: copied on the host, no link followed
                        name = f"folder-{index}"
                        os.mkdir(name, 0o700, dir_fd=folder)
                        copied = project.sandbox_root / SNAPSHOTS / temp / name
                        size = copy_into(zones[target], copied, None, CopyBudget(FOLDER_CAP))
                        folders.append({"target": target, "file": name, "bytes": size,
                                        "kind": "tree"})  # fmt: skip
                        continue
                    name = f"folder-{index}.tar"
                    size, digest = _save_folder(run, target, folder, name)
                    folders.append({"target": target, "file": name, "bytes": size,
                                    "sha256": digest, "kind": "tar"})  # fmt: skip
                if spec.read_only_rootfs:  # nothing to commit: the image itself, pinned
                    image = engine.tag_image(spec.image, REPOSITORY, snap_id)
                    root_bytes = 0
                else:
                    image_labels = {LABEL_ID: snap_id, LABEL_ROOT: str(project.sandbox_root)}
                    image = engine.commit(container, REPOSITORY, snap_id, image_labels)
                    root_bytes = engine.image_size(image)
                snap = Snapshot(
                    id=snap_id,
                    created=datetime.now(UTC).isoformat(timespec="seconds"),
                    session=session.id,
                    run_id=spec.run_id,
                    worker=spec.worker,
                    trust=spec.trust,
                    workspace=prepared.paths.workspace.name,
                    image=image,
                    tag=f"{REPOSITORY}:{snap_id}",
                    base_image=base,
                    root_capture=spec.root_capture,
                    image_user=spec.image_user,
                    bytes=root_bytes + sum(f["bytes"] for f in folders),
                    seconds=0.0,
                    sandbox_root=str(project.sandbox_root),
                    folders=folders,
                    env=sorted(spec.env),
                    limits=asdict(spec.limits),
                    network={"mode": spec.network.mode, "allow": list(spec.network.allow)},
                    grant=grant_fingerprint(replace(prepared, spec=replace(spec, image=base))),
                    run_as=spec.run_as,
                )
                snap.seconds = round(time.monotonic() - started, 3)
                _write_file(folder, MANIFEST, json.dumps(snap.to_dict(), indent=1).encode())
                os.fsync(folder)
            finally:
                os.close(folder)
            os.rename(temp, snap_id, src_dir_fd=store, dst_dir_fd=store)
        except BaseException:
            _remove_folder(store, temp)
            with contextlib.suppress(Exception):
                engine.remove_image(f"{REPOSITORY}:{snap_id}")
            raise
    snap.orchestrator = getattr(session, "orchestrator", None)
    return snap


def _owned_zones(prepared: Prepared) -> dict[str, Path]:
    """The session's own writable host folders, by their container path."""
    return {
        z.target: z.host_path
        for z in prepared.grant.zones
        if z.standard and z.name in OWNED_ZONES and not z.read_only
    }


def _base_image(prepared: Prepared) -> str:
    return prepared.spec.image


def _write_file(folder: int, name: str, data: bytes) -> None:
    fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _save_folder(run: Any, target: str, folder: int, name: str) -> tuple[int, str]:
    """One container folder as a tar (read inside, as the worker's user), stored as
    bytes, at most :data:`FOLDER_CAP`; its size and sha256."""
    launch = run.live
    # Its entries, never the folder itself: a fork's own (a tmpfs's root, a mount point)
    # keeps its owner and mode, which its user may not change.
    script = (
        'cd "$1" && find . -mindepth 1 -maxdepth 1 -print0 | '
        "exec tar --sparse --ignore-failed-read --null -T - -cf -"
    )
    argv = ["/bin/sh", "-c", script, "tar", target]
    _, container = engine_of(launch, "snapshot")
    handle = launch.engine.exec(container, argv, user=run.spec.user, env=TOOL_ENV)
    digest = hashlib.sha256()
    size = 0
    fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as out:
        for stream, chunk in handle.frames:
            if stream != "stdout":
                continue
            size += len(chunk)
            if size > FOLDER_CAP:
                raise SnapshotError(
                    f"{target} holds more than the {FOLDER_CAP >> 30} GiB a snapshot keeps of "
                    "one folder; remove what it need not keep, then snapshot again"
                )
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    code = handle.exit_code()
    if code not in (0, 1, None):  # 1: a file changed while it was read (it runs on)
        raise SnapshotError(f"reading {target} for the snapshot failed (tar exit {code})")
    return size, digest.hexdigest()


# -- forking --------------------------------------------------------------------------


def fork(
    orchestrator: Orchestrator,
    source: Snapshot,
    count: int = 1,
    *,
    idle_timeout: float | None = None,
    max_lifetime: float | None = None,
) -> list[Session]:
    """``count`` sessions started from ``source``; each audited as ``session.fork``. On a
    failure the forks opened so far are closed before the error is raised."""
    from orchestrator.runtime.run import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_LIFETIME

    if count < 1 or count > 64:
        raise SnapshotError(f"--count {count}: give 1 to 64 forks")
    snap = get(orchestrator.project, source.id, orchestrator)  # this project's, as stored
    forks: list[Session] = []
    try:
        for _ in range(count):
            forks.append(
                _fork_one(
                    orchestrator,
                    snap,
                    idle_timeout=DEFAULT_IDLE_TIMEOUT if idle_timeout is None else idle_timeout,
                    max_lifetime=DEFAULT_MAX_LIFETIME if max_lifetime is None else max_lifetime,
                )
            )
    except BaseException:
        for opened in forks:
            with contextlib.suppress(Exception):
                opened.close()
        raise
    return forks


def fork_plan(orchestrator: Orchestrator, snap: Snapshot) -> Prepared:
    """The plan of one fork: the snapshot's worker at its trust, checked to get exactly
    the snapshot's grant, on the snapshot's image; refused in one line otherwise."""
    from orchestrator.prepare.prepared import new_id

    session_id = new_id()
    owns_workspace = any(f["target"] == "/workspace" for f in snap.folders)
    workspace = f"fork-{session_id}" if owns_workspace else snap.workspace
    prepared: Prepared = orchestrator.prepare(
        snap.worker, trust=snap.trust, session_id=session_id, workspace=workspace
    )
    spec = replace(prepared.spec, image=snap.base_image)  # compared as declared
    fingerprint = grant_fingerprint(replace(prepared, spec=spec))
    if fingerprint != snap.grant:
        changed = sorted(k for k in fingerprint if fingerprint[k] != snap.grant.get(k))
        raise SnapshotError(
            f"worker {snap.worker}'s grant is not snapshot {snap.id}'s any more (changed: "
            f"{', '.join(changed)}); a fork gets exactly its snapshot's grant: take a new "
            "snapshot under the current declaration"
        )
    for zone in prepared.grant.zones:
        owned = zone.standard and zone.name in OWNED_ZONES
        if not zone.read_only and not zone.outbox and not owned and zone.ask_base is None:
            raise SnapshotError(
                f"cannot fork snapshot {snap.id}: zone '{zone.name}' ({zone.target}) is a "
                "writable host folder, and a fork never writes where its parent wrote; give "
                "the worker that zone read-only or with approval.write: ask"
            )
    container_labels = {**prepared.spec.labels, "io.orchestrator.snapshot-base": snap.base_image}
    spec = replace(
        prepared.spec,
        image=snap.image,
        root_capture=snap.root_capture,
        labels=container_labels,
        run_as=snap.run_as or prepared.spec.run_as,
    )
    return replace(prepared, spec=spec)


def _fork_one(
    orchestrator: Orchestrator, snap: Snapshot, *, idle_timeout: float, max_lifetime: float
) -> Session:
    prepared = fork_plan(orchestrator, snap)
    project = orchestrator.project
    zones = _owned_zones(prepared)
    owner = (prepared.uid, prepared.gid) if os.geteuid() != 0 else project_owner(project.root)
    try:
        for saved in snap.folders:  # the fork's own folders, filled before it starts
            if saved.get("kind") == "tree":
                target = zones.get(str(saved["target"]))
                if target is None:
                    raise SnapshotError(f"snapshot folder {saved['target']} is not one a fork owns")
                owned_folder(target, *owner)
                source = project.sandbox_root / SNAPSHOTS / snap.id / str(saved["file"])
                copy_into(source, target, owner, CopyBudget(FOLDER_CAP))
        session = orchestrator.open_session(
            prepared, idle_timeout=idle_timeout, max_lifetime=max_lifetime
        )
    except BaseException:  # a fork that never opened leaves no folder of its own
        for path in zones.values():
            if path.name == prepared.session_id or path.name.startswith("fork-"):
                _remove_tree(path)
        raise
    try:
        run = session._run
        with _store(project) as store:
            folder = os.open(snap.id, DIR_FLAGS, dir_fd=store)
        try:
            for saved in snap.folders:
                if saved.get("kind") != "tree":
                    _restore_folder(run, folder, saved)
        finally:
            os.close(folder)
    except BaseException:
        session.close()
        raise
    session._record("session.fork", True, snapshot=snap.id, parent=snap.session,
                    bytes=snap.bytes)  # fmt: skip
    return session


def _restore_folder(run: Any, folder: int, saved: dict[str, Any]) -> None:
    """Write one saved folder back, inside the fork's own sandbox, as its user."""
    target = str(saved["target"])
    if target not in owned_folders(run.prepared):
        raise SnapshotError(f"snapshot folder {target} is not one this fork owns")
    fd = os.open(str(saved["file"]), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    with os.fdopen(fd, "rb") as handle:
        data = _read_capped(handle, FOLDER_CAP)
    if hashlib.sha256(data).hexdigest() != saved["sha256"]:
        raise SnapshotError(f"snapshot file for {target} changed since it was taken; remove it")
    script = 'exec tar --no-overwrite-dir -xf - -C "$1"'
    request = exec_request(
        ["/bin/sh", "-c", script, "untar", target],
        user=run.spec.user,
        base_env=TOOL_ENV,
        cwd="/",
        timeout=600.0,
        stdin=data,
    )
    result = run.live.exec(request)
    if result.exit_code != 0:
        why = (result.stderr.strip().splitlines() or ["tar failed"])[-1]
        raise SnapshotError(f"restoring {target} in the fork failed: {why}")


def _read_capped(handle: IO[bytes], cap: int) -> bytes:
    data = handle.read(cap + 1)
    if len(data) > cap:
        raise SnapshotError(f"a snapshot file is larger than {cap} bytes")
    return data


def describe_forks(forks: Sequence[Session]) -> list[str]:
    return [f.id for f in forks]
