"""Looking at untrusted bytes safely: escaping for terminals, binary detection, file types.

Everything a worker produced is shown to a person through :func:`escape` (from
:mod:`orchestrator.escaping`, re-exported here), which renders every character that could
move the cursor, change colours, hide text or reorder it (C0/C1 controls, DEL,
bidirectional and zero-width marks, line separators, lone surrogates from undecodable
names) as a visible ``\\xNN`` or ``\\uNNNN`` escape.
"""

from __future__ import annotations

import math
from collections import Counter

from orchestrator.escaping import INVISIBLE_EXTRA, escape, escape_bytes

__all__ = [
    "INVISIBLE_EXTRA",
    "SAMPLE_BYTES",
    "describe_type",
    "entropy",
    "escape",
    "escape_bytes",
    "is_binary",
]

#: How much of a file binary detection and entropy look at.
SAMPLE_BYTES = 64 << 10

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
