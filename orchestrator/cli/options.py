"""Options shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path

import click

project_option = click.option(
    "--project",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Project folder (holding orchestrator.yaml).",
)
