"""Turning an opened file into a read result: text windows by line, images, or a plain
"binary" note.

Text is read from the open descriptor up to the size ``fstat`` gave when it was opened, so
a worker appending meanwhile cannot make a read endless. Lines are counted over the whole
file (``total_lines``); the text returned is the window asked for, capped in lines and in
bytes, and ``truncated_by`` says which cap cut it.
"""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass

from orchestrator.sandbox.results import (
    BinaryContent,
    ImageContent,
    ReadResult,
    TextContent,
    TruncatedBy,
)

_CHUNK = 1 << 20
_SNIFF = 8192


@dataclass(frozen=True)
class ReadCaps:
    """Default caps of a read: lines and bytes of text, bytes of an image."""

    lines: int = 2000
    text_bytes: int = 256 << 10
    image_bytes: int = 10 << 20


def image_mime(head: bytes) -> str | None:
    """The image type a file's first bytes announce (PNG, JPEG, GIF, WebP), or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def looks_binary(head: bytes, *, whole: bool) -> bool:
    """NUL bytes, or bytes that are not UTF-8 (an incomplete last character is fine when
    ``head`` is not the ``whole`` file)."""
    if b"\0" in head:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
    except UnicodeDecodeError:
        return True
    return False


def read_content(
    fd: int, size: int, path: str, caps: ReadCaps, start: int, limit: int | None
) -> ReadResult:
    """What ``read`` returns for the regular file open at ``fd`` (``size`` from fstat)."""
    head = os.pread(fd, min(size, _SNIFF), 0)
    mime = image_mime(head)
    if mime is not None:
        if size > caps.image_bytes:
            note = f"image of {size} bytes, over the {caps.image_bytes}-byte cap; not returned"
            return BinaryContent(path, size, note, mime)
        return ImageContent(path, _read_exactly(fd, size), mime, size)
    if looks_binary(head, whole=len(head) == size):
        note = f"binary file of {size} bytes; its content is not shown"
        return BinaryContent(path, size, note)
    return _text_window(fd, size, path, caps, start, limit)


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, offset = [], 0
    while offset < size:
        data = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not data:
            break
        chunks.append(data)
        offset += len(data)
    return b"".join(chunks)


def _text_window(
    fd: int, size: int, path: str, caps: ReadCaps, start: int, limit: int | None
) -> TextContent:
    want = caps.lines if limit is None else limit
    stop = start + want  # first line number not wanted
    taken: list[bytes] = []
    room = caps.text_bytes
    cut: TruncatedBy | None = None
    line = 1  # number of the line the next byte belongs to
    newlines = 0
    offset = 0
    last = b""
    while offset < size:
        chunk = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not chunk:
            break
        offset += len(chunk)
        newlines += chunk.count(b"\n")
        last = chunk[-1:]
        i = 0
        while cut is None and line < stop and i < len(chunk):
            nl = chunk.find(b"\n", i)
            end = len(chunk) if nl < 0 else nl + 1
            if line >= start:
                piece = chunk[i:end]
                if len(piece) > room:
                    taken.append(piece[:room])
                    cut = "bytes"
                else:
                    taken.append(piece)
                    room -= len(piece)
            if nl >= 0:
                line += 1
            i = end
    total = newlines + (1 if offset and last != b"\n" else 0)
    if cut is None and stop - 1 < total:
        cut = "lines"
    data = b"".join(taken)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=cut != "bytes")  # no half character at a byte cut
    count = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return TextContent(path, text, start, count, total, size, cut is not None, cut)
