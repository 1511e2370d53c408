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


class Scrubber:
    """Replaces secrets (each in every spelling) in a byte stream, across chunk boundaries,
    with a mark of the same length.

    Calling it with a chunk returns what can be passed on now and holds back a tail that
    may start a secret; calling it with ``b""`` at the end releases the rest."""

    def __init__(self, labels: dict[str, str]) -> None:
        pairs: list[tuple[bytes, bytes]] = []
        for secret, label in labels.items():
            for form in spellings(secret):
                pairs.append((form, masked(label, len(form))))
        self.pairs = sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)
        self.keep = max((len(form) for form, _ in self.pairs), default=1) - 1
        self.pending = b""

    def scrub(self, data: bytes) -> bytes:
        for form, shown in self.pairs:
            if form in data:
                data = data.replace(form, shown)
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
