"""The console's pages: change sets, one change set (clear, reject), the audit log, the
live sessions (stop one) and their calls waiting for approval (approve, deny).

:func:`make_app` builds the Starlette application for one project, already behind
:func:`~orchestrator.review.guard.guard`. Clearing goes through
:meth:`orchestrator.runner.Orchestrator.clear`, the code path of ``orchestrator clear``
(scanner blocks and files that run code need the same explicit acknowledgements);
rejecting through the change store and audit entry of ``orchestrator staged reject``.

Every string a template prints passes through :func:`orchestrator.escaping.escape`
(terminal controls, bidirectional and invisible characters shown as ``\\xNN``) and then
Jinja's HTML autoescape; the diff lines, escaped by the staging code already, are marked
:class:`Shown` so they are not escaped twice for the terminal.
"""

from __future__ import annotations

import getpass
import json
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from orchestrator.audit.timeutil import parse_time
from orchestrator.config import load_project
from orchestrator.errors import OrchestratorError
from orchestrator.escaping import escape
from orchestrator.review.arguments import PREVIEW_CHARS, flatten, preview
from orchestrator.review.arguments import page_of as args_page_of
from orchestrator.review.changes import (
    FINDINGS,
    DiffLine,
    FileDiff,
    audit_entries,
    change_rows,
    change_view,
    finding_line,
    side_by_side,
)
from orchestrator.review.guard import MINTED_FOR, RAW_CSP, ASGIApp, Secrets, guard
from orchestrator.review.live import answer_approval, live_sessions, stop_session, waiting_call
from orchestrator.runtime.host_folders import open_audit
from orchestrator.runtime.outbox import change_store
from orchestrator.staging import ChangeSet, record_change

if TYPE_CHECKING:
    from orchestrator.clearance import ClearResult

__all__ = ["LINES_PER_PAGE", "STATUSES", "Paged", "PushOffer", "Shown", "make_app", "page_of"]

STATUSES = ("pending", "approved", "rejected", "discarded", "committed", "applied")
_STYLE = Path(__file__).with_name("static") / "style.css"


class Shown(str):
    """Text escaped for the terminal already (the staging diff): not escaped again."""

    __slots__ = ()


def _finalize(value: Any) -> Any:
    if isinstance(value, Markup | Shown) or not isinstance(value, str):
        return value
    return escape(value)


def _as_text(value: str) -> Shown:
    """A waiting call's argument as the text it is: line breaks and tabs kept, every other
    character that could hide or reorder text escaped (and a backslash doubled), once."""
    return Shown(escape(value, keep="\t\n"))


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("orchestrator.review", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        finalize=_finalize,
        auto_reload=False,
    )
    env.filters["shown"] = Shown
    env.filters["tojson_text"] = lambda value: json.dumps(value, ensure_ascii=False, sort_keys=True)
    env.filters["as_text"] = _as_text
    env.filters["thousands"] = lambda number: f"{number:,}"
    env.filters["shell"] = shlex.quote
    env.globals["finding_line"] = finding_line
    env.globals["side_by_side"] = side_by_side
    return env


def make_app(project_dir: Path, keys: Secrets) -> ASGIApp:
    """The console for the project in ``project_dir``, answering only with ``keys``."""
    project = load_project(project_dir)
    store = change_store(project)  # checked, then reached through its descriptor
    env = _environment()

    def page(name: str, code: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(
            csrf=keys.csrf, base=keys.base, project=str(project.root), **context
        )
        return HTMLResponse(html, status_code=code)

    def problem(message: str, code: int = 409) -> HTMLResponse:
        return page("error.html", code=code, message=message)

    def form(request: Request, name: str) -> str:
        values: list[str] = request.scope.get("review.form", {}).get(name, [])
        return values[0] if values else ""

    async def changes(request: Request) -> Response:
        query = request.query_params
        status = query.get("status") or None
        if status is not None and status not in STATUSES:
            return problem(f"unknown state '{status}'; one of {', '.join(STATUSES)}", 400)
        findings = query.get("findings") or None
        if findings is not None and findings not in FINDINGS:
            return problem(
                f"unknown findings filter '{findings}'; one of {', '.join(FINDINGS)}", 400
            )
        try:
            since, until = _times(request)
        except ValueError as exc:
            return problem(str(exc), 400)
        worker = query.get("worker") or None
        run = query.get("run") or None
        rows = change_rows(
            store, status, worker=worker, run=run, findings=findings, since=since, until=until
        )
        return page(
            "changes.html",
            rows=rows,
            status=status,
            statuses=STATUSES,
            worker=worker,
            run=run,
            findings=findings,
            since=query.get("since", ""),
            until=query.get("until", ""),
            filtered=any(
                query.get(k) for k in ("status", "worker", "run", "findings", "since", "until")
            ),
        )

    def rejected(change_id: str, reason: str) -> ChangeSet:
        """Reject as ``orchestrator staged reject`` does, audited with who and how."""
        found = store.set_status(store.resolve(change_id), "rejected", reason=reason)
        with open_audit(project) as audit:
            record_change(
                audit,
                "change.rejected",
                found,
                reason=reason,
                metadata={"via": "review console", "by": _user()},
            )
        return found

    async def bulk(request: Request) -> Response:
        ids: list[str] = request.scope.get("review.form", {}).get("id", [])
        action = form(request, "action")
        reason = form(request, "reason").strip()
        if action not in ("clear", "reject"):
            return problem("use the Clear selected or the Reject selected button", 400)
        if not ids:
            return problem("select change sets first: the boxes in the first column", 400)
        if action == "reject" and not reason:
            return problem("rejecting needs a reason: write it in the field by the button", 400)

        def decide_all() -> list[tuple[str, bool, str]]:
            from orchestrator.runner import Orchestrator

            outcomes: list[tuple[str, bool, str]] = []
            for given in dict.fromkeys(ids):
                try:
                    found = store.get(store.resolve(given))
                    if found.scans is None or any(scan.findings for scan in found.scans):
                        why = "never scanned" if found.scans is None else "has findings"
                        outcomes.append((found.id, False, f"{why}: open it and decide on its page"))
                        continue
                    if action == "reject":
                        rejected(found.id, reason)
                        outcomes.append((found.id, True, "rejected"))
                        continue
                    with Orchestrator(project) as orch:
                        result = orch.clear(found.id)
                    outcomes.append(
                        (found.id, True, f"committed as {result.commit} on {result.branch}")
                    )
                except OrchestratorError as exc:
                    outcomes.append((given, False, str(exc)))
            return outcomes

        outcomes = await run_in_threadpool(decide_all)
        return page("bulk.html", outcomes=outcomes, action=action)

    async def change(request: Request) -> Response:
        try:
            number = int(request.query_params.get("page") or 1)
        except ValueError:
            number = 0
        if number < 1:
            return problem("page: give a page number, 1 or more", 400)
        try:
            with open_audit(project) as audit:
                view = change_view(project, store, audit, request.path_params["change_id"])
                record_change(
                    audit, "change.reviewed", view.change, metadata={"status": view.change.status}
                )
        except OrchestratorError as exc:
            return problem(str(exc), 404)
        paged = page_of(view.files, number)
        positions_of = {diff.item.path: diff.index for diff in view.files}
        split = request.query_params.get("view") == "split"
        pushable = view.change.target.kind == "repo" and view.change.status in (
            "pending",
            "approved",
            "committed",
        )
        return page(
            "change.html",
            view=view,
            change=view.change,
            paged=paged,
            positions_of=positions_of,
            split=split,
            also="&view=split" if split else "",
            push=await run_in_threadpool(push_offer) if pushable else None,
        )

    def push_offer() -> PushOffer | None:
        """Where *Clear and push* would push, when the repository has the remote
        ``clearance.remote`` names (what ``orchestrator clear --push`` needs)."""
        from orchestrator.clearance import can_push

        settings = project.config.clearance
        if not can_push(project.repo, settings.remote):
            return None
        return PushOffer(settings.remote, settings.credential)

    async def clear(request: Request) -> Response:
        from orchestrator.clearance import PushFailed
        from orchestrator.runner import Orchestrator

        change_id = request.path_params["change_id"]
        acknowledged = request.scope.get("review.form", {}).get("ack", [])
        push = form(request, "action") == "push"

        def cleared() -> ClearResult:
            with Orchestrator(project) as orch:
                return orch.clear(
                    change_id,
                    push=push,
                    override_scanners=form(request, "override") == "yes",
                    acknowledged=tuple(acknowledged),
                )

        try:
            result = await run_in_threadpool(cleared)
        except PushFailed as exc:  # committed (and marked) locally; only the push failed
            return page("error.html", code=502, message=str(exc), retry=exc.change_id)
        except OrchestratorError as exc:
            return problem(str(exc))
        return page("done.html", message=_cleared(result), change_id=result.change_id)

    async def reject(request: Request) -> Response:
        reason = form(request, "reason").strip()
        if not reason:
            return problem("a rejection needs a reason: write it in the field above Reject", 400)
        try:
            found = rejected(request.path_params["change_id"], reason)
        except OrchestratorError as exc:
            return problem(str(exc))
        return page("done.html", message="rejected", change_id=found.id)

    async def audit_page(request: Request) -> Response:
        run = request.query_params.get("run") or None
        operation = request.query_params.get("operation") or None
        try:
            since, until = _times(request)
        except ValueError as exc:
            return problem(str(exc), 400)
        try:
            with open_audit(project) as audit:
                entries, clipped, verified = audit_entries(
                    audit, run=run, operation=operation, since=since, until=until
                )
        except OrchestratorError as exc:
            return problem(str(exc), 500)
        return page(
            "audit.html",
            entries=entries,
            entries_clipped=clipped,
            verified=verified,
            run=run,
            operation=operation,
            since=request.query_params.get("since", ""),
            until=request.query_params.get("until", ""),
        )

    async def raw(request: Request) -> Response:
        """One file's bytes as a download, never as a page (see :data:`RAW_CSP`)."""
        try:
            found = store.get(store.resolve(request.path_params["change_id"]))
            index = request.path_params["index"]
            item = found.files[index] if 0 <= index < len(found.files) else None
            if item is None or item.sha256 is None:
                return problem(f"change set {found.id} has no file {index} with content", 404)
            blob = store.open_blob(found.id, item.sha256)
        except OrchestratorError as exc:
            return problem(str(exc), 404)

        def chunks() -> Any:
            with blob:
                while chunk := blob.read(1 << 20):
                    yield chunk

        name = _download_name(item.path)
        return StreamingResponse(
            chunks(),
            media_type="application/octet-stream",
            headers={
                "Content-Disposition": f'attachment; filename="{name}"',
                "Content-Security-Policy": RAW_CSP,
                "Content-Length": str(item.size),
            },
        )

    async def approvals(request: Request) -> Response:
        try:
            sessions = await run_in_threadpool(live_sessions, project)
        except OrchestratorError as exc:
            return problem(str(exc), 500)
        calls = [(s, p, preview(flatten(p.get("args")))) for s in sessions for p in s.pending]
        return page("approvals.html", sessions=sessions, calls=calls, preview_chars=PREVIEW_CHARS)

    async def waiting(request: Request) -> Response:
        """One waiting call, its arguments whole (paged), and the decision."""
        try:
            number = int(request.query_params.get("page") or 1)
        except ValueError:
            number = 0
        if number < 1:
            return problem("page: give a page number, 1 or more", 400)
        session_id = request.path_params["session_id"]
        request_id = request.path_params["request_id"]
        try:
            info, call = await run_in_threadpool(waiting_call, project, session_id, request_id)
        except OrchestratorError as exc:
            return problem(str(exc), 404)
        values = flatten(call.get("args"))
        size = len(json.dumps(call.get("args"), ensure_ascii=False).encode("utf-8", "replace"))
        return page(
            "call.html",
            session_id=session_id,
            info=info,
            call=call,
            values=values,
            size=size,
            paged=args_page_of(values, number),
        )

    async def answer(request: Request) -> Response:
        action = form(request, "action")
        if action not in ("approve", "deny"):
            return problem("answer with the Approve or the Deny button", 400)
        session_id = request.path_params["session_id"]
        try:
            await run_in_threadpool(
                lambda: answer_approval(
                    project,
                    session_id,
                    request.path_params["request_id"],
                    approve=action == "approve",
                    by=_user(),
                    via="review console",
                )
            )
        except OrchestratorError as exc:
            return problem(str(exc))
        said = "approved: the call runs now" if action == "approve" else "denied"
        return page("answered.html", message=said, session_id=session_id)

    async def sessions_page(request: Request) -> Response:
        try:
            sessions = await run_in_threadpool(live_sessions, project)
        except OrchestratorError as exc:
            return problem(str(exc), 500)
        return page("sessions.html", sessions=sessions, age=_age)

    async def stop(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            result = await run_in_threadpool(stop_session, project, session_id)
            with open_audit(project) as audit:
                audit.record(
                    "session.stopped",
                    worker=result.get("worker"),
                    run_id=result.get("run_id"),
                    session_id=session_id,
                    metadata={"via": "review console", "by": _user()},
                )
        except OrchestratorError as exc:
            return problem(str(exc))
        removed = (
            "container removed" if result.get("container_removed") else ("CONTAINER NOT REMOVED")
        )
        return page("answered.html", message=f"session {session_id} stopped; {removed}")

    async def another(request: Request) -> Response:
        """Another browser: a fresh single-use address, made only when asked (a POST)."""
        if request.method == "POST":
            return page("another.html", url=keys.url(keys.mint()), minutes=int(MINTED_FOR // 60))
        return page("another.html", url=None, minutes=int(MINTED_FOR // 60))

    async def style(request: Request) -> Response:
        return Response(_STYLE.read_bytes(), media_type="text/css")

    routes = [
        Route("/", changes),
        Route("/changes/bulk", bulk, methods=["POST"]),
        Route("/changes/{change_id}", change),
        Route("/changes/{change_id}/raw/{index:int}", raw),
        Route("/changes/{change_id}/clear", clear, methods=["POST"]),
        Route("/changes/{change_id}/reject", reject, methods=["POST"]),
        Route("/audit", audit_page),
        Route("/approvals", approvals),
        Route("/approvals/{session_id}/{request_id}", waiting, methods=["GET"]),
        Route("/approvals/{session_id}/{request_id}", answer, methods=["POST"]),
        Route("/sessions", sessions_page),
        Route("/sessions/{session_id}/stop", stop, methods=["POST"]),
        Route("/another", another, methods=["GET", "POST"]),
        Route("/static/style.css", style),
        Route("/favicon.ico", lambda request: Response(status_code=204)),  # no icon, no error
    ]
    return guard(Starlette(routes=[Mount(keys.base, routes=routes)]), keys)


@dataclass(frozen=True)
class PushOffer:
    """The push a change set's page offers: the remote, and the name of the credential
    ``clearance.credential`` names (None: git's own credentials). Never its value."""

    remote: str
    credential: str | None


def _cleared(result: ClearResult) -> str:
    """What a clearance did, in the words of ``orchestrator clear``, with the pushed ref."""
    ref = f"refs/heads/{result.branch}"
    if result.already and result.pushed:
        return f"commit {result.commit} pushed to '{result.remote}' as {ref}"
    if result.already:
        where = f"as {result.commit}" if result.commit else "(its commit is not on a local branch)"
        return f"already committed {where}; nothing to do"
    done = f"committed as {result.commit} on {result.branch}"
    if result.pushed:
        done += f", pushed to '{result.remote}' as {ref}"
    return done


#: At most this many diff lines on one page of a change set (the rest on the next pages).
LINES_PER_PAGE = 4000


@dataclass(frozen=True)
class Paged:
    """One page of a change set's diff."""

    number: int
    pages: int
    total: int
    """Diff lines of all files."""
    first: int
    """The index (from 0) of the page's first line among all."""
    last: int
    """The index (from 0) after the page's last line."""
    files: list[tuple[FileDiff, list[DiffLine]]]
    """The files with lines on this page, and those lines."""
    located: dict[tuple[str, int], int]
    """(path, line of the new file) of every finding shown at its line -> its page."""


def page_of(files: list[FileDiff], number: int) -> Paged:
    """Page ``number`` (from 1; past the last: the last) of the diff of ``files``."""
    total = sum(len(f.lines) for f in files)
    pages = max(1, -(-total // LINES_PER_PAGE))
    number = min(number, pages)
    start, end = (number - 1) * LINES_PER_PAGE, number * LINES_PER_PAGE
    shown: list[tuple[FileDiff, list[DiffLine]]] = []
    located: dict[tuple[str, int], int] = {}
    offset = 0
    for diff in files:
        count = len(diff.lines)
        low, high = max(start, offset), min(end, offset + count)
        if low < high or (count == 0 and start <= offset < end):
            shown.append((diff, diff.lines[low - offset : high - offset]))
        for position, line in enumerate(diff.lines):
            if line.findings and line.number is not None:
                located[(diff.item.path, line.number)] = (offset + position) // LINES_PER_PAGE + 1
        offset += count
    return Paged(number, pages, total, start, min(end, total), shown, located)


def _times(request: Request) -> tuple[datetime | None, datetime | None]:
    """The ``since`` and ``until`` filters: ISO 8601 times or durations ago (``2h``), as
    ``orchestrator audit --since`` takes them. Raises ValueError naming the field."""
    found: list[datetime | None] = []
    for name in ("since", "until"):
        text = request.query_params.get(name, "").strip()
        try:
            found.append(parse_time(text) if text else None)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return found[0], found[1]


def _download_name(path: str) -> str:
    """A file name for the download: the last part of ``path`` with anything but letters,
    digits, ``.``, ``-`` and ``_`` replaced, never starting with a dot."""
    base = path.rsplit("/", 1)[-1]
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in base)
    return safe.lstrip(".")[:100] or "file"


def _age(seconds: float) -> str:
    from orchestrator.runtime.session_folders import human_age

    return human_age(seconds)


def _user() -> str:
    """Who is reviewing: the account the console runs as."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
