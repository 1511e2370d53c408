"""``orchestrator build``: a Dockerfile built with the project's own builder (docs/build.md).

Every ``RUN`` is a hardened run under gVisor; ``COPY``/``ADD`` read the context without
following a link. A refusal or a failed step is one line (``FILE:LINE: INSTRUCTION: why``):
exit 125, or a failed ``RUN``'s own exit code.
"""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.options import json_option, project_option, signals_interrupt, timeout_seconds
from orchestrator.cli.terminal import raw_option, say, shown


def _size(value: str | None) -> int | None:
    from orchestrator.config.models import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("build")
@click.argument("context", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "-f",
    "--file",
    "dockerfile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The Dockerfile (default: CONTEXT/Dockerfile).",
)
@click.option("-t", "--tag", help="Name the image (NAME[:TAG]).")
@project_option
@click.option("--target", help="Build this stage (default: the last).")
@click.option("--no-cache", is_flag=True, help="Run every step again.")
@click.option(
    "--build-arg",
    "build_args",
    multiple=True,
    metavar="NAME=VALUE",
    help="A value for an ARG (repeatable).",
)
@click.option("--memory", help="Memory per step (e.g. 1g; default: the project's).")
@click.option("--disk", help="Bytes a step may add to its layer (e.g. 2g; default 4g).")
@click.option(
    "--disk-total", help="Bytes all the steps of the build may add together (default 16g)."
)
@click.option("--timeout", type=timeout_seconds, help="Seconds the whole build may take.")
@json_option()
@raw_option
def build(
    context: Path, dockerfile: Path | None, tag: str | None, project_dir: Path,
    target: str | None, no_cache: bool, build_args: tuple[str, ...], memory: str | None,
    disk: str | None, disk_total: str | None, timeout: float | None, as_json: bool,
) -> None:  # fmt: skip
    """Build CONTEXT's Dockerfile step by step, each RUN under gVisor.

    Each step and what it prints is shown on stderr: on a terminal, escape sequences and
    invisible or bidirectional control characters in it are shown escaped (\\x1b,
    \\u202e), never obeyed; --raw passes them through. Pipes and files get them as they are.
    """
    import json

    from orchestrator.build import build_image
    from orchestrator.runtime import Interrupted

    args = {}
    for pair in build_args:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise click.BadParameter(f"{pair}: expected NAME=VALUE", param_hint="--build-arg")
        args[name] = value
    try:
        with signals_interrupt():
            result = build_image(
                context, dockerfile=dockerfile, tag=tag, project=project_dir, target=target,
                no_cache=no_cache, build_args=args, memory=_size(memory), disk=_size(disk),
                disk_total=_size(disk_total),
                timeout=timeout, say=lambda line: click.echo(shown(line), err=True),
                warn=say,
            )  # fmt: skip
    except Interrupted as exc:
        say(f"build interrupted (signal {exc.signum}); its step containers were removed")
        raise SystemExit(128 + exc.signum) from None
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    named = f" as {tag}" if tag else ""
    say(
        f"built {result.image_id[7:19]}{named}: {result.built_steps} step(s) run, "
        f"{result.cached_steps} cached, {result.duration_s:.1f} s"
    )
    click.echo(result.image_id)
