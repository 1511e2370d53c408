"""Showing untrusted text safely: every character that could drive a terminal, escaped.

What a worker produced (file names, file content, its output, the hosts it asked for) is
shown to a person through :func:`escape`, which renders every character that could move
the cursor, change colours, write the clipboard (OSC 52), hide text or reorder it (C0/C1
controls, ESC, DEL, bidirectional overrides and isolates, zero-width and other invisible
marks, line separators, lone surrogates from undecodable bytes) as a visible ``\\xNN``,
``\\uNNNN`` or ``\\UNNNNNNNN`` escape. :class:`StreamEscaper` does the same for a byte
stream that arrives in chunks (a multi-byte character may be cut between two).

:func:`escape_surrogates` does less: it escapes only the lone surrogates, the one kind of
character UTF-8 cannot carry, so text bound for a file or the wire (the audit log, JSON
answers, MCP results) can always be encoded; :func:`json_safe` does it to nested data.

This module imports nothing of the project: the command line uses it for a plain run's
output without loading the staging package.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

__all__ = [
    "INVISIBLE_EXTRA",
    "StreamEscaper",
    "escape",
    "escape_bytes",
    "escape_surrogates",
    "json_safe",
]

#: Default-ignorable and private characters that render as nothing (or as anything): the
#: soft hyphen, combining grapheme joiner, Hangul fillers, variation selectors, tag
#: characters (which can spell hidden text) and the private-use planes.
INVISIBLE_EXTRA = (
    "\u00ad\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0\ufe00-\ufe0f\ue000-\uf8ff"
    "\U000e0000-\U000e007f\U000e0100-\U000e01ef\U000f0000-\U0010ffff"
)

# C0 controls but tab and newline (those are handled by ``keep``), DEL, C1 controls, the
# Arabic letter mark, zero-width and bidirectional marks and overrides, line and paragraph
# separators, invisible operators, the byte-order mark, interlinear annotations and the
# lone surrogates that ``surrogateescape`` makes from undecodable bytes.
_UNSAFE = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff" + INVISIBLE_EXTRA
)
_ESCAPE = re.compile(f"[{_UNSAFE}\t\n\\\\]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\"}


def _replace(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape(text: str, *, keep: str = "") -> str:
    """Return ``text`` with every unsafe character (and ``\\``) shown as an escape.

    ``keep`` lists characters to leave as they are: ``"\\t"`` for file content shown in a
    diff. A backslash is doubled, so an escape in the output always means an escape.
    """
    if keep:
        return _ESCAPE.sub(lambda m: m.group() if m.group() in keep else _replace(m), text)
    return _ESCAPE.sub(_replace, text)


def escape_bytes(raw: bytes, *, keep: str = "") -> str:
    """Decode ``raw`` as UTF-8 (undecodable bytes kept as ``\\xNN``) and :func:`escape` it."""
    return escape(raw.decode("utf-8", "surrogateescape"), keep=keep)


_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(text: str) -> str:
    """Return ``text`` with every lone surrogate written as an escape, so it is valid UTF-8.

    ``os.fsdecode`` turns a file name's undecodable byte into a lone surrogate
    (``bad\\xff.txt`` becomes ``"bad\\udcff.txt"``), which UTF-8 cannot encode; here it
    becomes ``\\xNN`` (the byte it stands for, as :func:`escape` shows it), any other lone
    surrogate ``\\uNNNN``. Nothing else changes: text without surrogates comes back as it was.
    """
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(_replace, text)


def json_safe(value: Any) -> Any:
    """``value`` (JSON data: dicts, lists, tuples, scalars) with every string, keys too,
    passed through :func:`escape_surrogates`, so any JSON encoder can write it as UTF-8."""
    if isinstance(value, str):
        return escape_surrogates(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


class StreamEscaper:
    """Escapes a byte stream chunk by chunk, as :func:`escape_bytes` would the whole.

    Undecodable bytes become ``\\xNN``; a character cut between two chunks is decoded
    whole; what an unfinished character left at the end is escaped by :meth:`finish`.
    """

    def __init__(self, *, keep: str = "") -> None:
        self.keep = keep
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")

    def feed(self, chunk: bytes) -> bytes:
        """The escaped form of ``chunk`` (UTF-8), given what came before it."""
        return escape(self._decoder.decode(chunk), keep=self.keep).encode("utf-8")

    def finish(self) -> bytes:
        """The escaped form of whatever the stream's last bytes left undecoded."""
        return escape(self._decoder.decode(b"", final=True), keep=self.keep).encode("utf-8")
