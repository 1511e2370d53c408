"""Looking at untrusted bytes safely: escaping for terminals, binary detection, file types.

Everything a worker produced is shown to a person through :func:`escape` (from
:mod:`orchestrator.escaping`, re-exported here), which renders every character that could
move the cursor, change colours, hide text or reorder it (C0/C1 controls, DEL,
bidirectional and zero-width marks, line separators, lone surrogates from undecodable
names) as a visible ``\\xNN`` or ``\\uNNNN`` escape.

:class:`TextCheck` reads a whole file, chunk by chunk, for what decides how it is shown
and judged: its first NUL byte (binary: summarised, and flagged by the binary scanner)
and its first byte that is not UTF-8 (shown escaped, and flagged as well). Both look at
every byte, so text up front cannot hide what comes after it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from orchestrator.escaping import INVISIBLE_EXTRA, escape, escape_bytes

__all__ = [
    "INVISIBLE_EXTRA",
    "MAX_SHOWN_BYTES",
    "SAMPLE_BYTES",
    "TextCheck",
    "describe_type",
    "entropy",
    "escape",
    "escape_bytes",
    "is_binary",
]

#: The window entropy is measured over, and the head a binary file's type is named from.
SAMPLE_BYTES = 64 << 10
#: The largest file the diff shows in full; a larger one is summarised, and flagged.
MAX_SHOWN_BYTES = 1 << 20

# (offset, magic bytes, description), most specific first.
_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"%PDF-", "PDF document"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG image"),
    (0, b"GIF87a", "GIF image"),
    (0, b"GIF89a", "GIF image"),
    (0, b"\xff\xd8\xff", "JPEG image"),
    (0, b"RIFF", "RIFF container (WAV/AVI/WebP)"),
    (0, b"PK\x03\x04", "ZIP archive (or docx/xlsx/jar/apk)"),
    (0, b"PK\x05\x06", "ZIP archive (empty)"),
    (0, b"\x7fELF", "ELF executable or library"),
    (0, b"MZ", "Windows executable (PE/DOS)"),
    (0, b"\xcf\xfa\xed\xfe", "Mach-O executable"),
    (0, b"\xce\xfa\xed\xfe", "Mach-O executable"),
    (0, b"\xca\xfe\xba\xbe", "Java class or Mach-O universal binary"),
    (0, b"\x00asm", "WebAssembly module"),
    (0, b"#!", "script with an interpreter line"),
    (0, b"\x1f\x8b", "gzip data"),
    (0, b"BZh", "bzip2 data"),
    (0, b"\xfd7zXZ\x00", "xz data"),
    (0, b"\x28\xb5\x2f\xfd", "zstd data"),
    (0, b"7z\xbc\xaf\x27\x1c", "7-Zip archive"),
    (0, b"Rar!\x1a\x07", "RAR archive"),
    (0, b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "OLE document (old MS Office)"),
    (0, b"SQLite format 3\x00", "SQLite database"),
    (0, b"OggS", "Ogg media"),
    (0, b"ID3", "MP3 audio"),
    (4, b"ftyp", "MP4/QuickTime media"),
    (257, b"ustar", "tar archive"),
)


def is_binary(sample: bytes) -> bool:
    """True when ``sample`` (a file's first bytes) holds a NUL or is not UTF-8 text."""
    if b"\x00" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the end of the sample is still text.
        return not (exc.start >= len(sample) - 3 and exc.reason == "unexpected end of data")
    return False


def describe_type(sample: bytes) -> str:
    """Name the kind of file ``sample`` starts like (magic bytes), or a generic label."""
    for offset, magic, description in _MAGIC:
        if sample[offset : offset + len(magic)] == magic:
            return description
    return "binary data" if is_binary(sample) else "text"


def entropy(sample: bytes) -> float:
    """Shannon entropy of ``sample`` in bits per byte (0 for empty input, at most 8)."""
    if not sample:
        return 0.0
    total = len(sample)
    return -sum(n / total * math.log2(n / total) for n in Counter(sample).values())


class TextCheck:
    """Where a byte stream stops being UTF-8 text: its first NUL, its first undecodable byte.

    Feed it every chunk, then call :meth:`finish`; a character cut between two chunks is
    judged whole, and one left unfinished at the end counts as undecodable.
    """

    def __init__(self) -> None:
        self.nul: int | None = None
        """The offset of the first NUL byte, if any."""
        self.invalid: int | None = None
        """The offset of the first byte that is not part of a valid UTF-8 character."""
        self._seen = 0
        self._pending = b""  # an unfinished character, starting at ``_seen - len(...)``

    def feed(self, chunk: bytes) -> None:
        """Look at the next ``chunk`` of the stream."""
        if self.nul is None and (found := chunk.find(b"\0")) >= 0:
            self.nul = self._seen + found
        start = self._seen - len(self._pending)
        self._seen += len(chunk)
        if self.invalid is not None:
            return
        data = self._pending + chunk
        try:
            data.decode("utf-8")
            self._pending = b""
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data" and exc.start >= len(data) - 3:
                self._pending = data[exc.start :]
            else:
                self.invalid = start + exc.start

    def finish(self) -> TextCheck:
        """End of the stream: an unfinished last character is undecodable."""
        if self.invalid is None and self._pending:
            self.invalid = self._seen - len(self._pending)
        self._pending = b""
        return self

    @classmethod
    def of(cls, chunks: Iterable[bytes]) -> TextCheck:
        """The check of a whole stream given as ``chunks``."""
        check = cls()
        for chunk in chunks:
            check.feed(chunk)
        return check.finish()
