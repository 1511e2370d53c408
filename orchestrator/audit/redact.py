"""Keep secret values out of the audit log.

A :class:`TextRedactor` holds the secret values registered so far and replaces every literal
occurrence of any of them, in every string of an entry (field values, nested metadata
values and dict keys alike), with :data:`REDACTED`. Occurrences that overlap are merged so
no fragment of a secret survives. Values shorter than :data:`MIN_SECRET_LENGTH` characters
are ignored: redacting ``"a"`` or ``"on"`` would mangle every entry and hide nothing.

:meth:`TextRedactor.clean` also turns any value into plain JSON data (paths, dates, enums,
sets and other objects become strings or lists) so every entry can be written and hashed,
and every string of it into valid UTF-8 (:func:`~orchestrator.escaping.escape_surrogates`:
a worker's undecodable file name ``bad\xff.txt`` is recorded as that text).
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time
from typing import Any

from orchestrator.escaping import escape_surrogates

__all__ = ["MIN_SECRET_LENGTH", "REDACTED", "TextRedactor"]

#: What a secret is replaced with.
REDACTED = "[REDACTED]"

#: Secrets shorter than this are ignored (see the module docstring).
MIN_SECRET_LENGTH = 4

_CYCLE = "[cycle]"


class TextRedactor:
    """Replace registered secret values in strings and nested JSON data."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Register every value of ``secrets`` (short or empty ones are ignored)."""
        # A tuple replaced as a whole on each add: readers in other threads never see a
        # half-updated collection.
        self._secrets: tuple[str, ...] = ()
        for secret in secrets:
            self.add(secret)

    def __len__(self) -> int:
        """Return how many secrets are registered."""
        return len(self._secrets)

    def add(self, secret: str) -> bool:
        """Register ``secret``; return False when it is ignored (too short or known)."""
        if not isinstance(secret, str):
            raise TypeError(f"a secret must be a string, not {type(secret).__name__}")
        secret = escape_surrogates(secret)  # as it appears in the escaped text
        if len(secret) < MIN_SECRET_LENGTH or secret in self._secrets:
            return False
        # Longest first, so the common case of one match needs no merging.
        self._secrets = tuple(sorted((*self._secrets, secret), key=len, reverse=True))
        return True

    def redact_text(self, text: str) -> str:
        """Return ``text`` with every occurrence of every secret replaced (and every lone
        surrogate escaped, so the result is valid UTF-8)."""
        text = escape_surrogates(text)
        if not self._secrets:
            return text
        hits = [secret for secret in self._secrets if secret in text]
        if not hits:
            return text
        spans: list[tuple[int, int]] = []
        for secret in hits:
            start = text.find(secret)
            while start != -1:
                spans.append((start, start + len(secret)))
                start = text.find(secret, start + 1)
        spans.sort()
        pieces: list[str] = []
        position = 0
        span_start, span_end = spans[0]
        for start, end in spans[1:]:
            if start < span_end:  # overlapping; touching ones stay two markers
                span_end = max(span_end, end)
                continue
            pieces += (text[position:span_start], REDACTED)
            position = span_end
            span_start, span_end = start, end
        pieces += (text[position:span_start], REDACTED, text[span_end:])
        return "".join(pieces)

    def clean(self, value: object) -> Any:
        """Return ``value`` as plain JSON data with every secret replaced."""
        return self._clean(value, set())

    def clean_text(self, value: object | None) -> str | None:
        """Return ``value`` as a redacted string, or None when it is None."""
        if value is None:
            return None
        return self.redact_text(value if type(value) is str else _as_text(value))

    def _clean(self, value: object, active: set[int]) -> Any:
        if type(value) is str:  # the common cases first
            return self.redact_text(value)
        if value is None or type(value) is bool or type(value) is int:
            return value
        if isinstance(value, str):
            return self.redact_text(_as_text(value))
        if isinstance(value, enum.Enum):
            return self._clean(value.value, active)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value) if math.isfinite(value) else str(value)
        if isinstance(value, Mapping | list | tuple | set | frozenset):
            if id(value) in active:
                return _CYCLE
            active.add(id(value))
            try:
                if isinstance(value, Mapping):
                    return {
                        self.redact_text(_key_text(key)): self._clean(item, active)
                        for key, item in value.items()
                    }
                return [self._clean(item, active) for item in value]
            finally:
                active.discard(id(value))
        return self.redact_text(_as_text(value))


def _key_text(key: object) -> str:
    """Turn a dict key into the string JSON would write for it."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, enum.Enum):
        return _key_text(key.value)
    return _as_text(key)


def _as_text(value: object) -> str:
    """Turn a scalar into text: paths, dates and bytes get their natural form."""
    if isinstance(value, str):
        return str.__str__(value)  # a plain copy, even of a str subclass
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        return path if isinstance(path, str) else path.decode("utf-8", "backslashreplace")
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "backslashreplace")
    return str(value)
