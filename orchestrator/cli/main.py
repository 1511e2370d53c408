"""The ``orchestrator`` command: parse, call the library, print, exit.

Exit codes follow docker's: 125 for the orchestrator's own errors, otherwise the worker's
exit code (124 timeout, 137 killed for memory, 130/143 interrupted). Human messages go to
stderr; ``--json`` output is the only thing on stdout. Heavy imports happen inside the
commands so that ``--help`` stays fast.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import click

from orchestrator.cli.apply import apply as apply_command
from orchestrator.cli.audit import audit as audit_group
from orchestrator.cli.clear import clear as clear_command
from orchestrator.cli.options import project_option
from orchestrator.cli.staged import staged as staged_group

if TYPE_CHECKING:
    from orchestrator.audit import AuditLog
    from orchestrator.runtime import Prepared, RunResult

EXIT_ERROR = 125

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


def run_options(func: Any) -> Any:
    """Options shared by ``plan`` and ``run``: they must compile the same plan."""
    options = [
        project_option,
        click.option(
            "--timeout",
            type=click.FloatRange(min=0, min_open=True, max=7 * 24 * 3600),
            help="Seconds (at most a week).",
        ),
        click.option(
            "--trust",
            type=click.Choice(["untrusted", "session", "workspace", "full"]),
            help="Run at this trust level (only lower than declared, unless --promote).",
        ),
        click.option("--promote", is_flag=True, help="Allow --trust above the declared level."),
        click.option("--session", "session_id", help="Resume this session (default: a new one)."),
        click.option("--workspace", default="default", show_default=True, help="Workspace name."),
        json_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def say(message: str) -> None:
    """A human message, on stderr."""
    click.echo(f"orchestrator: {message}", err=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="orchestrator")
def cli() -> None:
    """Run AI workers in disposable, hardened containers whose access comes from declarations."""


@cli.command()
@click.argument("worker")
@run_options
def plan(worker: str, as_json: bool, **options: Any) -> None:
    """Compile WORKER (a path or a name) into a container spec, without touching Docker."""
    prepared, audit = _prepare(worker, **options)
    spec = prepared.spec
    audit.record(
        "plan.compiled",
        worker=spec.worker,
        run_id=spec.run_id,
        session_id=spec.session_id,
        trust_level=spec.trust,
        metadata={"image": spec.image, "network": spec.network_mode, "mounts": len(spec.mounts)},
    )
    if as_json:
        emit_json(prepared.spec.to_dict())
    else:
        click.echo(_describe(prepared))


@cli.command()
@click.argument("worker")
@run_options
def run(worker: str, as_json: bool, **options: Any) -> None:
    """Run WORKER in a new container; the container is removed on every path."""
    from orchestrator.docker import DockerEngine
    from orchestrator.runtime import Interrupted, execute
    from orchestrator.runtime.outbox import StagingReader

    prepared, audit = _prepare(worker, **options)
    spec = prepared.spec
    zones = ", ".join(f"{m.target} {'ro' if m.read_only else 'rw'}" for m in spec.mounts)
    say(
        f"run {spec.run_id}: worker {spec.worker}, trust {spec.trust}, session "
        f"{spec.session_id}, image {spec.image}, network {spec.network_mode}, "
        f"zones: {zones or 'none'}"
    )
    engine = DockerEngine()
    worker_stdout = sys.stderr.buffer if as_json else sys.stdout.buffer

    def echo(stream: str, chunk: bytes) -> None:
        target = worker_stdout if stream == "stdout" else sys.stderr.buffer
        target.write(chunk)
        target.flush()

    try:
        with _signals_interrupt():
            result = execute(
                engine,
                prepared,
                on_output=echo,
                audit=audit,
                staging=StagingReader(prepared.project, audit),
                secrets=_resolve_secrets(prepared, audit),
            )
    except Interrupted as exc:
        say(f"run {spec.run_id}: interrupted; container removed")
        raise SystemExit(128 + exc.signum) from None
    _report(result, as_json)
    raise SystemExit(result.exit_code)


@cli.command()
@click.option("--all", "everything", is_flag=True, help="Also objects of other pid namespaces.")
@click.option(
    "--idle",
    type=click.FloatRange(min=0),
    default=600,
    show_default=True,
    help="Also remove shared egress proxies and networks unused for this many seconds.",
)
@json_option
def gc(everything: bool, idle: float, as_json: bool) -> None:
    """Remove what dead orchestrators left, and shared proxies/networks no run uses."""
    from orchestrator.docker import DockerEngine
    from orchestrator.runtime import collect
    from orchestrator.runtime.secrets import sweep_orphaned

    engine = DockerEngine()
    report = collect(engine, everything=everything)
    shared = engine.collect_shared(idle)
    secrets = sweep_orphaned()
    if as_json:
        emit_json(
            {
                "removed": [{"kind": o.kind, "name": o.name} for o in report.removed],
                "shared_removed": shared,
                "secret_folders_removed": secrets,
                "kept": len(report.kept),
                "failed": [{"kind": o.kind, "name": o.name, "error": e} for o, e in report.failed],
            }
        )
    else:
        for obj in report.removed:
            say(f"removed {obj.kind} {obj.name}")
        for name in (*shared, *secrets):
            say(f"removed {name}")
        removed = len(report.removed) + len(shared) + len(secrets)
        say(f"gc: {removed} removed, {len(report.kept)} in use by live processes")
    if report.failed:
        raise SystemExit(EXIT_ERROR)


@cli.group()
def images() -> None:
    """Build the images workers run in (no registry needed)."""


@images.command("build")
@click.option("--base", help="Use this image (with python3) as the base instead of bootstrapping.")
@click.option("--suite", help="Debian/Ubuntu suite to bootstrap (default: the host's).")
@click.option("--rebuild-base", is_flag=True, help="Bootstrap the base again.")
def images_build(base: str | None, suite: str | None, rebuild_base: bool) -> None:
    """Build orchestrator/worker (bootstrapping a base from the host's apt sources if needed)."""
    from orchestrator.docker import DockerEngine
    from orchestrator.docker.images import build_all

    result = build_all(
        DockerEngine(),
        base=base,
        suite=suite,
        rebuild_base=rebuild_base,
        progress=lambda line: click.echo(f"  {line}", err=True),
    )
    say(f"built {', '.join(result.images)} on {result.base}")


def _prepare(worker: str, project_dir: Path, **options: Any) -> tuple[Prepared, AuditLog]:
    """Load and check the declarations; a refusal is audited before it is reported."""
    from orchestrator.config import load_project, load_worker
    from orchestrator.errors import ConfigError, PolicyError
    from orchestrator.runtime import open_audit, prepare

    project = load_project(project_dir)
    audit = open_audit(project)
    try:
        prepared = prepare(project, load_worker(project, worker), **options)
    except ConfigError as exc:
        audit.record(
            "policy.denied" if isinstance(exc, PolicyError) else "config.rejected",
            allowed=False,
            reason=str(exc),
            worker=worker,
            trust_level=options.get("trust"),
        )
        raise
    return prepared, audit


cli.add_command(audit_group)
staged_group.add_command(apply_command)
cli.add_command(staged_group)
cli.add_command(clear_command)


def _resolve_secrets(prepared: Prepared, audit: AuditLog) -> dict[str, str]:
    """Read the values of the secrets the grant allows, on the host, just before the run."""
    from orchestrator.credentials import resolve

    credentials = prepared.project.config.credentials
    values = {}
    for name in prepared.grant.secrets:
        credential = resolve(name, credentials[name], audit=audit, base=prepared.project.root)
        values[name] = credential.reveal()  # an 'inherit' credential holds no value: refused
        audit.record(
            "credential.used",
            worker=prepared.spec.worker,
            run_id=prepared.spec.run_id,
            session_id=prepared.session_id,
            trust_level=prepared.spec.trust,
            metadata={"credential": name, "use": "worker secret"},
        )
    return values


def _describe(prepared: Prepared) -> str:
    spec = prepared.spec
    lines = [
        f"worker      {spec.worker}",
        f"trust       {spec.trust}",
        f"session     {spec.session_id}",
        f"image       {spec.image}",
        f"command     {' '.join(spec.command) if spec.command else '(image default)'}",
        f"user        {spec.user}",
        f"workdir     {spec.working_dir}",
        f"network     {spec.network_mode}"
        + (f" (allow {', '.join(spec.egress)} via the egress proxy)" if spec.egress else ""),
        f"limits      memory {spec.mem_limit >> 20} MiB (no swap), cpus "
        f"{spec.nano_cpus / 1e9:g}, pids {spec.pids_limit}, timeout {spec.timeout_s:g} s",
        f"hardening   read-only root, /tmp tmpfs, cap_drop ALL, {', '.join(spec.security_opt)}, "
        "init, not privileged",
        "zones" + ("" if spec.mounts else "       none (no sandbox declared)"),
    ]
    if spec.outbox:
        options = dict(o.partition("=")[::2] for o in spec.tmpfs[spec.outbox].split(","))
        size = int(options.get("size", "0")) >> 20
        lines.insert(
            -1, f"outbox      {spec.outbox}: a fresh {size} MiB tmpfs, staged after the run"
        )
    lines += [f"  {m.target:<12} {'ro' if m.read_only else 'rw'}  {m.source}" for m in spec.mounts]
    env = sorted(k for k in spec.env if k != "ORCHESTRATOR_INSTRUCTIONS")
    lines.append(f"env         {', '.join(env)}")
    return "\n".join(lines)


def _report(result: RunResult, as_json: bool) -> None:
    if as_json:
        emit_json(result.to_dict())
        return
    for decision in result.egress:
        verdict = "allowed" if decision["allowed"] else "DENIED"
        say(f"egress {verdict}: {decision['host']}:{decision['port']}")
    outbox = result.outbox
    if outbox is not None and outbox.change_id:
        rejected = f", {len(outbox.rejected)} entries rejected" if outbox.rejected else ""
        say(
            f"staged change set {outbox.change_id} ({outbox.files} files{rejected}): review with "
            f"`orchestrator staged show {outbox.change_id}`"
        )
    for asked in result.asked:
        if asked.change_id:
            say(
                f"change set {asked.change_id} for zone '{asked.zone}' ({asked.files} files) "
                f"waits for approval: `orchestrator staged apply {asked.change_id}`"
            )
    removed = "container removed" if result.container_removed else "CONTAINER NOT REMOVED"
    detail = f" ({result.error})" if result.error else ""
    say(
        f"run {result.run_id}: {result.worker} {result.status} with code {result.exit_code} "
        f"in {result.duration_s:.2f} s{detail}; {removed}"
    )


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` so every cleanup path runs."""
    from orchestrator.runtime import Interrupted

    def handler(signum: int, _frame: FrameType | None) -> NoReturn:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console entry point: map every orchestrator error to one message and exit 125."""
    from orchestrator.errors import ConfigError, OrchestratorError

    try:
        cli.main(args=argv, prog_name="orchestrator", standalone_mode=False)
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.Abort:
        click.echo("orchestrator: aborted", err=True)
        raise SystemExit(130) from None
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(EXIT_ERROR) from None
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(f"orchestrator: error: {line}", err=True)
        raise SystemExit(EXIT_ERROR) from None
    except OrchestratorError as exc:
        click.echo(f"orchestrator: error: {exc}", err=True)
        raise SystemExit(exc.exit_code) from None
    except OSError as exc:  # a host file or folder the orchestrator itself could not use
        where = f" {exc.filename}" if exc.filename else ""
        click.echo(f"orchestrator: error:{where}: {exc.strerror or exc}", err=True)
        raise SystemExit(EXIT_ERROR) from None
    raise SystemExit(0)
