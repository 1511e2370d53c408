"""``orchestrator engine setup``: prepare the local Docker engine for the orchestrator.

Today that is one step, ``--gvisor``: declare the gVisor runtimes untrusted workers run
under (see :mod:`orchestrator.docker.runtimes`). Errors are left for the main command to
turn into one line and exit code 125.
"""

from __future__ import annotations

import click

from orchestrator.cli.options import json_option


@click.group()
def engine() -> None:
    """Prepare the local Docker engine (needs root)."""


@engine.command("setup")
@click.option(
    "--gvisor",
    is_flag=True,
    help="Declare the gVisor (runsc) runtimes in /etc/docker/daemon.json and reload dockerd "
    "with SIGHUP (no restart, running containers keep running). Idempotent.",
)
@json_option()
def setup(gvisor: bool, as_json: bool) -> None:
    """Set up what runs need from the engine; say what was done."""
    import json

    from orchestrator.docker.client import DockerClient
    from orchestrator.docker.runtimes import setup_gvisor

    if not gvisor:
        raise click.UsageError("say what to set up: --gvisor")
    result = setup_gvisor(DockerClient())
    if as_json:
        data = {
            "runtimes": list(result.runtimes),
            "runsc": result.runsc,
            "changed": result.changed,
            "reloaded": result.reloaded,
            "backup": str(result.backup) if result.backup else None,
        }
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    names = ", ".join(result.runtimes)
    if not result.changed and not result.reloaded:
        click.echo(f"orchestrator: gVisor runtimes already set up ({names})", err=True)
        return
    if result.changed:
        kept = f" (previous file: {result.backup})" if result.backup else ""
        say = f"orchestrator: declared {names} ({result.runsc}) in daemon.json{kept}"
        click.echo(say, err=True)
    if result.reloaded:
        click.echo("orchestrator: dockerd reloaded its configuration (SIGHUP); verified", err=True)
