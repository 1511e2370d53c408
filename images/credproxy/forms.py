"""How a secret or a placeholder can be spelled in a request, and finding any of them.

Shared by the addon (blocking the placeholder where it does not belong, scrubbing the
value out of responses) and the entry (scrubbing the value out of the proxy's own log).
Standard library only: the image cannot import the orchestrator's package.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import urllib.parse

_JSON_ESCAPE = re.compile(rb"\\u([0-9a-fA-F]{4})")
_B64_CHARS = re.compile(rb"[A-Za-z0-9+/_-]{16,}={0,2}")


def base64_cores(secret: bytes) -> list[bytes]:
    """The parts of ``secret``'s base64 form that do not depend on what surrounds it, for
    each of the three alignments it can start at (standard and URL-safe alphabets)."""
    cores: list[bytes] = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret)
        start = (0, 2, 3)[offset]  # characters mixing in the bytes before it
        end = len(encoded) - (0, 3, 2)[(offset + len(secret)) % 3]  # ... and after it
        core = encoded[start:end]
        if len(core) >= 8:
            cores += [core, core.replace(b"+", b"-").replace(b"/", b"_")]
    return list(dict.fromkeys(cores))


def spellings(secret: str) -> list[bytes]:
    """``secret`` as it may stand in bytes: itself, percent-encoded, JSON-escaped, and the
    stable cores of its base64 forms."""
    raw = secret.encode()
    found = [
        raw,
        urllib.parse.quote(secret, safe="").encode(),
        json.dumps(secret)[1:-1].encode(),
        *base64_cores(raw),
    ]
    return [form for form in dict.fromkeys(found) if form]


def _views(data: bytes) -> list[bytes]:
    """``data`` and what it decodes to (percent, JSON escapes, base64 runs), a few levels."""
    seen = [data]
    pending = [data]
    for _ in range(3):
        fresh: list[bytes] = []
        for item in pending:
            decoded = [
                urllib.parse.unquote_to_bytes(item.replace(b"+", b" ")),
                urllib.parse.unquote_to_bytes(item),
                _JSON_ESCAPE.sub(
                    lambda m: chr(int(m.group(1), 16)).encode("utf-8", "replace"), item
                ).replace(b"\\/", b"/"),
            ]
            for run in _B64_CHARS.findall(item):
                for alphabet in (None, b"-_"):
                    try:
                        text = run.rstrip(b"=")
                        text += b"=" * (-len(text) % 4)
                        decoded.append(base64.b64decode(text, altchars=alphabet))
                    except (binascii.Error, ValueError):
                        continue
            for view in decoded:
                if view not in seen:
                    seen.append(view)
                    fresh.append(view)
        pending = fresh
        if not pending:
            break
    return seen


def contains(data: bytes, secret: str) -> bool:
    """Whether ``secret`` stands in ``data`` in any spelling (case ignored)."""
    if not data:
        return False
    wanted = secret.encode().lower()
    cores = [core.lower() for core in base64_cores(secret.encode())]
    for view in _views(data):
        lowered = view.lower()
        if wanted in lowered:
            return True
        if any(core in lowered for core in cores):
            return True
    return False


def masked(label: str, length: int) -> bytes:
    """``[label]`` padded with ``*`` (or cut) to exactly ``length`` bytes: a replacement
    that keeps a response's Content-Length true."""
    return f"[{label}]".encode().ljust(length, b"*")[:length]


def _pattern(secret: str) -> bytes:
    """A regular expression (bytes, used case-insensitively) for ``secret`` spelled as any
    mix of itself and, character by character, its percent-encoding, its JSON escape
    (``\\u00XX``, ``\\/``, ``\\"``) and ``+`` for a space: what the request side decodes
    before it searches (see ``_views``)."""
    parts: list[bytes] = []
    for char in secret:
        raw = char.encode()
        forms = [re.escape(raw)]
        forms.append(b"".join(b"%%%02x" % byte for byte in raw))
        forms += [b"\\\\u%04x" % ord(char)] if ord(char) < 0x10000 else []
        escaped = json.dumps(char)[1:-1].encode()
        if escaped != raw:
            forms.append(re.escape(escaped))
        if char == "/":
            forms.append(rb"\\/")
        if char == " ":
            forms.append(rb"\+")
        parts.append(b"(?:" + b"|".join(forms) + b")")
    return b"".join(parts)


class Scrubber:
    """Replaces secrets in a byte stream, across chunk boundaries, with a mark of the same
    length: each in every spelling the request side searches for, case ignored.

    A spelling made of one encoding (or a mix of them, character by character) and the
    stable cores of the base64 forms are replaced where they stand. A secret that is still
    found behind more than one level of encoding (``contains``) masks all the data looked
    at; ``masked`` then says so. Calling it with a chunk returns what can be passed on now
    and holds back a tail that may start a secret; calling it with ``b""`` at the end
    releases the rest."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.secrets = [secret for secret in labels if secret]
        alternatives: list[tuple[int, bytes, str]] = []
        for secret in self.secrets:
            alternatives.append((len(secret) * 6, _pattern(secret), labels[secret]))
            for core in base64_cores(secret.encode()):
                alternatives.append((len(core), re.escape(core), labels[secret]))
        # longest first: a secret's own form wins over a core of it
        alternatives.sort(key=lambda item: item[0], reverse=True)
        self.expressions = [
            (re.compile(pattern, re.IGNORECASE), label) for _, pattern, label in alternatives
        ]
        longest = max((len(secret) for secret in self.secrets), default=0)
        #: held back between chunks: long enough for two levels of encoding
        self.keep = min(longest * 16, 8192)
        self.pending = b""
        self.masked = False

    def scrub(self, data: bytes) -> bytes:
        for expression, label in self.expressions:
            data = expression.sub(lambda found, label=label: masked(label, len(found[0])), data)
        if any(contains(data, secret) for secret in self.secrets):
            self.masked = True
            return b"*" * len(data)
        return data

    def __call__(self, chunk: bytes) -> bytes:
        if not chunk:
            data, self.pending = self.scrub(self.pending), b""
            return data
        data = self.scrub(self.pending + chunk)
        if self.keep <= 0 or len(data) <= self.keep:
            self.pending = data
            return b""
        self.pending = data[-self.keep :]
        return data[: -self.keep]
