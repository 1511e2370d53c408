"""The E2B server's routes (Starlette): E2B's REST API and the in-sandbox API.

REST calls carry the server's key (``X-API-Key``); in-sandbox calls name their sandbox
(``E2b-Sandbox-Id``) and carry the access token its create answered with
(``X-Access-Token``); both compared in constant time. Answers are E2B's own shapes:
``{"code", "message"}`` for REST errors, Connect's errors for RPCs; an unexpected
failure is logged and answered with a one-line 500, never a traceback.

Commands run by the session's exec (as the worker's uid); files move by exec too, with
the fixed scripts of :mod:`orchestrator.integrations.transfer` (the path is an argument,
never shell text), so the SDK sees the container as its commands do, zones and their
modes included.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import secrets
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator.e2b import lifecycle, processes, watches, wire
from orchestrator.e2b.metrics import metrics as sandbox_metrics
from orchestrator.e2b.sandboxes import Refused, Sandbox, Sandboxes, Watcher
from orchestrator.e2b.wire import ConnectFailure
from orchestrator.errors import OrchestratorError
from orchestrator.integrations import transfer

log = logging.getLogger(__name__)

__all__ = ["make_app"]

#: The largest file moved in or out through ``/files`` (bytes).
MAX_FILE = 256 << 20
#: The most output kept of one stream of a command (bytes).
MAX_OUTPUT = 64 << 20
#: How long a file operation's exec may take (seconds).
FILE_TIMEOUT = 120.0
#: How deep a recursive watch looks, and how many watchers a sandbox may have.
WATCH_DEPTH = 32
MAX_WATCHERS = 64
#: The in-sandbox paths (everything else is the REST API).
_SANDBOX_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
_SANDBOX_PATHS = ("/files", "/health")

_LIST = (
    transfer._PATH + 'if [ ! -d "$1" ]; then '
    'if [ -e "$1" ]; then printf "%s: Not a directory\\n" "$1" >&2; '
    'else printf "%s: No such file or directory\\n" "$1" >&2; fi; exit 1; fi; '
    f'exec find "$1" -mindepth 1 -maxdepth "$2" -printf \'{wire.FIND_FORMAT}\''
)
_STAT = (
    transfer._PATH + 'if [ ! -e "$1" ] && [ ! -L "$1" ]; then '
    'printf "%s: No such file or directory\\n" "$1" >&2; exit 1; fi; '
    f"exec find \"$1\" -maxdepth 0 -printf '{wire.FIND_FORMAT}'"
)
_MKDIR = (
    transfer._PATH + 'if [ -e "$1" ] || [ -L "$1" ]; then '
    'printf "%s: File exists\\n" "$1" >&2; exit 1; fi; mkdir -p -- "$1" && '
    f"exec find \"$1\" -maxdepth 0 -printf '{wire.FIND_FORMAT}'"
)
_REMOVE = (
    transfer._PATH + 'if [ ! -e "$1" ] && [ ! -L "$1" ]; then '
    'printf "%s: No such file or directory\\n" "$1" >&2; exit 1; fi; exec rm -rf -- "$1"'
)
#: Sends signal "$1" to the process groups of the command whose environment holds
#: ``E2B_PROCESS_ID="$2"`` (it and what it forked), as the worker: found through /proc.
_SIGNAL = (
    transfer._PATH + 'want="E2B_PROCESS_ID=$2"; found=1; '
    "for d in /proc/[0-9]*; do "
    'tr "\\000" "\\n" < "$d/environ" 2>/dev/null | grep -qx -- "$want" || continue; '
    'read -r stat < "$d/stat" || continue; rest=${stat##*) }; set -- "$1" "$2" $rest; '
    'kill -s "$1" -- "-$5" 2>/dev/null && found=0; done; exit $found'
)
_MOVE = (
    transfer._PATH + 'mkdir -p -- "$(dirname -- "$2")" && mv -T -- "$1" "$2" && '
    f"exec find \"$2\" -maxdepth 0 -printf '{wire.FIND_FORMAT}'"
)

#: The signals E2B's process service sends (its enum, by name or number), as kill's names.
_SIGNALS: dict[Any, str] = {
    "SIGNAL_SIGTERM": "TERM",
    15: "TERM",
    "SIGNAL_SIGKILL": "KILL",
    9: "KILL",
}

#: What each failure of a script becomes, as a Connect code and an HTTP status.
_CODES: tuple[tuple[type[OSError], str, int], ...] = (
    (FileNotFoundError, "not_found", 404),
    (FileExistsError, "already_exists", 409),
    (PermissionError, "permission_denied", 403),
    (IsADirectoryError, "invalid_argument", 400),
    (NotADirectoryError, "invalid_argument", 400),
)


def _code_of(exc: OSError) -> tuple[str, int]:
    for kind, code, status in _CODES:
        if isinstance(exc, kind):
            return code, status
    return "internal", 500


def make_app(sandboxes: Sandboxes, key: str) -> Starlette:
    """The server's application over ``sandboxes``, every REST call checked against
    ``key``."""

    def api_ok(request: Request) -> bool:
        given = request.headers.get("x-api-key")
        return given is not None and hmac.compare_digest(given.encode(), key.encode())

    # -- REST -----------------------------------------------------------------------------

    async def create(request: Request) -> Response:
        body = await _json_object(request)
        if lifecycle.is_snapshot(body.get("templateID")):
            sandbox = await asyncio.to_thread(lifecycle.create_from_snapshot, sandboxes, body)
        else:
            sandbox = await asyncio.to_thread(sandboxes.create, body)
        return JSONResponse(_created(sandbox), status_code=201)

    async def listed(request: Request) -> Response:
        wanted = request.query_params.get("state")
        states = set(wanted.split(",")) if wanted else {"running", "paused"}
        filters = _metadata_filter(request.query_params.get("metadata"))
        out = [
            detail
            for s in sandboxes.all()
            if all(s.metadata.get(k) == v for k, v in filters.items())
            and (detail := s.detail())["state"] in states
        ]
        return JSONResponse(out)

    async def info(request: Request) -> Response:
        sandbox = sandboxes.get(request.path_params["sandbox_id"])
        return JSONResponse({**sandbox.detail(), "envdAccessToken": sandbox.token})

    async def kill(request: Request) -> Response:
        await asyncio.to_thread(sandboxes.kill, request.path_params["sandbox_id"])
        return Response(status_code=204)

    async def set_timeout(request: Request) -> Response:
        body = await _json_object(request)
        if body.get("timeout") is None:
            raise Refused(400, "timeout: give the sandbox's new timeout in seconds")
        sandboxes.set_timeout(request.path_params["sandbox_id"], body.get("timeout"))
        return Response(status_code=204)

    async def connect(request: Request) -> Response:
        body = await _json_object(request)
        sandbox_id = request.path_params["sandbox_id"]
        sandbox, resumed = await asyncio.to_thread(lifecycle.connect, sandboxes, sandbox_id, body)
        return JSONResponse(_created(sandbox), status_code=201 if resumed else 200)

    async def pause(request: Request) -> Response:
        body = await _json_object(request)
        sandbox_id = request.path_params["sandbox_id"]
        await asyncio.to_thread(lifecycle.pause, sandboxes, sandbox_id, body)
        return Response(status_code=204)

    async def snapshot(request: Request) -> Response:
        body = await _json_object(request)
        sandbox_id = request.path_params["sandbox_id"]
        made = await asyncio.to_thread(lifecycle.snapshot, sandboxes, sandbox_id, body)
        return JSONResponse(made, status_code=201)

    async def snapshots(request: Request) -> Response:
        query = dict(request.query_params)
        return JSONResponse(await asyncio.to_thread(lifecycle.list_snapshots, sandboxes, query))

    async def delete_template(request: Request) -> Response:
        template_id = request.path_params["template_id"]
        if not lifecycle.is_snapshot(template_id):
            return await unsupported(request)
        await asyncio.to_thread(lifecycle.delete_snapshot, sandboxes, template_id)
        return Response(status_code=204)

    async def metrics(request: Request) -> Response:
        sandbox_id, query = request.path_params["sandbox_id"], dict(request.query_params)
        return JSONResponse(await asyncio.to_thread(sandbox_metrics, sandboxes, sandbox_id, query))

    async def fork(request: Request) -> Response:
        body = await _json_object(request)
        sandbox_id = request.path_params["sandbox_id"]
        forks = await asyncio.to_thread(lifecycle.fork, sandboxes, sandbox_id, body)
        return JSONResponse([{"sandbox": _created(s)} for s in forks], status_code=201)

    async def unsupported(request: Request) -> Response:
        raise Refused(
            501,
            f"{request.method} {request.url.path}: not supported by orchestrator's E2B "
            "server yet (docs/e2b.md lists what is)",
        )

    # -- in the sandbox -------------------------------------------------------------------

    async def health(request: Request, sandbox: Sandbox) -> Response:
        return Response(status_code=204)

    async def files_get(request: Request, sandbox: Sandbox) -> Response:
        path = _file_path(request, sandbox)
        capture = transfer.Capture(MAX_FILE, 64 << 10)
        result = await _exec(sandbox, ["/bin/sh", "-c", transfer.READ, "sh", path], capture)
        if result.exit_code != 0:
            raise _file_failure(path, capture.text("stderr"), "read")
        return Response(bytes(capture.data["stdout"]), media_type="application/octet-stream")

    async def files_post(request: Request, sandbox: Sandbox) -> Response:
        uploads = await _uploads(request)
        written = []
        for path, data in uploads:
            path = _absolute(path, sandbox)
            capture = transfer.Capture(64 << 10, 64 << 10)
            result = await _exec(
                sandbox, ["/bin/sh", "-c", transfer.WRITE, "sh", path], capture, stdin=data
            )
            if result.exit_code != 0:
                raise _file_failure(path, capture.text("stderr"), "write")
            written.append({"name": path.rsplit("/", 1)[-1], "type": "file", "path": path})
        return JSONResponse(written)

    async def process_start(request: Request, sandbox: Sandbox) -> Response:
        messages = list(wire.unframe(await request.body()))
        message = messages[0] if messages else {}
        config = message.get("process") or {}
        if not isinstance(config, dict):
            raise ConnectFailure("invalid_argument", "process: give a ProcessConfig object")
        cmd = config.get("cmd")
        args = config.get("args") or []
        envs = config.get("envs") or {}
        if not isinstance(cmd, str) or not cmd or not isinstance(args, list):
            raise ConnectFailure("invalid_argument", "process.cmd: give the program to run")
        if not isinstance(envs, dict):
            raise ConnectFailure("invalid_argument", "process.envs: give an object of strings")
        argv = [cmd, *(str(a) for a in args)]
        cwd = config.get("cwd") or None
        timeout = _deadline(request)
        env = {str(k): str(v) for k, v in envs.items()}
        shown = {"cmd": cmd, "args": argv[1:], "envs": env, **({"cwd": cwd} if cwd else {})}
        tag = message.get("tag") if isinstance(message.get("tag"), str) else None
        return StreamingResponse(
            processes.start_stream(
                sandbox,
                argv,
                cwd,
                env,
                timeout,
                shown,
                tag=tag,
                stdin=message.get("stdin") is True,
                pty=processes.split_size(message.get("pty")),
                keepalive=_keepalive(request),
            ),
            media_type="application/connect+json",
        )

    async def process_connect(request: Request, sandbox: Sandbox) -> Response:
        messages = list(wire.unframe(await request.body()))
        selector = (messages[0] if messages else {}).get("process")
        stream = processes.connect_stream(sandbox, selector, _keepalive(request))
        return StreamingResponse(stream, media_type="application/connect+json")

    async def watch_dir(request: Request, sandbox: Sandbox) -> Response:
        messages = list(wire.unframe(await request.body()))
        message = messages[0] if messages else {}
        path = _absolute(_str(message, "path"), sandbox)
        depth = WATCH_DEPTH if message.get("recursive") else 1
        stream = watches.watch_stream(sandbox, path, depth, _changes, _keepalive(request))
        return StreamingResponse(stream, media_type="application/connect+json")

    async def process_stream_input(request: Request, sandbox: Sandbox) -> Response:
        body = await processes.stream_input(sandbox, request.stream())
        return Response(body, media_type="application/connect+json")

    async def process_input(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        await processes.send_input(sandbox, message)
        return {}

    async def process_close_stdin(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        await processes.close_stdin(sandbox, message)
        return {}

    async def process_update(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        await processes.resize(sandbox, message)
        return {}

    async def process_list(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        with sandbox.lock:
            running = sorted(sandbox.running.items())
        return {"processes": [{"config": config, "pid": pid} for pid, config in running]}

    async def fs_stat(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        path = _absolute(_str(message, "path"), sandbox)
        return {"entry": (await _entries(sandbox, _STAT, [path]))[0].to_json()}

    async def fs_list(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        path = _absolute(_str(message, "path"), sandbox)
        depth = message.get("depth") or 1
        if not isinstance(depth, int) or depth < 1:
            raise ConnectFailure("invalid_argument", "depth: give a whole number from 1")
        entries = await _entries(sandbox, _LIST, [path, str(depth)])
        return {"entries": [e.to_json() for e in sorted(entries, key=lambda e: e.path)]}

    async def fs_make_dir(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        path = _absolute(_str(message, "path"), sandbox)
        return {"entry": (await _entries(sandbox, _MKDIR, [path]))[0].to_json()}

    async def fs_remove(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        path = _absolute(_str(message, "path"), sandbox)
        await _entries(sandbox, _REMOVE, [path])
        return {}

    async def fs_move(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        source = _absolute(_str(message, "source"), sandbox)
        destination = _absolute(_str(message, "destination"), sandbox)
        return {"entry": (await _entries(sandbox, _MOVE, [source, destination]))[0].to_json()}

    async def process_signal(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        selector = message.get("process") or {}
        pid = selector.get("pid") if isinstance(selector, dict) else None
        name = _SIGNALS.get(message.get("signal"))
        if name is None:
            raise ConnectFailure("invalid_argument", "signal: SIGNAL_SIGTERM or SIGNAL_SIGKILL")
        with sandbox.lock:
            known = isinstance(pid, int) and pid in sandbox.running
        if not known:
            raise ConnectFailure("not_found", f"process {pid!r} is not running")
        capture = transfer.Capture(64 << 10, 64 << 10)
        await _exec(sandbox, ["/bin/sh", "-c", _SIGNAL, "sh", name, str(pid)], capture)
        return {}

    async def watch_create(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        path = _absolute(_str(message, "path"), sandbox)
        depth = WATCH_DEPTH if message.get("recursive") else 1
        entries = await _entries(sandbox, _LIST, [path, str(depth)])
        watcher = Watcher(path, depth, _seen(entries))
        watcher_id = secrets.token_hex(8)
        with sandbox.lock:
            if len(sandbox.watchers) >= MAX_WATCHERS:
                raise ConnectFailure("resource_exhausted", f"more than {MAX_WATCHERS} watchers")
            sandbox.watchers[watcher_id] = watcher
        return {"watcherId": watcher_id}

    async def watch_events(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        watcher_id = message.get("watcherId")
        with sandbox.lock:
            watcher = sandbox.watchers.get(watcher_id) if isinstance(watcher_id, str) else None
        if watcher is None:
            raise ConnectFailure("not_found", f"watcher {watcher_id!r} not found")
        try:
            entries = await _entries(sandbox, _LIST, [watcher.path, str(watcher.depth)])
        except ConnectFailure as exc:
            if exc.code != "not_found":
                raise
            entries = []  # the folder itself went: everything in it is removed
        now = _seen(entries)
        events = _changes(watcher.path, watcher.seen, now)
        watcher.seen = now
        return {"events": events}

    async def watch_remove(message: dict[str, Any], sandbox: Sandbox) -> dict[str, Any]:
        watcher_id = message.get("watcherId")
        with sandbox.lock:
            gone = sandbox.watchers.pop(watcher_id, None) if isinstance(watcher_id, str) else None
        if gone is None:
            raise ConnectFailure("not_found", f"watcher {watcher_id!r} not found")
        return {}

    unary: dict[str, Callable[[dict[str, Any], Sandbox], Awaitable[dict[str, Any]]]] = {
        "/filesystem.Filesystem/CreateWatcher": watch_create,
        "/filesystem.Filesystem/GetWatcherEvents": watch_events,
        "/filesystem.Filesystem/RemoveWatcher": watch_remove,
        "/process.Process/List": process_list,
        "/process.Process/SendSignal": process_signal,
        "/process.Process/SendInput": process_input,
        "/process.Process/CloseStdin": process_close_stdin,
        "/process.Process/Update": process_update,
        "/filesystem.Filesystem/Stat": fs_stat,
        "/filesystem.Filesystem/ListDir": fs_list,
        "/filesystem.Filesystem/MakeDir": fs_make_dir,
        "/filesystem.Filesystem/Remove": fs_remove,
        "/filesystem.Filesystem/Move": fs_move,
    }
    plain: dict[tuple[str, str], Callable[[Request, Sandbox], Awaitable[Response]]] = {
        ("GET", "/health"): health,
        ("GET", "/files"): files_get,
        ("POST", "/files"): files_post,
        ("POST", "/process.Process/Start"): process_start,
        ("POST", "/process.Process/Connect"): process_connect,
        ("POST", "/process.Process/StreamInput"): process_stream_input,
        ("POST", "/filesystem.Filesystem/WatchDir"): watch_dir,
    }

    async def in_sandbox(request: Request) -> Response:
        path = request.url.path
        rpc = path.startswith(_SANDBOX_PREFIXES)
        try:
            sandbox_id = request.headers.get("e2b-sandbox-id", "")
            sandbox = sandboxes.find(sandbox_id)
            if sandbox is None or sandbox.session.closed:
                # E2B's edge answers 502 for a sandbox that is not running (the SDK's
                # is_running() reads it so)
                return JSONResponse(
                    wire.api_error(502, f"sandbox {sandbox_id!r} is not running"),
                    status_code=502,
                )
            if not sandbox.token_ok(request.headers.get("x-access-token")):
                raise ConnectFailure("unauthenticated", "a wrong access token for the sandbox")
            if sandbox.session.paused:  # not running until connect resumes it, as in E2B
                return JSONResponse(
                    wire.api_error(
                        502, f"sandbox {sandbox_id!r} is paused: Sandbox.connect resumes it"
                    ),
                    status_code=502,
                )
            _check_user(request, sandbox)
            handler = plain.get((request.method, path))
            if handler is not None:
                return await handler(request, sandbox)
            call = unary.get(path)
            if call is None or request.method != "POST":
                raise ConnectFailure(
                    "unimplemented",
                    f"{path}: not supported by orchestrator's E2B server yet (docs/e2b.md)",
                )
            message = wire.message_of(await request.body())
            return JSONResponse(await call(message, sandbox))
        except ConnectFailure as exc:
            status = wire.connect_status(exc.code)
            if rpc:
                return JSONResponse({"code": exc.code, "message": exc.message}, status_code=status)
            return JSONResponse(wire.api_error(status, exc.message), status_code=status)

    async def dispatch(request: Request) -> Response:
        path = request.url.path
        try:
            if path.startswith(_SANDBOX_PREFIXES) or path in _SANDBOX_PATHS:
                return await in_sandbox(request)
            if not api_ok(request):
                raise Refused(401, "Invalid API key: give the key `orchestrator e2b serve` printed")
            for method, pattern, handler in rest:
                params = _match(pattern, path)
                if params is not None and method == request.method:
                    request.scope["path_params"] = params
                    return await handler(request)
            for pattern in _UNSUPPORTED:
                if _match(pattern, path) is not None:
                    return await unsupported(request)
            raise Refused(404, f"{request.method} {path}: no such route")
        except Refused as exc:
            return JSONResponse(wire.api_error(exc.status, exc.message), status_code=exc.status)
        except Exception:  # a bug: logged here, never shown to the client as a traceback
            log.exception("e2b: %s %s failed", request.method, path)
            return JSONResponse(
                wire.api_error(500, "internal error (the server's log has the details)"),
                status_code=500,
            )

    rest: list[tuple[str, str, Callable[[Request], Awaitable[Response]]]] = [
        ("POST", "/v2/sandboxes", create),
        ("POST", "/sandboxes", create),
        ("GET", "/v2/sandboxes", listed),
        ("GET", "/sandboxes", listed),
        ("GET", "/sandboxes/{sandbox_id}", info),
        ("DELETE", "/sandboxes/{sandbox_id}", kill),
        ("POST", "/sandboxes/{sandbox_id}/timeout", set_timeout),
        ("POST", "/sandboxes/{sandbox_id}/connect", connect),
        ("POST", "/v2/sandboxes/{sandbox_id}/connect", connect),
        ("POST", "/sandboxes/{sandbox_id}/resume", connect),
        ("POST", "/sandboxes/{sandbox_id}/pause", pause),
        ("POST", "/sandboxes/{sandbox_id}/snapshots", snapshot),
        ("POST", "/sandboxes/{sandbox_id}/fork", fork),
        ("GET", "/snapshots", snapshots),
        ("GET", "/sandboxes/{sandbox_id}/metrics", metrics),
        ("DELETE", "/templates/{template_id}", delete_template),
    ]
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", dispatch, methods=methods)])


#: REST routes of E2B's API that this server answers with 501 (not yet supported).
_UNSUPPORTED = (
    "/sandboxes/{id}/refreshes",
    "/sandboxes/{id}/logs",
    "/v2/sandboxes/{id}/logs",
    "/sandboxes/{id}/network",
    "/sandboxes/metrics",
    "/templates",
    "/v2/templates",
    "/v3/templates",
    "/templates/{id}",
    "/templates/{id}/{rest}",
    "/templates/{id}/{a}/{b}",
    "/templates/{id}/{a}/{b}/{c}",
    "/templates/{id}/{a}/{b}/{c}/{d}",
    "/default-templates",
    "/volumes",
    "/volumes/{id}",
    "/secrets",
)


def _seen(entries: list[wire.Entry]) -> dict[str, tuple[str, int, float]]:
    return {e.path: (e.kind, e.size, e.mtime) for e in entries}


def _changes(
    root: str, before: dict[str, tuple[str, int, float]], now: dict[str, tuple[str, int, float]]
) -> list[dict[str, Any]]:
    """The events between two looks at a watched folder, named relative to it: what
    appeared (create), changed size or time (write), went (remove). Changes between two
    looks are seen as one; something made and removed between them is not seen."""
    events = []
    prefix = root.rstrip("/") + "/"
    for path in sorted(set(before) | set(now)):
        if path not in before:
            kind = "EVENT_TYPE_CREATE"
        elif path not in now:
            kind = "EVENT_TYPE_REMOVE"
        elif before[path] != now[path]:
            kind = "EVENT_TYPE_WRITE"
        else:
            continue
        events.append({"name": path.removeprefix(prefix), "type": kind})
    return events


def _match(pattern: str, path: str) -> dict[str, str] | None:
    """``pattern``'s ``{name}`` parts of ``path`` (each one segment), or None."""
    want = pattern.strip("/").split("/")
    have = path.strip("/").split("/")
    if len(want) != len(have):
        return None
    params = {}
    for w, h in zip(want, have, strict=True):
        if w.startswith("{") and w.endswith("}"):
            if not h:
                return None
            params[w[1:-1]] = h
        elif w != h:
            return None
    return params


def _created(sandbox: Sandbox) -> dict[str, Any]:
    return {
        "templateID": sandbox.template,
        "sandboxID": sandbox.id,
        "alias": sandbox.template,
        "clientID": "orchestrator",
        "envdVersion": wire.ENVD_VERSION,
        "envdAccessToken": sandbox.token,
        "domain": None,
    }


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise Refused(400, "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the request body is not a JSON object")
    return body


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """The SDK's metadata filter (``k=v&k2=v2``, URL-encoded once more)."""
    from urllib.parse import parse_qsl, unquote

    return {unquote(k): unquote(v) for k, v in parse_qsl(raw or "")}


def _str(message: dict[str, Any], name: str) -> str:
    value = message.get(name)
    if not isinstance(value, str) or not value:
        raise ConnectFailure("invalid_argument", f"{name}: give a path")
    return value


def _absolute(path: str, sandbox: Sandbox) -> str:
    """A sandbox path; a relative one is below the worker's folder, as envd's are below
    the user's home."""
    if "\0" in path:
        raise ConnectFailure("invalid_argument", "a path cannot hold a NUL byte")
    return path if path.startswith("/") else f"{sandbox.session.spec.workdir.rstrip('/')}/{path}"


def _file_path(request: Request, sandbox: Sandbox) -> str:
    path = request.query_params.get("path")
    if not path:
        raise ConnectFailure("invalid_argument", "path: give the file's path")
    return _absolute(path, sandbox)


def _check_user(request: Request, sandbox: Sandbox) -> None:
    """Commands and files act as the worker's uid: a request naming another user (the
    RPCs' ``Authorization: Basic user:``, ``/files``' ``username``) is refused; E2B's
    default user's name, ``user``, stands for the worker."""
    header = request.headers.get("authorization", "")
    user = request.query_params.get("username", "")
    if header.lower().startswith("basic "):
        try:
            user = base64.b64decode(header[6:]).decode().split(":", 1)[0]
        except (binascii.Error, UnicodeDecodeError):
            raise ConnectFailure("invalid_argument", "Authorization: not Basic user:") from None
    spec = sandbox.session.spec
    if user and user not in (spec.user, str(spec.uid), "user"):
        raise ConnectFailure(
            "permission_denied",
            f"user {user!r}: commands and files act as the worker's own uid ({spec.uid}) only",
        )


def _deadline(request: Request) -> float | None:
    raw = request.headers.get("connect-timeout-ms")
    if raw is None:
        return None
    try:
        return max(int(raw), 1) / 1000.0
    except ValueError:
        raise ConnectFailure("invalid_argument", "Connect-Timeout-Ms: not a number") from None


def _file_failure(path: str, stderr: str, doing: str) -> ConnectFailure:
    exc = transfer.failure(path, stderr, doing)
    code, _ = _code_of(exc)
    return ConnectFailure(code, str(exc))


async def _exec(
    sandbox: Sandbox,
    argv: list[str],
    capture: transfer.Capture,
    *,
    stdin: bytes | None = None,
) -> Any:
    try:
        return await asyncio.to_thread(
            sandbox.session.exec,
            argv,
            cwd="/",
            timeout=FILE_TIMEOUT,
            stdin=stdin,
            on_output=capture.add,
        )
    except transfer.TooMuch:
        raise ConnectFailure("resource_exhausted", f"more than {MAX_FILE} bytes") from None
    except OrchestratorError as exc:
        raise ConnectFailure("unavailable", str(exc).splitlines()[0]) from None


async def _entries(sandbox: Sandbox, script: str, args: list[str]) -> list[wire.Entry]:
    capture = transfer.Capture(MAX_OUTPUT, 64 << 10)
    result = await _exec(sandbox, ["/bin/sh", "-c", script, "sh", *args], capture)
    if result.exit_code != 0:
        raise _file_failure(args[0], capture.text("stderr"), "reach")
    entries = wire.parse_entries(bytes(capture.data["stdout"]))
    if script is not _REMOVE and script is not _LIST and not entries:
        raise ConnectFailure("internal", f"{args[0]}: no entry")
    return entries


async def _uploads(request: Request) -> list[tuple[str, bytes]]:
    """The files of a ``POST /files``: a multipart form (each part's file name its path)
    or a raw body for ``?path=``."""
    kind = request.headers.get("content-type", "")
    query_path = request.query_params.get("path")
    if kind.startswith("multipart/form-data"):
        out = []
        async with request.form(max_files=1000, max_part_size=MAX_FILE) as form:
            for _, value in form.multi_items():
                if isinstance(value, str):
                    continue
                name = query_path if query_path and len(form) == 1 else value.filename
                if not name:
                    raise ConnectFailure("invalid_argument", "a file part without a path")
                out.append((name, await value.read()))
        return out
    if not query_path:
        raise ConnectFailure("invalid_argument", "path: give the file's path")
    body = await _bounded_body(request)
    encoding = request.headers.get("content-encoding", "").lower()
    if encoding == "gzip":
        body = _gunzip(body)
    elif encoding not in ("", "identity"):
        raise ConnectFailure("invalid_argument", f"Content-Encoding {encoding!r}: not gzip")
    return [(query_path, body)]


async def _bounded_body(request: Request) -> bytes:
    """The request's body, refused past :data:`MAX_FILE` bytes as it arrives."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FILE:
            raise ConnectFailure("resource_exhausted", f"a file over {MAX_FILE} bytes")
    return bytes(body)


def _gunzip(data: bytes) -> bytes:
    """A gzip body, inflated to at most :data:`MAX_FILE` bytes (a bomb stops there)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, MAX_FILE + 1)
    except zlib.error:
        raise ConnectFailure("invalid_argument", "the body is not gzip") from None
    if len(out) > MAX_FILE or inflater.unconsumed_tail:
        raise ConnectFailure("resource_exhausted", f"a file over {MAX_FILE} bytes")
    if not inflater.eof:
        raise ConnectFailure("invalid_argument", "the gzip body is cut short")
    return out


def _keepalive(request: Request) -> float:
    """Seconds between keepalive events on a stream: the client's ``Keepalive-Ping-
    Interval``, at most :data:`~orchestrator.e2b.processes.KEEPALIVE_S`."""
    raw = request.headers.get("keepalive-ping-interval", "")
    given = int(raw) if raw.isdigit() and int(raw) > 0 else processes.KEEPALIVE_S
    return float(min(given, processes.KEEPALIVE_S))
