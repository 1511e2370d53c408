"""``orchestrator engine setup``: prepare the local Docker engine for the orchestrator.

``--gvisor``: make sure runsc runs everyday tools, installing it from the release's
backports through the host's apt when it does not (:mod:`orchestrator.docker.runsc`), then
declare the gVisor runtimes untrusted workers run under (:mod:`orchestrator.docker.runtimes`).
``--firewall``: the host firewall rule and its exceptions, as ``doctor --fix`` applies them
(:mod:`orchestrator.doctor.firewall`). Errors are left for the main command to turn into one
line and exit code 125.
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
    help="Check that runsc runs everyday tools (`runsc do ls -l`, `stat`); if not, install "
    "runsc alone from the release's backports suite with the host's apt (adding the suite "
    "for the host's own archives when missing). Then declare the gVisor runtimes in "
    "/etc/docker/daemon.json and reload dockerd with SIGHUP (no restart, running containers "
    "keep running). Idempotent.",
)
@click.option(
    "--firewall",
    is_flag=True,
    help="Add the host firewall rule that keeps allowlisted workers away from the host's "
    "services, and ahead of it the exceptions engines need (Podman's DNS on its outside "
    "bridge's own address; the host's resolver when it is Docker's), as `orchestrator "
    "doctor --fix` does: each only when `iptables -C` does not find it. Idempotent.",
)
@json_option()
def setup(gvisor: bool, firewall: bool, as_json: bool) -> None:
    """Set up what runs need from the engine; say what was done."""
    import json

    if not (gvisor or firewall):
        raise click.UsageError("say what to set up: --gvisor, --firewall")
    data: dict[str, object] = {}
    if gvisor:
        data.update(_gvisor(as_json))
    if firewall:
        data["firewall"] = _firewall(as_json)
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))


def _firewall(as_json: bool) -> list[str]:
    """The host rule (:func:`orchestrator.doctor.firewall.apply_fix`); the commands run."""
    from orchestrator.doctor.firewall import FirewallError, apply_fix
    from orchestrator.errors import OrchestratorError

    try:
        done = apply_fix()
    except FirewallError as exc:
        raise OrchestratorError(f"the host firewall rule: {exc}") from None
    if not as_json:
        for line in done or ["already in place (iptables -C)"]:
            click.echo(f"orchestrator: host firewall rule: {line}", err=True)
    return done


def _gvisor(as_json: bool) -> dict[str, object]:
    from orchestrator.docker import runsc
    from orchestrator.docker.client import DockerClient
    from orchestrator.docker.runtimes import setup_gvisor

    def say(line: str) -> None:
        if not as_json:
            click.echo(f"orchestrator: {line}", err=True)

    working = runsc.ensure_working(say=say)
    result = setup_gvisor(DockerClient(), runsc=working.path)
    if as_json:
        return {
            "runtimes": list(result.runtimes),
            "runsc": result.runsc,
            "runsc_version": working.version,
            "runsc_installed": working.installed,
            "apt_source_written": str(working.source_written) if working.source_written else None,
            "changed": result.changed,
            "reloaded": result.reloaded,
            "backup": str(result.backup) if result.backup else None,
        }
    names = ", ".join(result.runtimes)
    checked = "installed from backports; " if working.installed else ""
    say(f"{working.version} ({working.path}): {checked}runs ls -l and stat under gVisor")
    if not result.changed and not result.reloaded:
        click.echo(f"orchestrator: gVisor runtimes already set up ({names})", err=True)
        return {}
    if result.changed:
        kept = f" (previous file: {result.backup})" if result.backup else ""
        say(f"declared {names} ({result.runsc}) in daemon.json{kept}")
    if result.reloaded:
        click.echo("orchestrator: dockerd reloaded its configuration (SIGHUP); verified", err=True)
    return {}
