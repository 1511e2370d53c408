"""``orchestrator session``: live sandboxes that outlive one command.

``start`` spawns a detached owner process (the hidden ``session serve``, started by
:mod:`orchestrator.runtime.owners`, as the ``branch`` tool's forks are) that opens the
session and answers on a private control socket (see
:mod:`orchestrator.runtime.session_server`); ``exec``, ``cp``, ``list``, ``pause``,
``resume``, ``snapshot`` and ``stop`` talk to it; ``fork`` starts owners of its own
(``session serve --fork SNAPSHOT``), and ``orchestrator snapshot`` lists and removes the
project's snapshots (:mod:`orchestrator.runtime.snapshots`). Exit codes follow ``run``:
the command's own code for ``exec`` (124 on timeout), 125 for the orchestrator's errors.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.options import (
    json_option,
    parse_duration_option,
    project_option,
    signals_interrupt,
    timeout_seconds,
)
from orchestrator.cli.terminal import WorkerOutput, raw_option, shown
from orchestrator.errors import OrchestratorError
from orchestrator.exits import Exit
from orchestrator.vocabulary import TRUST_ORDER

if TYPE_CHECKING:
    from orchestrator.config import Project

REMOTE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,63}):(/.*)$")


class SessionCliError(OrchestratorError):
    """A session command failed before or outside the session's own operations."""


def _project(project_dir: Path) -> Project:
    from orchestrator.config import load_project

    return load_project(project_dir)


@contextlib.contextmanager
def _owner(project_dir: Path, session_id: str) -> Iterator[Any]:
    """A connection to the live owner of ``session_id``; one clear error otherwise."""
    from orchestrator.runtime.session_server import connect, control_dir

    with control_dir(_project(project_dir)) as fd:
        sock = connect(fd, session_id) if fd is not None and "/" not in session_id else None
    if sock is None:
        raise SessionCliError(
            f"no live session '{session_id}' in {project_dir}; see `orchestrator session list`"
        )
    with sock:
        yield sock


def _ask(project_dir: Path, session_id: str, message: dict[str, Any], **kw: Any) -> Any:
    from orchestrator.runtime.session_server import request

    with _owner(project_dir, session_id) as sock:
        return request(sock, message, **kw)


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, sort_keys=True, default=str))


def _say(message: str) -> None:
    click.echo(f"orchestrator: {shown(message)}", err=True)


@click.group()
def session() -> None:
    """Live sandboxes: start one, run commands and copy files in it, pause, snapshot and
    fork it, stop it."""


def _open_options(func: Any) -> Any:
    options = [
        project_option,
        click.option(
            "--trust",
            type=click.Choice(TRUST_ORDER),
            help="Open the session at this trust level (only lower than declared, unless "
            "--promote).",
        ),
        click.option("--promote", is_flag=True, help="Allow --trust above the declared level."),
        click.option("--workspace", default="default", show_default=True, help="Workspace name."),
        click.option("--session", "session_id", help="Reuse this session folder (default: new)."),
        click.option(
            "--snapshots",
            is_flag=True,
            default=None,
            help="Open it for snapshots: under gVisor a writable root (image_user) runs where "
            "a snapshot reads it (docs/sessions.md).",
        ),
        click.option(
            "--idle-timeout",
            default="15m",
            show_default=True,
            callback=parse_duration_option,
            help="Close after this long without an operation (e.g. 90s, 15m; 'never').",
        ),
        click.option(
            "--max-lifetime",
            default="8h",
            show_default=True,
            callback=parse_duration_option,
            help="Close after this long in any case (e.g. 8h; 'never').",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@session.command()
@click.argument("worker")
@_open_options
@json_option("Print the session (id, run id, worker, trust, zones) as one JSON object.")
def start(worker: str, project_dir: Path, as_json: bool, **options: Any) -> None:
    """Open a live sandbox for WORKER, owned by a background process; print its id."""
    from orchestrator.runtime.owners import start_owner

    info = start_owner(_project(project_dir), worker, options)
    if as_json:
        _emit(info)
    else:
        zones = ", ".join(f"{z['path']} {z['mode']}" for z in info["zones"]) or "none"
        _say(f"session {info['id']} (run {info['run_id']}): worker {info['worker']}, trust "
             f"{info['trust']}, zones: {zones}; owner pid {info['pid']}")  # fmt: skip
        click.echo(info["id"])


@session.command(hidden=True)
@click.argument("worker")
@_open_options
@click.option("--ready-fd", type=int, required=True)
@click.option("--log", "log_path", type=click.Path(path_type=Path), required=True)
@click.option("--fork", "fork_from", help="Start the session from this snapshot.")
def serve(
    worker: str,
    project_dir: Path,
    ready_fd: int,
    log_path: Path,
    fork_from: str | None,
    **options: Any,
) -> None:
    """The owner process of one session (started by ``session start``)."""
    import logging
    import threading

    from orchestrator.runner import Orchestrator
    from orchestrator.runtime.session_server import SessionServer, control_dir, describe

    logging.basicConfig(level=logging.WARNING, format="orchestrator: %(name)s: %(message)s")

    def tell(answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, json.dumps(answer).encode() + b"\n")
            os.close(ready_fd)

    try:
        orch = Orchestrator(project_dir)
        with signals_interrupt():  # a signal while the container starts still removes it
            if fork_from is not None:
                timeouts = {k: options[k] for k in ("idle_timeout", "max_lifetime")}
                opened = orch.fork(fork_from, 1, **timeouts)[0]
            else:
                opened = orch.open_session(worker, **options)
    except BaseException as exc:  # noqa: BLE001 - whatever it was, start must hear it
        tell({"error": _one_line(exc)})
        raise SystemExit(Exit.ERROR) from None
    with opened as live, control_dir(orch.project, create=True) as fd:
        assert fd is not None
        try:
            server = SessionServer(live, fd)
        except OrchestratorError as exc:
            tell({"error": _one_line(exc)})
            raise SystemExit(Exit.ERROR) from None
        with contextlib.suppress(OSError):
            os.rename(log_path, log_path.with_name(f"{live.id}.log"))

        def stop(signum: int, _frame: FrameType | None) -> None:
            server.stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, stop)
        live.handed_over()  # its idle timeout counts from here
        tell({"ready": describe(live)})
        threading.current_thread().name = f"owner-{live.id}"
        server.serve()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # finish closing regardless
    result = live.close()
    server.finish(10.0)
    if not result.container_removed:
        _say(f"session {live.id} closed; CONTAINER NOT REMOVED")
        raise SystemExit(Exit.ERROR)
    _say(f"session {live.id} closed; container removed")
    with contextlib.suppress(OSError):  # a clean end leaves no log behind
        os.unlink(log_path.with_name(f"{live.id}.log"))


def _one_line(exc: BaseException) -> str:
    from orchestrator.errors import ConfigError
    from orchestrator.runtime import Interrupted

    if isinstance(exc, ConfigError):
        return "; ".join(exc.problems)
    if isinstance(exc, Interrupted):
        return f"interrupted by signal {exc.signum} while opening; container removed"
    if isinstance(exc, OrchestratorError | OSError):
        return str(exc).replace("\n", "; ")
    return f"{type(exc).__name__}: {exc}".replace("\n", "; ")


@session.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("session_id", metavar="ID")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@project_option
@click.option("--timeout", type=timeout_seconds, help="Seconds (at most a week).")
@click.option("--cwd", help="Working folder inside the sandbox.")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="Set a variable.")
@click.option(
    "--resume",
    is_flag=True,
    help="If the session is paused, resume it first (without it, the call is refused).",
)
@json_option("Print the command's result (exit code, output, flags) as one JSON object.")
@raw_option
def exec_(
    session_id: str,
    command: tuple[str, ...],
    project_dir: Path,
    timeout: float | None,
    cwd: str | None,
    env_pairs: tuple[str, ...],
    resume: bool,
    as_json: bool,
) -> None:
    """Run COMMAND in session ID (write it after --); exit with its own exit code.

    On a terminal, escape sequences and invisible or bidirectional control characters in
    its output are shown escaped (\\x1b, \\u202e), never obeyed; --raw passes them through.
    Pipes and files get its bytes unchanged.
    """
    env = {}
    for pair in env_pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"'{pair}' is not K=V", param_hint="--env")
        env[name] = value
    message: dict[str, Any] = {"op": "exec", "argv": list(command), "cwd": cwd,
                               "env": env or None, "timeout": timeout}  # fmt: skip
    if resume:
        message["resume"] = True
    if not sys.stdin.isatty():
        data = sys.stdin.buffer.read()
        message["stdin"] = base64.b64encode(data).decode() if data else None
    stdout = sys.stderr.buffer if as_json else sys.stdout.buffer
    output = WorkerOutput(stdout, sys.stderr.buffer)

    def echo(event: dict[str, Any]) -> None:
        stream = "stdout" if event.get("stream") == "stdout" else "stderr"
        output.write(stream, base64.b64decode(event["data"]))

    try:
        result = _ask(project_dir, session_id, message, on_event=echo)
    finally:
        output.close()
    if as_json:
        _emit(result)
    raise SystemExit(int(result["exit_code"]))


@session.command()
@click.argument("source")
@click.argument("destination")
@project_option
def cp(source: str, destination: str, project_dir: Path) -> None:
    """Copy a file between the host and a session: one side is ID:/path (the path the
    worker sees, e.g. abc123:/session/notes.md), the other a host file."""
    from orchestrator.runtime.session_server import MAX_COPY

    src, dst = REMOTE.match(source), REMOTE.match(destination)
    if bool(src) == bool(dst):
        raise SessionCliError(
            "session cp copies between the host and a session: write exactly one side as "
            "ID:/path, e.g. `orchestrator session cp notes.md abc123:/session/notes.md`"
        )
    if dst:
        data = _read_host(Path(source), MAX_COPY, _guarded(project_dir))
        message = {"op": "write", "path": dst.group(2), "data": base64.b64encode(data).decode()}
        result = _ask(project_dir, dst.group(1), message)
        review = " (kept for review)" if result.get("review") else ""
        _say(f"copied {len(data)} bytes to {dst.group(2)}{review}")
        return
    assert src is not None
    encoded = _ask(project_dir, src.group(1), {"op": "read", "path": src.group(2),
                                               "limit": MAX_COPY})  # fmt: skip
    data = base64.b64decode(encoded)
    name = src.group(2).rstrip("/").rsplit("/", 1)[-1]
    target = _write_host(Path(destination), name, data, _guarded(project_dir))
    _say(f"copied {len(data)} bytes to {target}")


def _guarded(project_dir: Path) -> list[Path]:
    """The host folders a worker may have put links in: the project, its zones, its
    sandbox root (real paths)."""
    from orchestrator.config import load_project

    project = load_project(project_dir)
    zones = [zone.host_path for zone in project.zones.values()]
    return [project.root, project.sandbox_root, *zones]


@contextlib.contextmanager
def _parent(path: Path, guarded: list[Path], verb: str, *, follow_last: bool) -> Iterator[Any]:
    """The folder holding ``path`` (no link a worker could have made followed) and the
    name in it; one clear error otherwise."""
    from orchestrator.hostfs.hostpath import HostPathError, open_parent

    try:
        fd, name = open_parent(path, guarded, follow_last=follow_last)
    except HostPathError as exc:
        raise SessionCliError(f"cannot {verb} {path}: {exc}") from None
    except OSError as exc:
        raise SessionCliError(f"cannot {verb} {path}: {exc.strerror}") from None
    try:
        yield fd, name
    finally:
        os.close(fd)


def _read_host(path: Path, limit: int, guarded: list[Path]) -> bytes:
    from orchestrator.sandbox.nofollow import WalkError, open_regular

    with _parent(path, guarded, "read", follow_last=True) as (folder, name):
        try:
            fd, info = open_regular(folder, name or ".", str(path))
        except WalkError as exc:
            raise SessionCliError(f"cannot copy: {exc.detail}") from None
        except OSError as exc:
            raise SessionCliError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise SessionCliError(
                f"cannot copy {path}: {info.st_size} bytes is more than the {limit} one copy "
                "may carry"
            )
        return handle.read(limit + 1)[:limit]


def _write_host(path: Path, name: str, data: bytes, guarded: list[Path]) -> Path:
    """Write ``data`` to the host file ``path`` (or ``path/name`` for a folder), never
    through a link: the new content replaces the file by rename, a link is refused."""
    from orchestrator.hostfs.entries import lookup
    from orchestrator.hostfs.hostpath import HostPathError
    from orchestrator.sandbox.nofollow import WalkError, replace_file

    with _parent(path, guarded, "write", follow_last=False) as (folder, last):
        info = lookup(folder, last) if last else os.fstat(folder)
        fd = os.dup(folder)
        try:
            if info is not None and stat.S_ISDIR(info.st_mode):
                if last:
                    fd = _enter(fd, last, path)
                path, last = path / name, name
                info = lookup(fd, last)
            if info is not None and stat.S_ISLNK(info.st_mode):
                raise SessionCliError(
                    f"cannot write {path}: it is a symbolic link; name another file"
                )
            if info is not None and not stat.S_ISREG(info.st_mode):
                raise SessionCliError(f"cannot write {path}: it is not a regular file")
            replace_file(fd, last, data, str(path), None)
        except WalkError as exc:
            raise SessionCliError(f"cannot write: {exc.detail}") from None
        except HostPathError as exc:
            raise SessionCliError(f"cannot write {path}: {exc}") from None
        except OSError as exc:
            raise SessionCliError(f"cannot write {path}: {exc.strerror}") from None
        finally:
            os.close(fd)
    return path


def _enter(fd: int, name: str, shown: Path) -> int:
    """The folder ``name`` in ``fd`` (never through a link); ``fd`` is closed."""
    from orchestrator.hostfs.flags import DIR_FLAGS
    from orchestrator.hostfs.hostpath import HostPathError

    try:
        child = os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise HostPathError(f"{shown} changed while being opened ({exc.strerror})") from None
    os.close(fd)
    return child


@session.command()
@click.argument("session_id", metavar="ID")
@click.argument("tool")
@click.argument("arguments", default="{}")
@project_option
@click.option(
    "--wait",
    default="10m",
    show_default=True,
    callback=parse_duration_option,
    help="How long a call that needs approval waits for a person (e.g. 90s, 10m).",
)
def call(session_id: str, tool: str, arguments: str, project_dir: Path, wait: float | None) -> None:
    """Call sandbox TOOL (list, read, write, delete, stat, exec, stage, context, checkpoint,
    branch)
    in session ID with ARGUMENTS, a JSON object; print the answer as JSON, exit 1 if it is a
    refusal.

    A call that needs approval waits for a person: the review console's Approvals page, or
    `orchestrator session answer`; unanswered within --wait it is declined."""
    try:
        args = json.loads(arguments)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="ARGUMENTS") from None
    if not isinstance(args, dict):
        raise click.BadParameter("must be a JSON object", param_hint="ARGUMENTS")

    def waiting(event: dict[str, Any]) -> None:
        asked = event.get("approval") or {}
        _say(f"waiting for approval {asked.get('id')}: {asked.get('description')}; answer it "
             f"in `orchestrator review` or with `orchestrator session answer {session_id} "
             f"{asked.get('id')} --approve`")  # fmt: skip

    message = {"op": "tool", "name": tool, "args": args,
               "wait": wait if wait is not None else 7 * 86400.0}  # fmt: skip
    answer = _ask(project_dir, session_id, message, on_event=waiting)
    _emit(answer)
    raise SystemExit(0 if answer.get("ok") else 1)


@session.command()
@click.argument("session_id", metavar="ID")
@click.argument("request_id", metavar="REQUEST")
@project_option
@click.option("--approve/--deny", required=True, help="Let the call run once, or refuse it.")
def answer(session_id: str, request_id: str, project_dir: Path, approve: bool) -> None:
    """Answer call REQUEST of session ID that waits for approval (audited with your name)."""
    import getpass

    _ask(project_dir, session_id, {"op": "answer", "id": request_id, "approve": approve,
                                   "by": getpass.getuser(), "via": "command line"})  # fmt: skip
    _say(f"{'approved' if approve else 'denied'} {request_id} in session {session_id}")


@session.command("list")
@project_option
@json_option("Print the live sessions as a JSON list.")
def list_(project_dir: Path, as_json: bool) -> None:
    """The project's live sessions (id, worker, trust, age, idle); stale sockets of dead
    owners are removed."""
    from orchestrator.runtime.session_folders import human_age
    from orchestrator.runtime.session_server import SUFFIX, connect, control_dir, request

    found = []
    with control_dir(_project(project_dir)) as fd:
        names = sorted(n for n in os.listdir(fd) if n.endswith(SUFFIX)) if fd is not None else []
        for name in names:
            assert fd is not None
            sock = connect(fd, name.removesuffix(SUFFIX))
            if sock is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
                continue
            with sock:
                try:
                    found.append(request(sock, {"op": "info"}))
                except (OrchestratorError, OSError, ValueError):
                    continue
    if as_json:
        _emit(found)
        return
    if not found:
        _say("no live sessions")
    for info in found:
        paused = "  paused" if info.get("paused") else ""
        click.echo(f"{info['id']}  {info['worker']}  trust {info['trust']}  age "
                   f"{human_age(info['age_s'])}  idle {human_age(info['idle_s'])}"
                   f"{paused}")  # fmt: skip


@session.command()
@click.argument("session_id", metavar="ID")
@project_option
@json_option("Print the closed session's result as one JSON object.")
def stop(session_id: str, project_dir: Path, as_json: bool) -> None:
    """Close session ID: stage its outbox and ask zones, remove its container."""
    result = _ask(project_dir, session_id, {"op": "stop"})
    if as_json:
        _emit(result)
        return
    outbox = result.get("outbox") or {}
    if outbox.get("change_id"):
        _say(f"staged change set {outbox['change_id']} ({outbox.get('files', 0)} files): "
             f"review with `orchestrator staged show {outbox['change_id']}`")  # fmt: skip
    for asked in result.get("asked") or []:
        if asked.get("change_id"):
            _say(f"change set {asked['change_id']} for zone '{asked.get('zone')}' waits for "
                 f"approval: `orchestrator staged apply {asked['change_id']}`")  # fmt: skip
    removed = "container removed" if result.get("container_removed") else "CONTAINER NOT REMOVED"
    _say(f"session {session_id} closed; {removed}")


# -- pause, resume, snapshot, fork --------------------------------------------------------


@session.command()
@click.argument("session_id", metavar="ID")
@project_option
@json_option("Print {session, paused, seconds} as one JSON object.")
def pause(session_id: str, project_dir: Path, as_json: bool) -> None:
    """Freeze every process of session ID (no CPU) until `session resume`; other calls on
    it are refused meanwhile, and it does not count as idle."""
    result = _ask(project_dir, session_id, {"op": "pause"})
    if as_json:
        _emit(result)
    else:
        _say(f"session {session_id} paused ({result['seconds']:.3f} s); `orchestrator session "
             f"resume {session_id}` lets it go on")  # fmt: skip


@session.command()
@click.argument("session_id", metavar="ID")
@project_option
@json_option("Print {session, paused, seconds} as one JSON object.")
def resume(session_id: str, project_dir: Path, as_json: bool) -> None:
    """Let paused session ID's processes go on where they were."""
    result = _ask(project_dir, session_id, {"op": "resume"})
    if as_json:
        _emit(result)
    else:
        _say(f"session {session_id} resumed ({result['seconds']:.3f} s)")


@session.command("snapshot")
@click.argument("session_id", metavar="ID")
@project_option
@json_option("Print {snapshot, bytes, seconds, session, worker} as one JSON object.")
def snapshot_(session_id: str, project_dir: Path, as_json: bool) -> None:
    """Save session ID's own state (root, /tmp, session folders, recipe) as a snapshot of
    this project; print its id. The session goes on."""
    result = _ask(project_dir, session_id, {"op": "snapshot"})
    if as_json:
        _emit(result)
        return
    _say(f"snapshot {result['snapshot']} of session {session_id}: {result['bytes']} bytes in "
         f"{result['seconds']:.2f} s; `orchestrator session fork {result['snapshot']}` starts "
         "a session from it")  # fmt: skip
    click.echo(result["snapshot"])


@session.command()
@click.argument("source", metavar="ID_OR_SNAPSHOT")
@project_option
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 64),
              help="How many sessions to start.")  # fmt: skip
@click.option(
    "--idle-timeout",
    default="15m",
    show_default=True,
    callback=parse_duration_option,
    help="Close each after this long without an operation (e.g. 90s, 15m; 'never').",
)
@click.option(
    "--max-lifetime",
    default="8h",
    show_default=True,
    callback=parse_duration_option,
    help="Close each after this long in any case (e.g. 8h; 'never').",
)
@json_option("Print {sessions, snapshot, seconds} as one JSON object.")
def fork(
    source: str,
    project_dir: Path,
    count: int,
    idle_timeout: float | None,
    max_lifetime: float | None,
    as_json: bool,
) -> None:
    """Start COUNT independent sessions from a snapshot, or from live session ID (a
    snapshot of it is taken first); print their ids."""
    from orchestrator.runtime.owners import start_forks
    from orchestrator.runtime.snapshots import ID, get

    started = time.monotonic()
    if ID.match(source):
        snap_id = source
    else:
        snap_id = str(_ask(project_dir, source, {"op": "snapshot"})["snapshot"])
    project = _project(project_dir)
    snap = get(project, snap_id)
    options = {"idle_timeout": idle_timeout, "max_lifetime": max_lifetime}
    made = start_forks(project, snap.worker, snap_id, count, options)
    result = {"sessions": made, "snapshot": snap_id,
              "seconds": round(time.monotonic() - started, 3)}  # fmt: skip
    if as_json:
        _emit(result)
        return
    _say(f"{len(made)} session(s) from snapshot {snap_id}")
    for fork_id in made:
        click.echo(fork_id)


@click.group()
def snapshot() -> None:
    """Snapshots of live sessions: list them, remove them (`session snapshot` takes one,
    `session fork` starts sessions from one)."""


@snapshot.command("list")
@project_option
@json_option("Print the snapshots as a JSON list of {id, bytes, created, session, worker}.")
def snapshot_list(project_dir: Path, as_json: bool) -> None:
    """The project's snapshots, oldest first: id, worker, size, when taken (and how long
    ago), the session it was taken of."""
    from orchestrator.config import load_project
    from orchestrator.runtime.snapshots import list_snapshots

    found = [snap.summary() for snap in list_snapshots(load_project(project_dir))]
    if as_json:
        _emit(found)
        return
    if not found:
        _say("no snapshots")
    for item in found:
        click.echo(f"{item['id']}  {item['worker']}  {item['bytes']} bytes  {item['created']} "
                   f"({_age(item['created'])} ago)  session {item['session']}")  # fmt: skip


def _age(created: str) -> str:
    """How long ago an ISO time was, as ``session list`` shows ages (``?`` if unreadable)."""
    from datetime import UTC, datetime

    from orchestrator.runtime.session_folders import human_age

    try:
        then = datetime.fromisoformat(created)
    except (TypeError, ValueError):
        return "?"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return human_age(max(0.0, (datetime.now(UTC) - then).total_seconds()))


@snapshot.command("rm")
@click.argument("snapshot_id", metavar="ID", required=False)
@project_option
@click.option(
    "--older-than",
    "older_than",
    callback=parse_duration_option,
    help="Instead of ID: every snapshot taken longer ago than this (e.g. 7d, 12h).",
)
@json_option("Print the removed snapshot (with --older-than: a list of them) as JSON.")
def snapshot_rm(
    snapshot_id: str | None, project_dir: Path, older_than: float | None, as_json: bool
) -> None:
    """Remove snapshot ID, or those older than --older-than: image and folder (forks
    already started go on)."""
    from orchestrator.runner import Orchestrator

    if (snapshot_id is None) == (older_than is None):
        raise SessionCliError(
            "name one snapshot (`orchestrator snapshot rm ID`) or give --older-than AGE"
        )
    with Orchestrator(project_dir) as orch:
        if snapshot_id is not None:
            removed = [orch.remove_snapshot(snapshot_id)]
        else:
            assert older_than is not None
            removed = orch.prune_snapshots(older_than)
    if as_json:
        _emit(removed[0].summary() if snapshot_id else [r.summary() for r in removed])
        return
    for snap in removed:
        _say(f"removed snapshot {snap.id} ({snap.bytes} bytes)")
    if not removed:
        _say("no snapshot is that old")
