"""Exit codes and trust words, spelled once (orchestrator.exits, orchestrator.vocabulary)."""

from __future__ import annotations

import signal

import click

from orchestrator.cli.main import cli
from orchestrator.exits import Exit, signalled
from orchestrator.vocabulary import TRUST_ORDER


def test_exit_codes_keep_their_values() -> None:
    assert [int(code) for code in Exit] == [124, 125, 126, 127, 137]
    assert signalled(signal.SIGINT) == 130 and signalled(signal.SIGTERM) == 143
    assert signalled(signal.SIGKILL) == Exit.OOM


def _commands(group: click.Command) -> list[click.Command]:
    found = [group]
    if isinstance(group, click.Group):  # listed as --help lists them (some load on lookup)
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, name
            found += _commands(command)
    return found


def test_every_trust_option_offers_the_trust_order() -> None:
    choices = [
        param.type.choices
        for command in _commands(cli)
        for param in command.params
        if param.name == "trust" and isinstance(param.type, click.Choice)
    ]
    assert len(choices) >= 3
    assert all(tuple(c) == TRUST_ORDER for c in choices)
