"""``orchestrator batch``: one worker over many inputs, with progress and a summary.

Progress: a live display on a terminal (done, failed, running, rate, ETA), one plain line
per finished input otherwise, and JSON lines (one event each) with ``--json``. Exit code 0
when every input succeeded, 1 when some worker failed (now or, after ``--resume``, in an
earlier invocation), 125 for the orchestrator's own errors, 128+N when stopped by signal N
(the results so far are kept: ``--resume ID``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.options import (
    WorkerCommand,
    args_argument,
    env_option,
    json_option,
    project_option,
    signals_interrupt,
    timeout_seconds,
    worker_options,
)
from orchestrator.vocabulary import BACKENDS


@click.command(cls=WorkerCommand)
@click.argument("worker")
@click.option(
    "--inputs",
    "inputs",
    multiple=True,
    metavar="PATH|GLOB",
    help="A file, a folder (its files) or a glob pattern; repeat for more.",
)
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option(
    "--resume",
    metavar="ID",
    help="Run only what batch ID has not finished (--inputs, if given, must name its inputs).",
)
@click.option("--fail-fast", is_flag=True, help="Stop at the first failure.")
@click.option("--timeout", type=timeout_seconds, help="Seconds per input (at most a week).")
@worker_options[0]
@worker_options[1]
@worker_options[2]
@env_option
@project_option
@json_option("JSON lines: one event per line, a summary last.")
@click.option(
    "--engine",
    "engine_name",
    type=click.Choice(BACKENDS),
    default="docker",
    show_default=True,
    help="swarm: each input a replicated-job service on the swarm (docs/scale-out.md).",
)
@args_argument
def batch(
    worker: str,
    inputs: tuple[str, ...],
    concurrency: int,
    resume: str | None,
    fail_fast: bool,
    timeout: float | None,
    trust: str | None,
    promote: bool,
    workspace: str,
    env: dict[str, str],
    project_dir: Path,
    as_json: bool,
    args: tuple[str, ...],
    engine_name: str,
) -> None:
    """Run WORKER once per input, each in its own new container, N at a time."""
    from orchestrator.runner import Orchestrator

    if not inputs and resume is None:
        raise click.UsageError("give --inputs PATH|GLOB (or --resume ID)")
    orch = Orchestrator(project_dir, backend=engine_name)
    show = _JsonLines() if as_json else _Live() if sys.stderr.isatty() else _Plain()
    options: dict[str, Any] = {"trust": trust, "promote": promote, "workspace": workspace}
    if env:
        options["env"] = env
    if args:
        options["args"] = args
    if timeout is not None:
        options["timeout"] = timeout
    with signals_interrupt(), show:
        result = orch.batch(
            worker,
            list(inputs),
            concurrency=concurrency,
            resume=resume,
            fail_fast=fail_fast,
            on_event=show.event,
            **options,
        )
    if not as_json:
        _table(result.summary(), result.records)
    raise SystemExit(result.exit_code)


def _printable(text: object) -> str:
    """One line, every character that could drive a terminal shown escaped: an error may
    quote what a worker wrote (input keys are made printable already)."""
    from orchestrator.escaping import escape

    return escape(str(text))


class _Plain:
    """One line per event on stderr (not a terminal)."""

    def __enter__(self) -> _Plain:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "batch":
            failed = sum(n for status, n in event["already"].items() if status != "succeeded")
            earlier = f" ({failed} of them not succeeded)" if failed else ""
            click.echo(
                f"orchestrator: batch {event['batch_id']}: {event['todo']} to run, "
                f"{event['skipped']} already done{earlier}; results in {event['folder']}",
                err=True,
            )
        elif kind == "finished":
            detail = f" ({_printable(event['error'])})" if event.get("error") else ""
            click.echo(
                f"orchestrator: {event['status']:<9} {event['key']} exit {event['exit_code']} "
                f"in {event['duration_s']:.2f} s{detail}",
                err=True,
            )
        elif kind == "retry":
            click.echo(
                f"orchestrator: retrying {event['key']}: {_printable(event['error'])}", err=True
            )
        elif kind == "interrupted":
            click.echo("orchestrator: stopping: removing the running containers", err=True)


class _JsonLines(_Plain):
    """Every event as one JSON line on stdout."""

    def event(self, event: dict[str, Any]) -> None:
        click.echo(json.dumps(event, sort_keys=True, ensure_ascii=True))


class _Live(_Plain):
    """A rich progress bar on the terminal: done, failed, running, rate, ETA."""

    def __enter__(self) -> _Live:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[counts]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.task = self.progress.add_task("batch", total=None, counts="")
        self.counts = {"failed": 0, "running": 0}
        self.started = time.monotonic()
        self.progress.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.progress.stop()

    def event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "batch":
            self.progress.update(self.task, total=event["todo"], description=event["batch_id"])
        elif kind == "started":
            self.counts["running"] += 1
        elif kind == "finished":
            self.counts["running"] = max(0, self.counts["running"] - 1)
            if event["status"] != "succeeded":
                self.counts["failed"] += 1
                self.progress.console.print(
                    f"{event['status']}: {event['key']} (exit {event['exit_code']})"
                )
            self.progress.advance(self.task)
        rate = self.progress.tasks[0].completed / max(time.monotonic() - self.started, 1e-6)
        self.progress.update(
            self.task,
            counts=f"failed {self.counts['failed']}  running {self.counts['running']}  "
            f"{rate:.1f}/s",
        )


def _table(summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"batch {summary['batch_id']}")
    for column in ("status", "inputs"):
        table.add_column(column)
    for status in ("succeeded", "failed", "timeout", "oom", "error", "cancelled"):
        if summary[status]:
            table.add_row(status, str(summary[status]))
    for status in ("succeeded", "failed", "timeout", "oom"):  # by an earlier invocation
        if summary["already"][status]:
            table.add_row(f"already {status}", str(summary["already"][status]))
    console = Console(stderr=True)
    console.print(table)
    if summary["change_id"]:
        console.print(
            f"change set {summary['change_id']} ({summary['change_files']} files, keyed by "
            f"input): review with `orchestrator staged show {summary['change_id']}`",
            markup=False,
        )
    if summary["interrupted"] is not None or any(r["status"] not in _FINAL for r in records):
        console.print(
            f"not finished: `orchestrator batch WORKER --resume {summary['batch_id']}`",
            markup=False,
        )


_FINAL = {"succeeded", "failed", "timeout", "oom"}
