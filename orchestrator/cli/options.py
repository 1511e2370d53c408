"""Options shared by several commands, defined once."""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

from orchestrator.timeouts import MAX_SESSION_S, MAX_TIMEOUT_S, seconds_problem
from orchestrator.vocabulary import TRUST_ORDER

F = TypeVar("F", bound=Callable[..., Any])

project_option = click.option(
    "--project",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Project folder (holding orchestrator.yaml).",
)

#: ``clear`` and ``staged apply``: each file the sensitive-path check flags, named.
ack_sensitive_option = click.option(
    "--ack-sensitive",
    "acknowledged",
    metavar="PATH",
    multiple=True,
    help="Acknowledge that PATH, a file that runs code at the next build, test or CI run "
    "(conftest.py, Makefile, .github/workflows/...), was read; needed for each such file "
    "(recorded in the audit log). Repeatable.",
)


class JsonRequest:
    """Whether the command being run asked for ``--json``: noted while its options are
    parsed, so that :func:`~orchestrator.cli.main.main` can report a failure as JSON too."""

    asked = False


def _note_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        JsonRequest.asked = True
    return value


def json_option(help: str = "Print one JSON object.") -> Callable[[F], F]:
    """``--json``: the command's output as JSON on stdout, and its failure as one object."""
    return click.option(
        "--json", "as_json", is_flag=True, is_eager=True, callback=_note_json, help=help
    )


class _Seconds(click.FloatRange):
    """A number of seconds in a range; unlike a plain ``FloatRange``, never NaN (which
    compares false with both ends, so a range alone lets it through)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value} is not in the range {self._describe_range()}.", param, ctx)
        return seconds


#: ``--timeout`` of ``run``, ``batch`` and ``session exec``: seconds, at most a week.
timeout_seconds = _Seconds(min=0, min_open=True, max=MAX_TIMEOUT_S)


def parse_duration_option(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> float | None:
    """A session's duration (``90s``, ``15m``, ``1d12h``; a bare number is seconds) as
    seconds, at most a year; ``never`` (or ``none``, ``0``) is None: no limit."""
    from orchestrator.runtime.session_folders import parse_duration

    if value is None or value.lower() in {"none", "never", "0"}:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    problem = seconds_problem(seconds, MAX_SESSION_S)
    if problem:
        raise click.BadParameter(f"'{value}': {problem} (a year); use 'never' for no limit")
    return seconds


def _env_pairs(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values:
        name, equals, text = value.partition("=")
        if not equals or not name:
            raise click.BadParameter(f"'{value}' is not K=V; write it like --env LANG=C.UTF-8")
        env[name] = text
    return env


env_option = click.option(
    "--env",
    multiple=True,
    metavar="K=V",
    callback=_env_pairs,
    help="An environment variable for the worker (repeatable).",
)
#: Everything after ``--``: appended to the worker's command.
args_argument = click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS...]")


class WorkerCommand(click.Command):
    """A command whose worker arguments (``args_argument``) must follow ``--``.

    Without this a word no option takes would become an argument of the worker: ``--inputs
    a.pdf b.pdf``, or a shell glob after ``--input``, would run on ``a.pdf`` alone and hand
    ``b.pdf`` to the worker as an argument.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        after = len(args) - args.index("--") - 1 if "--" in args else 0
        rest = super().parse_args(ctx, args)
        given: tuple[str, ...] = ctx.params.get("args") or ()
        if len(given) > after:
            raise click.UsageError(
                f"unexpected argument {given[0]!r}: repeat the option for each value "
                "(--input A --input B) and put the worker's arguments after --",
                ctx,
            )
        return rest


#: How a worker runs: trust level and workspace (``plan``, ``run`` and ``batch`` share them).
worker_options = (
    click.option(
        "--trust",
        type=click.Choice(TRUST_ORDER),
        help="Run at this trust level (only lower than declared, unless --promote).",
    ),
    click.option("--promote", is_flag=True, help="Allow --trust above the declared level."),
    click.option("--workspace", default="default", show_default=True, help="Workspace name."),
)


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`~orchestrator.runtime.Interrupted`, so every
    clean-up path runs (containers removed, folders put back) before the command exits."""
    from orchestrator.runtime import Interrupted

    def handler(signum: int, _frame: FrameType | None) -> NoReturn:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
