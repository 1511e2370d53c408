"""Looking at untrusted bytes safely: escaping for terminals, binary detection, file types.

Everything a worker produced is shown to a person through :func:`escape`, which renders
every character that could move the cursor, change colours, hide text or reorder it
(C0/C1 controls, DEL, bidirectional and zero-width marks, line separators, lone
surrogates from undecodable names) as a visible ``\\xNN`` or ``\\uNNNN`` escape.
"""

from __future__ import annotations

import math
import re
from collections import Counter

__all__ = [
    "SAMPLE_BYTES",
    "describe_type",
    "entropy",
    "escape",
    "escape_bytes",
    "is_binary",
]

#: How much of a file binary detection and entropy look at.
SAMPLE_BYTES = 64 << 10

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
