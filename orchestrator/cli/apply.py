"""``orchestrator staged apply ID``: apply an approved zone change set (host only)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import ack_sensitive_option, project_option

if TYPE_CHECKING:
    from orchestrator.config import Project, Worker


def deletes_allowed(project: Project, worker: Worker, zone: str) -> bool:
    """Whether the worker's request for ``zone`` lets its change sets delete there."""
    requests = worker.config.sandbox.zones if worker.config.sandbox else []
    request = next((r for r in requests if r.name == zone), None)
    return request is not None and request.approval.delete != "blocked"


@click.command("apply")
@click.argument("change_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--override-scanners",
    is_flag=True,
    help="Apply despite failing scanners (recorded in the audit log); files that run code "
    "by themselves still need --ack-sensitive.",
)
@ack_sensitive_option
@project_option
def apply(
    change_id: str,
    yes: bool,
    override_scanners: bool,
    acknowledged: tuple[str, ...],
    project_dir: Path,
) -> None:
    """Apply CHANGE_ID (an `ask` zone's change set) to its zone, after confirmation.

    Each file in it that runs code by itself (conftest.py, Makefile, CI files,
    executables: `staged show` lists them) must be named with --ack-sensitive;
    --override-scanners does not cover them. A change set that deletes in a zone whose
    approval says `delete: blocked` is refused whole (`staged show` says so beforehand;
    reject it), and a file that changed in the zone since the run is a conflict: in both
    cases nothing is applied.
    """
    from orchestrator.config import load_project, load_worker
    from orchestrator.errors import OrchestratorError
    from orchestrator.runtime.host_folders import open_audit
    from orchestrator.runtime.outbox import change_store, zone_limits
    from orchestrator.staging import scanners_for
    from orchestrator.staging.apply import apply_to_zone

    project = load_project(project_dir)
    audit = open_audit(project)
    store = change_store(project)
    change = store.get(store.resolve(change_id))
    zone = change.target.name
    if change.target.kind != "zone" or zone is None:
        raise OrchestratorError(
            f"change set {change.id} targets the repo; use `orchestrator clear {change.id}`"
        )
    if zone not in project.zones:
        raise OrchestratorError(f"zone '{zone}' of change set {change.id} is no longer declared")
    allow_delete = deletes_allowed(project, load_worker(project, change.worker), zone)
    for item in change.files:
        click.echo(f"  {item.operation:<7} {item.path} ({item.size} bytes)", err=True)
    if not yes and not click.confirm(
        f"Apply {len(change.files)} change(s) to zone '{zone}'?", err=True
    ):
        raise SystemExit(1)
    config = project.zones[zone].config
    limits = zone_limits(project, zone)
    done = apply_to_zone(
        store,
        change.id,
        project.zones[zone].host_path,
        allow_delete=allow_delete,
        override_scanners=override_scanners,
        acknowledged=acknowledged,
        scanners=scanners_for(
            limits=limits,
            suffixes=config.suffixes,
            sensitive=project.config.clearance.sensitive_paths,
        ),
        audit=audit,
    )
    click.echo(
        f"orchestrator: applied {change.id} to zone '{zone}': {done.written} written, "
        f"{done.deleted} deleted, {done.already} already in place",
        err=True,
    )
