"""The ``orchestrator`` command: parse, call the library, print, exit.

Exit codes follow docker's: 125 for the orchestrator's own errors, otherwise the worker's
exit code (124 timeout, 137 killed for memory, 130/143 interrupted). Human messages go to
stderr; ``--json`` output is the only thing on stdout. Heavy imports happen inside the
commands so that ``--help`` stays fast.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from orchestrator.cli.options import (
    JsonRequest,
    WorkerCommand,
    args_argument,
    env_option,
    project_option,
    signals_interrupt,
    timeout_seconds,
    worker_options,
)
from orchestrator.cli.options import json_option as json_flag
from orchestrator.cli.terminal import Raw, WorkerOutput, raw_option, say, shown
from orchestrator.exits import Exit, signalled
from orchestrator.vocabulary import BACKENDS

if TYPE_CHECKING:
    from collections.abc import Callable

    from orchestrator.plan import ContainerSpec, Mount
    from orchestrator.prepare import Prepared
    from orchestrator.runtime import RunResult

json_option = json_flag()


engine_option = click.option(
    "--engine",
    "engine_name",
    type=click.Choice(BACKENDS),
    default="docker",
    show_default=True,
    help="docker: a container on this engine; swarm: a replicated-job service on the swarm "
    "this engine manages (docs/scale-out.md).",
)


def run_options(func: Any) -> Any:
    """Options shared by ``plan`` and ``run``: they must compile the same plan."""
    options = [
        project_option,
        click.option(
            "--timeout",
            type=timeout_seconds,
            help="Seconds (at most a week).",
        ),
        *worker_options,
        click.option("--session", "session_id", help="Resume this session (default: a new one)."),
        click.option(
            "--input",
            "inputs",
            multiple=True,
            type=click.Path(path_type=Path),
            metavar="FILE_OR_DIR",
            help="A host file or folder for this run, read-only at /inputs/NAME (repeatable).",
        ),
        env_option,
        args_argument,
        json_option,
        engine_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _staged() -> click.Command:
    from orchestrator.cli.apply import apply
    from orchestrator.cli.staged import staged

    staged.add_command(apply)
    return staged


def _serve() -> click.Command:
    from orchestrator.cli.server import serve_command

    return serve_command(lambda argv: main(argv))


def _defined_in(module: str, name: str) -> Callable[[], click.Command]:
    def load() -> click.Command:
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command

    return load


#: The commands defined in modules of their own, each imported when it is named: a command
#: imports only its own (``orchestrator run`` none of these: docs/performance.md).
ELSEWHERE: dict[str, Callable[[], click.Command]] = {
    "audit": _defined_in("orchestrator.cli.audit", "audit"),
    "batch": _defined_in("orchestrator.cli.batch", "batch"),
    "build": _defined_in("orchestrator.cli.build", "build"),
    "clear": _defined_in("orchestrator.cli.clear", "clear"),
    "doctor": _defined_in("orchestrator.cli.doctor", "doctor"),
    "e2b": _defined_in("orchestrator.cli.e2b", "e2b"),
    "engine": _defined_in("orchestrator.cli.engine", "engine"),
    "mcp": _defined_in("orchestrator.cli.mcp", "mcp"),
    "review": _defined_in("orchestrator.cli.review", "review"),
    "serve": _serve,
    "session": _defined_in("orchestrator.cli.session", "session"),
    "snapshot": _defined_in("orchestrator.cli.session", "snapshot"),
    "staged": _staged,
}


class Commands(click.Group):
    """The top-level group: a command of :data:`ELSEWHERE` is imported when it is looked up
    (listing them all, as ``--help`` does, imports them all)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *ELSEWHERE})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in ELSEWHERE:
            self.add_command(ELSEWHERE[cmd_name](), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="orchestrator")
def cli() -> None:
    """Run AI workers in disposable, hardened containers whose access comes from declarations."""


def _note_format(value: str) -> str:
    """``--format json`` is ``--json``: a failure is reported as one JSON object too."""
    if value == "json":
        JsonRequest.asked = True
    return value


@cli.command(cls=WorkerCommand)
@click.argument("worker")
@run_options
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "k8s"]),
    default="text",
    is_eager=True,
    callback=lambda _ctx, _param, value: _note_format(value),
    help="text (default), json (as --json) or k8s: a Kubernetes Job, its NetworkPolicy and "
    "outbox claim as YAML documents (docs/scale-out.md).",
)
@click.option(
    "--k8s-volumes",
    type=click.Choice(["pvc", "hostpath"]),
    default="pvc",
    help="With --format k8s: zones as claims orchestrator-zone-NAME (default) or hostPath.",
)
def plan(
    worker: str,
    as_json: bool,
    project_dir: Path,
    output_format: str,
    k8s_volumes: str,
    engine_name: str,
    **options: Any,
) -> None:
    """Compile WORKER (a path or a name) into a container spec, without touching Docker."""
    from orchestrator.backends import backend_class
    from orchestrator.runner import Orchestrator

    if engine_name == "swarm" and output_format == "k8s":
        raise click.UsageError("--engine swarm and --format k8s: choose one")
    if as_json and output_format == "k8s":
        raise click.UsageError("--json and --format k8s: choose one")
    if k8s_volumes != "pvc" and output_format != "k8s":
        raise click.UsageError("--k8s-volumes goes with --format k8s")
    prepared = Orchestrator(project_dir).plan(worker, **options)
    if output_format == "k8s":
        import yaml

        from orchestrator.render import k8s

        grant = prepared.grant
        documents = k8s.render(
            prepared.spec,
            zones={zone.target: zone.name for zone in grant.zones},
            secrets=grant.secrets,
            volumes="hostpath" if k8s_volumes == "hostpath" else "pvc",
        )
        click.echo(yaml.safe_dump_all(documents, sort_keys=False), nl=False)
    elif as_json or output_format == "json":
        data = prepared.spec.to_dict()
        if facts := backend_class(engine_name).plan_facts(prepared):
            data[engine_name] = facts
        emit_json(data)
    else:
        click.echo(_describe(prepared))
        if facts := backend_class(engine_name).plan_facts(prepared):
            click.echo(f"engine:  swarm, service {facts['service']} (replicated-job, 1 task)")
            if facts["refused"]:
                click.echo(f"  refused: {facts['refused']}")
            for line in facts["not_enforced"]:
                click.echo(f"  not enforced: {line}")


@cli.command(cls=WorkerCommand)
@click.argument("worker")
@run_options
@raw_option
def run(worker: str, as_json: bool, project_dir: Path, engine_name: str, **options: Any) -> None:
    """Run WORKER in a new container; the container is removed on every path.

    The worker's output is streamed as it comes. On a terminal, escape sequences and
    invisible or bidirectional control characters in it are shown escaped (\\x1b, \\u202e),
    never obeyed; --raw passes them through. Pipes and files get its bytes unchanged.
    """
    from orchestrator.runner import Orchestrator
    from orchestrator.runtime import Interrupted

    orch = Orchestrator(project_dir, backend=engine_name)
    prepared = orch.prepare(worker, **options)
    orch.check(prepared)  # a missing image or runtime: said before the header
    spec = prepared.spec
    zones = ", ".join(f"{m.target} {'ro' if m.read_only else 'rw'}" for m in spec.mounts)
    inputs = f", inputs: {len(prepared.inputs)}" if prepared.inputs else ""
    say(
        f"run {spec.run_id}: worker {spec.worker}, trust {spec.trust}, session "
        f"{spec.session_id}, image {spec.image}, isolation {spec.isolation}, network "
        f"{spec.network.mode}, zones: {zones or 'none'}{inputs}"
    )
    if spec.network.mode == "allowlist":  # one `iptables -C` per process, as root only
        from orchestrator.doctor.firewall import missing_rule_warning

        if warning := missing_rule_warning():
            say(warning)
    worker_stdout = sys.stderr.buffer if as_json else sys.stdout.buffer
    output = WorkerOutput(worker_stdout, sys.stderr.buffer)
    try:
        with signals_interrupt():
            result = orch.run(prepared, on_output=output.write)
    except Interrupted as exc:
        output.close()
        fail([f"run {spec.run_id}: interrupted; container removed"], exc, signalled(exc.signum))
    finally:
        output.close()  # what an unfinished character left (twice is harmless)
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
@click.option(
    "--sessions-older-than",
    "sessions_age",
    metavar="AGE",
    callback=lambda _ctx, _param, value: _duration(value),
    help="Also remove the project's session folders unused for longer than AGE (e.g. 7d, "
    "12h, 30m); sessions of live runs are kept.",
)
@project_option
@json_option
def gc(
    everything: bool, idle: float, sessions_age: float | None, project_dir: Path, as_json: bool
) -> None:
    """Remove what dead orchestrators left, and shared proxies/networks no run uses."""
    from orchestrator.cleanup import collect_all
    from orchestrator.runtime.session_folders import human_age

    done = collect_all(project_dir, everything=everything, idle=idle, sessions_age=sessions_age)
    if as_json:
        emit_json(done.to_dict())
    else:
        for obj in done.removed:
            say(f"removed {obj.kind} {obj.name}")
        for name in (*done.shared, *done.secret_folders):
            say(f"removed {name}")
        for run_id in done.pins:
            say(f"unmounted the pinned mount sources of dead run {run_id}")
        for run_id in done.access:
            say(f"put back the access dead run {run_id} had given its worker")
        for name in done.folders.removed:
            say(f"removed run folder {name} of a dead run")
        for name, reason in done.folders.left:
            say(f"left run folder {name}: {reason}")
        for name in done.emptied:
            say(f"removed empty session folder {name} of a dead run")
        for pruned in done.sessions.removed:
            say(f"removed session {pruned.session_id} (unused for {human_age(pruned.age_s)})")
        for name in done.sessions.in_use:
            say(f"kept session {name}: a live run uses it")
        for name, problem in done.sessions.failed:
            say(f"could not remove session {name}: {problem}")
        for name in done.snapshot_leftovers:
            say(f"removed {name} left by a snapshot that was never finished")
        count = len(done.removed) + len(done.shared) + len(done.secret_folders)
        count += len(done.sessions.removed) + len(done.emptied) + len(done.folders.removed)
        count += len(done.snapshot_leftovers)
        say(f"gc: {count} removed, {len(done.kept)} in use by live processes")
    if not done.ok:
        raise SystemExit(Exit.ERROR)


def _duration(value: str | None) -> float | None:
    from orchestrator.runtime.session_folders import parse_duration

    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@cli.group()
def images() -> None:
    """Build the images workers run in (no registry needed)."""


@images.command("build")
@click.option("--base", help="Use this image (with python3) as the base instead of bootstrapping.")
@click.option("--suite", help="Debian/Ubuntu suite to bootstrap (default: the host's).")
@click.option("--rebuild-base", is_flag=True, help="Bootstrap the base again.")
@click.option(
    "--with-orchestrator",
    is_flag=True,
    help="Also build orchestrator/orchestrator, the orchestrator's own image for CI runners "
    "(from wheels made here by pip wheel; see docs/ci.md).",
)
@click.option(
    "--with-agent",
    is_flag=True,
    help="Also build orchestrator/agent, the image for agent workers: the worker image with "
    "git, curl, jq, ripgrep, procps, less, patch, unzip, pip and venv, built by the "
    "orchestrator's own builder under gVisor, its apt step reaching only the host's apt "
    "archives (docs/agents-sandbox.md, docs/build.md).",
)
def images_build(
    base: str | None,
    suite: str | None,
    rebuild_base: bool,
    with_orchestrator: bool,
    with_agent: bool,
) -> None:
    """Build orchestrator/worker, orchestrator/proxy and orchestrator/credproxy (bootstrapping
    bases from the host's apt sources if needed), and on request the agent image and the
    orchestrator's own image."""
    from orchestrator.docker import DockerEngine
    from orchestrator.docker.images import AGENT_IMAGE, build_all

    def progress(line: str) -> None:
        click.echo(f"  {line}", err=True)

    result = build_all(
        DockerEngine(),
        base=base,
        suite=suite,
        rebuild_base=rebuild_base,
        with_orchestrator=with_orchestrator,
        progress=progress,
    )
    built = list(result.images)
    if with_agent:  # on the worker image, by the orchestrator's own builder
        from orchestrator.build.agent import build_agent_image

        build_agent_image(progress)
        built.append(AGENT_IMAGE)
    say(f"built {', '.join(built)} on {result.base}")


def _describe(prepared: Prepared) -> str:
    from orchestrator.config.models import human_size
    from orchestrator.prepare.inputs import shown

    spec = prepared.spec
    limits = spec.limits
    tmp = getattr(spec.tmpfs_at("/tmp"), "size", 0)
    lines = [
        f"worker      {spec.worker}",
        f"trust       {spec.trust}",
        f"session     {spec.session_id}",
        f"image       {spec.image}",
        f"command     {' '.join(spec.command) if spec.command else '(image default)'}"
        + (f" + arguments {json.dumps(spec.args)}" if spec.args else ""),
        f"user        {_user_line(spec)}",
        f"workdir     {spec.workdir}",
        f"isolation   {_ISOLATION[spec.isolation]}",
        f"network     {_network_line(spec)}",
        *[
            f"credential  {b.name}: placeholder in {b.placeholder_env}; the run's credential "
            f"proxy writes the value into {b.header} toward {', '.join(b.hosts)} only"
            for b in spec.network.credentials
        ],
        f"limits      memory {human_size(limits.memory)} (no swap), cpus {limits.cpus:g}, "
        f"pids {limits.pids}, timeout {limits.timeout_s:g} s, /tmp {human_size(tmp)}",
        f"ulimits     {', '.join(f'{u.name} {u.soft}/{u.hard}' for u in spec.ulimits) or '-'}",
        f"hardening   {_hardening_line(spec)}",
        "zones" + ("" if spec.mounts else "       none (no sandbox declared)"),
    ]
    if spec.outbox:
        size = getattr(spec.tmpfs_at(spec.outbox), "size", 0)
        declared = prepared.project.config.sandbox.outbox.size
        capped = f" (sandbox.outbox.size {human_size(declared)}, capped by the memory limit)"
        lines.insert(
            -1,
            f"outbox      {spec.outbox}: a fresh {human_size(size)} tmpfs, staged after the run"
            + (capped if declared > size else ""),
        )
    zones = {zone.target for zone in prepared.grant.zones}
    lines += [_mount_line(m, prepared.project.root, m.target in zones) for m in spec.mounts]
    env = sorted(k for k in spec.env if k != "ORCHESTRATOR_INSTRUCTIONS")
    lines.append(f"env         {', '.join(env)}")
    if spec.inputs:
        lines.append("inputs" + ("" if prepared.inputs else "      none yet (filled when it runs)"))
    for item in prepared.inputs:
        lines.append(
            f"  {shown(item.target):<12} ro  {shown(item.source)} ({item.kind}, "
            f"{human_size(item.size)})"
        )
    return "\n".join(lines)


#: How ``plan`` names each isolation runtime.
_ISOLATION = {
    "gvisor": "gvisor (runsc: system calls served by gVisor's kernel, not the host's)",
    "runc": "runc (the host's kernel, shared)",
}


def _network_line(spec: ContainerSpec) -> str:
    network = spec.network
    if network.mode == "allowlist":
        allowed = ", ".join(network.allow) or "nothing"
        return f"allowlist (allow {allowed} via the egress proxy, on a network of the run's own)"
    if network.mode == "full":
        return "full (the project's own network; runs on it cannot reach each other)"
    return "none (loopback only)"


def _user_line(spec: ContainerSpec) -> str:
    if not spec.image_user:
        return spec.user
    who = spec.user or "the image's own"
    return f"{who} (image_user: what it leaves in zones goes to {spec.uid}:{spec.gid})"


def _hardening_line(spec: ContainerSpec) -> str:
    parts = ["read-only root" if spec.read_only_rootfs else "writable root", "/tmp tmpfs"]
    caps = ", ".join(spec.capabilities)
    parts.append(f"capabilities: {caps} only" if caps else "no capabilities")
    if spec.no_new_privileges:
        parts.append("no-new-privileges")
    parts.append(
        f"seccomp profile {spec.seccomp}" if spec.seccomp else "the engine's default seccomp"
    )
    if spec.init:
        parts.append("init")
    return ", ".join([*parts, "not privileged"])


def _mount_line(mount: Mount, project_root: Path, zone: bool) -> str:
    """A mount with the host folder it really resolves to, and whether that leaves the project."""
    real = Path(os.path.realpath(mount.source))
    line = f"  {mount.target:<12} {'ro' if mount.read_only else 'rw'}  {real}"
    if str(real) != mount.source:
        line += f" (declared {mount.source})"
    if zone and not real.is_relative_to(project_root):
        line += "  [outside the project folder]"
    return line


#: At most this many lines of egress decisions after a run; the audit log has them all.
EGRESS_LINES = 10


def egress_summary(result: RunResult) -> list[str]:
    """The run's egress decisions in a few lines: one per verdict and destination with
    its count, at most :data:`EGRESS_LINES`, then what was left out and any flood."""
    counts: dict[tuple[bool, str], int] = {}
    for decision in result.egress:
        key = (bool(decision["allowed"]), f"{decision['host'][:80]}:{decision['port']}")
        counts[key] = counts.get(key, 0) + 1
    lines = []
    for (allowed, target), count in sorted(counts.items(), key=lambda item: -item[1]):
        times = f" ({count} times)" if count > 1 else ""
        lines.append(f"egress {'allowed' if allowed else 'DENIED'}: {shown(target)}{times}")
    if len(lines) > EGRESS_LINES:
        rest = len(lines) - EGRESS_LINES + 1
        lines[EGRESS_LINES - 1 :] = [f"egress: {rest} more destinations (orchestrator audit)"]
    flood = result.egress_flood
    if flood:
        lines.append(
            f"egress FLOOD: {flood['denied']} denied and {flood['allowed']} allowed requests "
            "more were counted, not logged one by one (orchestrator audit --operation "
            "egress.flood)"
        )
    return lines


def _report(result: RunResult, as_json: bool) -> None:
    if as_json:
        emit_json(result.to_dict())
        return
    for line in egress_summary(result):
        say(line)
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
    for violation in result.violations:
        click.echo(f"orchestrator: VIOLATION: {shown(violation)}", err=True)
    removed = "container removed" if result.container_removed else "CONTAINER NOT REMOVED"
    detail = f" ({result.error})" if result.error else ""
    say(
        f"run {result.run_id}: {result.worker} {result.status} with code {result.exit_code} "
        f"in {result.duration_s:.2f} s{detail}; {removed}"
    )


def fail(
    lines: list[str], exc: BaseException, code: int, *, problems: list[str] | None = None
) -> NoReturn:
    """Report a failure of the orchestrator itself and exit with ``code``.

    The human lines go to stderr; under ``--json``, one JSON object (on one line) also
    goes to stdout: ``{"error": {"kind", "message"[, "problems"]}, "exit_code"}``.
    """
    for line in lines:  # error messages may quote what a worker chose: escaped on a terminal
        click.echo(f"orchestrator: {shown(line)}", err=True)
    if JsonRequest.asked:
        error: dict[str, Any] = {
            "kind": type(exc).__name__,
            "message": "\n".join(line.removeprefix("error: ") for line in lines),
        }
        if problems is not None:
            error["problems"] = problems
        click.echo(json.dumps({"error": error, "exit_code": code}, sort_keys=True))
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console entry point: map every orchestrator error to one message and exit 125.

    ``cli.main`` runs with ``standalone_mode=False``, so a command's ``ctx.exit(N)`` comes
    back as its return value: that value is the exit code.
    """
    from orchestrator.errors import ConfigError, OrchestratorError

    args = sys.argv[1:] if argv is None else list(argv)
    JsonRequest.asked = False  # set by the --json option's callback while parsing
    Raw.asked = False  # and --raw's
    try:
        code = cli.main(args=args, prog_name="orchestrator", standalone_mode=False)
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except click.Abort as exc:
        fail(["aborted"], exc, 130)
    except click.ClickException as exc:
        # A usage error can come before --json itself is parsed: look at the words then.
        words = args[: args.index("--")] if "--" in args else args
        JsonRequest.asked = JsonRequest.asked or "--json" in words
        if JsonRequest.asked:
            fail([f"error: {exc.format_message()}"], exc, Exit.ERROR)
        exc.show()
        raise SystemExit(Exit.ERROR) from None
    except ConfigError as exc:
        lines = [f"error: {line}" for line in exc.problems]
        fail(lines, exc, Exit.ERROR, problems=exc.problems)
    except OrchestratorError as exc:
        fail([f"error: {exc}"], exc, exc.exit_code)
    except OSError as exc:  # a host file or folder the orchestrator itself could not use
        where = f" {exc.filename}:" if exc.filename else ""
        fail([f"error:{where} {exc.strerror or exc}"], exc, Exit.ERROR)
    raise SystemExit(code if isinstance(code, int) else 0)
