"""A waiting tool call's arguments, for a person who must see every byte they approve.

The arguments (JSON) are flattened into named values: each string as the text it is (not
as a JSON string literal, whose ``\\"`` and ``\\n`` the page's own escaping would escape a
second time), anything else as JSON. Each value has its size. :func:`preview` clips
values for the Approvals list and says so; :func:`page_of` cuts the whole of them into
pages of :data:`CHARS_PER_PAGE` characters for the call's own page. Escaping for the
page is the templates' job. Nothing here imports the web stack.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHARS_PER_PAGE",
    "PREVIEW_CHARS",
    "ArgsPage",
    "Part",
    "Value",
    "flatten",
    "page_of",
    "preview",
]

#: At most this many characters of a call's argument values on one page of the call.
CHARS_PER_PAGE = 200_000

#: At most this many characters of each value on the Approvals list.
PREVIEW_CHARS = 2_000

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KINDS = {"{}": "object", "[]": "list", "true": "true", "false": "false", "null": "null"}


@dataclass(frozen=True)
class Value:
    """One value of the arguments: where it is, what kind, and all of it as text."""

    name: str
    """Its place: ``content``, ``edits[0].old`` (``(arguments)`` for a bare value)."""
    kind: str
    """``text`` for a string, else ``number``, ``true``, ``null``, ``list``, ``object``."""
    text: str
    chars: int
    bytes: int
    lines: int


@dataclass(frozen=True)
class Part:
    """The characters ``start`` to ``end`` of one value (all of it, or a page's share)."""

    value: Value
    start: int
    end: int

    @property
    def text(self) -> str:
        return self.value.text[self.start : self.end]

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end == self.value.chars


@dataclass(frozen=True)
class ArgsPage:
    """One page of a call's arguments."""

    number: int
    pages: int
    total: int
    """Characters of all the values."""
    first: int
    """The index (from 0) of the page's first character among all."""
    last: int
    """The index (from 0) after the page's last character."""
    parts: list[Part]


def flatten(args: Any) -> list[Value]:
    """The values of ``args`` (decoded JSON), in order, each named by its place."""
    found: list[Value] = []

    def walk(name: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                key = str(key)
                step = key if _NAME.fullmatch(key) else json.dumps(key, ensure_ascii=False)
                walk(f"{name}.{step}" if name else step, inner)
            return
        if isinstance(value, list) and value:
            for index, inner in enumerate(value):
                walk(f"{name}[{index}]", inner)
            return
        if isinstance(value, str):
            kind, text = "text", value
        else:
            text = json.dumps(value, ensure_ascii=False)
            kind = _KINDS.get(text, "number")
        found.append(
            Value(
                name=name or "(arguments)",
                kind=kind,
                text=text,
                chars=len(text),
                bytes=len(text.encode("utf-8", "surrogatepass")),
                lines=text.count("\n") + (1 if text and not text.endswith("\n") else 0),
            )
        )

    walk("", args)
    return found


def preview(values: list[Value], limit: int = PREVIEW_CHARS) -> list[Part]:
    """Each value's first ``limit`` characters (a part that is not ``whole`` is clipped)."""
    return [Part(value, 0, min(value.chars, limit)) for value in values]


def page_of(values: list[Value], number: int, size: int = CHARS_PER_PAGE) -> ArgsPage:
    """Page ``number`` (from 1; past the last: the last) of all the values' characters."""
    total = sum(value.chars for value in values)
    pages = max(1, -(-total // size))
    number = min(max(number, 1), pages)
    start, end = (number - 1) * size, number * size
    parts: list[Part] = []
    offset = 0
    for value in values:
        low, high = max(start, offset), min(end, offset + value.chars)
        empty_here = value.chars == 0 and (start <= offset < end or offset == total)
        if low < high or (empty_here and number == pages if offset == total else empty_here):
            parts.append(Part(value, low - offset, high - offset))
        offset += value.chars
    return ArgsPage(number, pages, total, start, min(end, total), parts)
