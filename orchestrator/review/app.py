"""The console's pages: change sets, one change set (clear, reject), the audit log.

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
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from orchestrator.config import load_project
from orchestrator.errors import OrchestratorError
from orchestrator.escaping import escape
from orchestrator.review.changes import audit_entries, change_rows, change_view
from orchestrator.review.guard import ASGIApp, Secrets, guard
from orchestrator.runtime.host_folders import open_audit
from orchestrator.staging import ChangeStore, record_change

__all__ = ["STATUSES", "Shown", "make_app"]

STATUSES = ("pending", "approved", "rejected", "discarded", "committed", "applied")
_STYLE = Path(__file__).with_name("static") / "style.css"


class Shown(str):
    """Text escaped for the terminal already (the staging diff): not escaped again."""

    __slots__ = ()


def _finalize(value: Any) -> Any:
    if isinstance(value, Markup | Shown) or not isinstance(value, str):
        return value
    return escape(value)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("orchestrator.review", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        finalize=_finalize,
        auto_reload=False,
    )
    env.filters["shown"] = Shown
    env.filters["tojson_text"] = lambda value: json.dumps(value, ensure_ascii=False, sort_keys=True)
    return env


def make_app(project_dir: Path, keys: Secrets) -> ASGIApp:
    """The console for the project in ``project_dir``, answering only with ``keys``."""
    project = load_project(project_dir)
    store = ChangeStore(project.sandbox_root / "changes")
    env = _environment()

    def page(name: str, code: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(csrf=keys.csrf, project=str(project.root), **context)
        return HTMLResponse(html, status_code=code)

    def problem(message: str, code: int = 409) -> HTMLResponse:
        return page("error.html", code=code, message=message)

    def form(request: Request, name: str) -> str:
        values: list[str] = request.scope.get("review.form", {}).get(name, [])
        return values[0] if values else ""

    async def changes(request: Request) -> Response:
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            return problem(f"unknown state '{status}'; one of {', '.join(STATUSES)}", 400)
        worker = request.query_params.get("worker") or None
        run = request.query_params.get("run") or None
        rows = change_rows(store, status, worker=worker, run=run)
        return page(
            "changes.html", rows=rows, status=status, statuses=STATUSES, worker=worker, run=run
        )

    async def change(request: Request) -> Response:
        try:
            with open_audit(project) as audit:
                view = change_view(project, store, audit, request.path_params["change_id"])
                record_change(
                    audit, "change.reviewed", view.change, metadata={"status": view.change.status}
                )
        except OrchestratorError as exc:
            return problem(str(exc), 404)
        return page("change.html", view=view, change=view.change)

    async def clear(request: Request) -> Response:
        from orchestrator.runner import Orchestrator

        change_id = request.path_params["change_id"]
        acknowledged = request.scope.get("review.form", {}).get("ack", [])
        try:
            with Orchestrator(project) as orch:
                result = orch.clear(
                    change_id,
                    override_scanners=form(request, "override") == "yes",
                    acknowledged=tuple(acknowledged),
                )
        except OrchestratorError as exc:
            return problem(str(exc))
        return page(
            "done.html",
            message=f"committed as {result.commit} on {result.branch}",
            change_id=result.change_id,
        )

    async def reject(request: Request) -> Response:
        reason = form(request, "reason").strip()
        if not reason:
            return problem("a rejection needs a reason: write it in the field above Reject", 400)
        try:
            found = store.set_status(
                store.resolve(request.path_params["change_id"]), "rejected", reason=reason
            )
            with open_audit(project) as audit:
                record_change(
                    audit,
                    "change.rejected",
                    found,
                    reason=reason,
                    metadata={"via": "review console", "by": _user()},
                )
        except OrchestratorError as exc:
            return problem(str(exc))
        return page("done.html", message="rejected", change_id=found.id)

    async def audit_page(request: Request) -> Response:
        run = request.query_params.get("run") or None
        operation = request.query_params.get("operation") or None
        try:
            with open_audit(project) as audit:
                entries, verified = audit_entries(audit, run=run, operation=operation)
        except OrchestratorError as exc:
            return problem(str(exc), 500)
        return page("audit.html", entries=entries, verified=verified, run=run, operation=operation)

    async def style(request: Request) -> Response:
        return Response(_STYLE.read_bytes(), media_type="text/css")

    routes = [
        Route("/", changes),
        Route("/changes/{change_id}", change),
        Route("/changes/{change_id}/clear", clear, methods=["POST"]),
        Route("/changes/{change_id}/reject", reject, methods=["POST"]),
        Route("/audit", audit_page),
        Route("/static/style.css", style),
        Route("/favicon.ico", lambda request: Response(status_code=204)),  # no icon, no error
    ]
    return guard(Starlette(routes=routes), keys)


def _user() -> str:
    """Who is reviewing: the account the console runs as."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
