"""Getting a run ready: trust, session, grant and plan; then the host folders it will mount.

:func:`prepare` is pure (no Docker, no zone I/O beyond looking for ``.git``), so ``plan``
shows exactly what ``run`` will do. :func:`prepare_filesystem` runs just before the
container is created: it makes the run's own folders, checks every zone can be used by the
worker's uid, and refuses any mount source that leads through a symlink.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.audit import AuditLog
from orchestrator.config import Project, Worker, load_worker
from orchestrator.config.models import Trust
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.hostfs.entries import open_entry, permits
from orchestrator.hostfs.flags import DIR_FLAGS
from orchestrator.hostfs.paths import PathRefused, check_path, open_path
from orchestrator.plan import ContainerSpec, compile_plan
from orchestrator.policy import Grant, RunPaths, effective_trust, grant_for, worker_identity
from orchestrator.policy.grant import ZoneGrant
from orchestrator.runtime import run_folders
from orchestrator.runtime.session_folders import touch
from orchestrator.timeouts import MAX_TIMEOUT_S, seconds_problem

if TYPE_CHECKING:
    from orchestrator.runtime.inputs import InputSpec

AUDIT_FILE = "audit.jsonl"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Prepared:
    """A run ready to start: its grant, compiled spec and identities."""

    project: Project
    worker: Worker
    grant: Grant
    spec: ContainerSpec
    paths: RunPaths
    uid: int
    gid: int
    fresh_session: bool = False
    """The session was made for this run (no ``--session``): its folder goes if left empty."""
    inputs: tuple[InputSpec, ...] = ()
    """Checked inputs, placed in the run's ``/inputs`` folder when it opens."""

    @property
    def session_id(self) -> str:
        return self.spec.session_id


def _argument_problems(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Arguments and environment values reach the engine as JSON text: a NUL cannot, and
    bytes that are not UTF-8 (decoded with surrogates from the command line) would arrive
    changed, so both are refused rather than altered."""
    problems: list[str] = []
    for where, value in [(f"argument {i}", a) for i, a in enumerate(args, 1)] + [
        (f"--env {name}", v) for name, v in env.items()
    ]:
        if "\0" in value:
            problems.append(f"{where} holds a NUL character")
        elif not _is_utf8(value):
            problems.append(
                f"{where} is not valid UTF-8 (the engine passes text only); "
                "give such bytes in an input file"
            )
    return problems


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_name(kind: str, value: str) -> str:
    if not NAME.match(value):
        raise ConfigError(
            [f"--{kind} '{value}' is invalid; use letters, digits, '.', '_' or '-' (max 64)"]
        )
    return value


def prepare(
    project: Project,
    worker: Worker,
    *,
    run_id: str | None = None,
    timeout: float | None = None,
    trust: Trust | None = None,
    promote: bool = False,
    session_id: str | None = None,
    workspace: str = "default",
    inputs: Sequence[str | os.PathLike[str]] = (),
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    input_slot: bool = False,
) -> Prepared:
    """Check the declarations and compile the plan, without touching Docker.

    ``inputs`` (host files or folders, checked now: see :mod:`orchestrator.runtime.inputs`)
    are placed at ``/inputs/<name>`` when the run opens; ``input_slot`` gives the run an
    ``/inputs`` folder without inputs yet (filled later by ``place_inputs``, e.g. for a run
    opened ahead of need). ``env`` is added to the worker's environment and ``args`` to its
    command; both are part of the plan, so a container created from it gets them.
    """
    from orchestrator.runtime.inputs import check_inputs

    problems = _argument_problems(args, env or {})
    if timeout is not None and (problem := seconds_problem(timeout, MAX_TIMEOUT_S)):
        problems.append(f"timeout: {problem}; give at most {MAX_TIMEOUT_S} (a week)")
    if problems:
        raise ConfigError(problems)
    checked = check_inputs(project, worker, inputs) if inputs else ()
    run_id = run_id or new_id()
    fresh = not session_id
    session_id = check_name("session", session_id) if session_id else new_id()
    paths = RunPaths.of(
        project, session_id=session_id, workspace=check_name("workspace", workspace), run_id=run_id
    )
    level = effective_trust(worker.config.trust, trust, promote=promote)
    grant = grant_for(project, worker, paths, trust=level, timeout=timeout)
    prepared = compile_prepared(
        project,
        worker,
        grant,
        paths,
        run_id=run_id,
        session_id=session_id,
        inputs=bool(checked) or input_slot,
        env=env,
        args=args,
    )
    return replace(prepared, fresh_session=fresh, inputs=checked)


def load_and_prepare(project: Project, worker: str, **options: Any) -> Prepared:
    """Load a worker file (by name or path) and :func:`prepare` it.

    A file with invalid fields is still checked as far as it can be: its grant is computed
    without those fields, and every problem is reported at once.
    """
    try:
        loaded = load_worker(project, worker)
    except ConfigError as exc:
        if not isinstance(exc.partial, Worker):
            raise
        try:
            prepare(project, exc.partial, **options)
        except ConfigError as more:
            problems = exc.problems + [p for p in more.problems if p not in exc.problems]
            raise ConfigError(problems) from None
        raise
    return prepare(project, loaded, **options)


def compile_prepared(
    project: Project,
    worker: Worker,
    grant: Grant,
    paths: RunPaths,
    *,
    run_id: str,
    session_id: str,
    inputs: bool = False,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> Prepared:
    """Compile an already checked grant (a top-level run's, or a child's restricted one)."""
    uid, gid = worker_identity(project.root)
    spec = compile_plan(
        project,
        worker,
        grant,
        run_id=run_id,
        session_id=session_id,
        uid=uid,
        gid=gid,
        inputs=inputs,
        env=env,
        args=args,
    )
    return Prepared(project, worker, grant, spec, paths, uid, gid)


def prepare_filesystem(prepared: Prepared) -> None:
    """Create the run's folders and check every mount source before the container exists."""
    uid, gid, paths = prepared.uid, prepared.gid, prepared.paths
    private(paths.sandbox_root)
    # As root, folders made for the worker belong to the project folder's owner, and the
    # worker's uid gets its access for the run only (runtime.access, when the run opens).
    owner = (uid, gid) if os.geteuid() != 0 else project_owner(prepared.project.root)
    if uses_run_dir(prepared):  # its owner first, so that gc can tell when it is left over
        run_folders.claim(paths.run_dir, prepared.spec.labels)
    for zone in prepared.grant.zones:
        if zone.outbox:
            continue  # a tmpfs inside the container
        if zone.ask_base is not None:
            check_zone(replace(zone, host_path=zone.ask_base, ask_base=None), uid, gid)
            # As root, the copy holds what the grant lets the worker read: everything.
            whole = os.geteuid() == 0 and zone.ask_base.stat().st_uid != uid
            # Two copies: the worker's, and the snapshot its changes are measured against,
            # so that edits made to the zone meanwhile are conflicts, never silently undone.
            private_copy(zone.ask_base, pristine_of(zone.host_path), uid, gid, whole=whole)
            private_copy(zone.ask_base, zone.host_path, uid, gid, whole=whole)
        ours = zone.standard and zone.name in ("session", "workspace")
        missing_output = not zone.standard and not zone.read_only and not zone.host_path.exists()
        if ours or missing_output:
            owned_folder(zone.host_path, *owner)
        if ours and zone.name == "session":
            touch(zone.host_path)  # used now: `gc --sessions-older-than` counts from here
        check_zone(zone, uid, gid)
    if prepared.grant.children:
        owned_folder(paths.broker_dir, uid, gid)
    if prepared.spec.inputs is not None:
        owned_folder(paths.inputs_dir, uid, gid)  # filled by runtime.inputs.place_inputs


def path_violations(project: Project) -> list[str]:
    """Links on the project's zone paths and its own folders (sandbox root, workers, repo),
    one line each: after a run, what a worker may have planted to redirect later runs."""
    named = [(f"zone '{z.name}'", z.host_path) for z in project.zones.values()]
    named += [
        ("the sandbox root", project.sandbox_root),
        ("the workers folder", project.workers_dir),
        ("the repo", project.repo),
    ]
    found: list[str] = []
    for what, path in named:
        try:
            check_path(path, file_ok=True)
        except PathRefused as refused:
            if refused.link is not None:
                found.append(
                    f"{what}: {refused.component} is now a symbolic link (to {refused.link}); "
                    f"every run refuses this project until a person removes it (`rm "
                    f"{refused.component}`) and checks what it pointed at"
                )
    return found


def uses_run_dir(prepared: Prepared) -> bool:
    """Whether the run keeps something in its own folder: ``ask`` copies, a broker's socket
    or inputs (a swarm run's results are claimed by the swarm; an access record holds its
    owner itself)."""
    grant = prepared.grant
    asks = any(zone.ask_base is not None for zone in grant.zones)
    return asks or bool(grant.children) or prepared.spec.inputs is not None


def pristine_of(copy: Path) -> Path:
    """The snapshot beside an ``ask`` zone's private copy (``runs/<id>/ask-base/<zone>``)."""
    return copy.parent.parent / "ask-base" / copy.name


def private_copy(source: Path, target: Path, uid: int, gid: int, *, whole: bool = False) -> None:
    """Copy a zone for an ``ask`` run: folders and regular files, links as links.

    Walks with directory descriptors opened ``O_NOFOLLOW`` and opens files ``O_NOFOLLOW |
    O_NONBLOCK``, checking the type on the open descriptor: a folder swapped for a link, or
    a file for a FIFO, while copying is skipped, never followed or waited on. Entries the
    worker's own uid could not read are left out (root copies on its behalf), unless
    ``whole``: root running a worker whose grant reads the zone, whatever its modes say.
    """
    target.mkdir(mode=0o700, parents=True)
    top = open_path(source)
    try:
        _copy_folder(top, target, uid if not whole else -1, gid if not whole else -1)
    finally:
        os.close(top)
    if os.getuid() == 0:
        for folder, dirs, files in os.walk(target):
            for name in (".", *dirs, *files):
                os.chown(Path(folder) / name, uid, gid, follow_symlinks=False)


def _copy_folder(folder: int, into: Path, uid: int, gid: int) -> None:
    for entry in os.scandir(folder):
        info = entry.stat(follow_symlinks=False)
        if uid >= 0 and not permits(info, uid, gid, "r") and not stat.S_ISLNK(info.st_mode):
            continue  # not the worker's to read
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(entry.name, dir_fd=folder), into / entry.name)
            continue
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            continue  # FIFOs, sockets, devices: never opened
        opened_entry = open_entry(folder, entry.name, info)
        if opened_entry is None:
            continue  # swapped for a link or something else, or gone
        fd, opened = opened_entry
        try:
            if stat.S_ISDIR(opened.st_mode):
                if uid < 0 or permits(opened, uid, gid, "rx"):
                    (into / entry.name).mkdir(mode=0o700)
                    _copy_folder(fd, into / entry.name, uid, gid)
            elif stat.S_ISREG(opened.st_mode):
                with open(into / entry.name, "xb") as out, os.fdopen(os.dup(fd), "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.chmod(into / entry.name, opened.st_mode & 0o755)
        finally:
            os.close(fd)


def open_audit(project: Project) -> AuditLog:
    """The project's audit log, in its private sandbox root."""
    private(project.sandbox_root)
    return AuditLog(project.sandbox_root / AUDIT_FILE)


def private(folder: Path) -> None:
    """The sandbox root: created 0700, since it holds every session and the audit log."""
    if not folder.exists():
        folder.mkdir(mode=0o700, parents=True)


def project_owner(root: Path) -> tuple[int, int]:
    """The project folder's owner: who gets the files a worker made, when root runs it."""
    info = root.stat()
    return info.st_uid, info.st_gid


def owned_folder(folder: Path, uid: int, gid: int) -> None:
    """Create ``folder`` for the worker's uid, each missing folder made in the one above
    it, never through a symlink (a worker may have planted one on the way)."""
    try:
        parent = open_path(folder.parent, create=0o777)  # as mkdir -p: the umask applies
    except PathRefused as refused:
        raise OrchestratorError(
            f"{folder} would be created through {refused.reason}; refusing "
            "(a worker may have planted it)"
        ) from None
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder.name, 0o700, dir_fd=parent)
        fd = os.open(folder.name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise OrchestratorError(f"{folder} cannot be made a folder here: {exc.strerror}") from None
    finally:
        os.close(parent)
    try:
        if os.getuid() == 0 and os.fstat(fd).st_uid != uid:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def check_zone(zone: ZoneGrant, uid: int, gid: int) -> None:
    """Refuse a mount source that is missing, not a folder, reached through a symlink, or
    unusable by the worker's uid: a clear message now instead of a confusing failure inside."""
    path = zone.host_path
    label = f"zone '{zone.name}' ({zone.target})"
    try:
        fd = open_path(path, file_ok=True)
    except PathRefused as refused:
        if refused.missing:
            raise OrchestratorError(
                f"{label}: {path} does not exist; create it or fix the zone's path"
            ) from None
        if refused.link is not None:
            raise OrchestratorError(
                f"{label}: {refused.reason}, on the zone's path; refusing to mount it (a "
                f"worker may have planted it): remove it and check what it pointed at"
            ) from None
        raise OrchestratorError(f"{label}: {refused.reason}; fix the zone's path") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if zone.target == "/repo/.git" or zone.guard:
        return  # a file or folder, mounted read-only; its own permissions apply
    if not stat.S_ISDIR(info.st_mode):
        raise OrchestratorError(f"{label}: {path} is not a folder; fix its path")
    if os.geteuid() == 0:
        return  # root gives the worker's uid what the grant says (runtime.access)
    needed = "rx" if zone.read_only else "rwx"
    if not permits(info, uid, gid, needed):
        raise OrchestratorError(
            f"{label}: {path} is not {'readable' if zone.read_only else 'writable'} by uid "
            f"{uid} (the worker's user); `chown {uid}:{gid} {path}`, or run the orchestrator "
            "as the folder's owner"
        )
