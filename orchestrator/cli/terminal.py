"""Worker text on a terminal: shown, never obeyed.

What a worker prints, and the names it chooses (inputs, files, the hosts it asks for), is
untrusted. A terminal obeys what it is sent: OSC 52 writes the clipboard, CSI sequences
move the cursor, recolour, hide or rewrite what was shown, and bidirectional overrides
reorder what is read. So when the stream it goes to is a terminal, such text is shown
escaped (``\\x1b``, ``\\u202e``) by :func:`orchestrator.escaping.escape`, the function
review listings use; newlines, tabs and backslashes stay as they are. ``--raw`` opts out
(the bytes as the worker wrote them). A pipe or a file gets the bytes unchanged, and
``--json`` output is JSON, whose encoding escapes control characters itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO, Any, TypeVar

import click

from orchestrator.escaping import StreamEscaper, escape

__all__ = ["KEEP", "Raw", "WorkerOutput", "escaping", "raw_option", "shown"]

F = TypeVar("F", bound=Callable[..., Any])

#: Characters shown as they are on a terminal: they cannot drive it.
KEEP = "\n\t\\"


class Raw:
    """Whether the command being run was given ``--raw`` (noted while parsing)."""

    asked = False


def _note_raw(_ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    Raw.asked = value
    return value


def raw_option(func: F) -> F:
    """``--raw``: the worker's output and names as they are, even on a terminal."""
    option = click.option(
        "--raw",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_note_raw,
        help="On a terminal, pass the worker's output through as it is, escape sequences "
        "and all (by default they are shown escaped, e.g. \\x1b; pipes and files always "
        "get the bytes unchanged).",
    )
    return option(func)


def escaping(stream: IO[Any]) -> bool:
    """Whether text for ``stream`` is escaped: a terminal, and no ``--raw``."""
    if Raw.asked:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or closed
        return False


def shown(text: str, stream: IO[Any] | None = None) -> str:
    """``text`` as it may go to ``stream`` (stderr by default): escaped on a terminal."""
    return escape(text, keep=KEEP) if escaping(stream or sys.stderr) else text


class WorkerOutput:
    """A worker's stdout and stderr, chunk by chunk, to two binary streams: escaped where
    the stream is a terminal (a character cut between chunks is decoded whole), as they
    are anywhere else. Call :meth:`close` at the end to flush an unfinished character."""

    def __init__(self, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.targets = {"stdout": stdout, "stderr": stderr}
        self.escapers = {
            name: StreamEscaper(keep=KEEP) if escaping(target) else None
            for name, target in self.targets.items()
        }

    def write(self, stream: str, chunk: bytes) -> None:
        target, escaper = self.targets[stream], self.escapers[stream]
        target.write(escaper.feed(chunk) if escaper is not None else chunk)
        target.flush()

    def close(self) -> None:
        for name, escaper in self.escapers.items():
            if escaper is not None:
                rest = escaper.finish()
                if rest:
                    self.targets[name].write(rest)
                    self.targets[name].flush()


def say(message: str) -> None:
    """A human message, on stderr (what a worker chose, escaped on a terminal)."""
    click.echo(f"orchestrator: {shown(message)}", err=True)
