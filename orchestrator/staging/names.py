"""Path names from untrusted output: checked, normalised, and shown safely.

A name is accepted only when it is a relative path made of ordinary components: valid
UTF-8, no NUL or control characters, no invisible or bidirectional marks (they make one
name look like another), no ``..``, no component git would treat as its own folder
(``.git`` in any case, with trailing dots or spaces, with ignorable code points, or the
8.3 short name ``git~1``), and within the usual length limits. ``.`` and empty components
(``./a``, ``a//b``) are dropped, so ``./a`` and ``a`` are the same name.
"""

from __future__ import annotations

import re

from orchestrator.staging.content import INVISIBLE_EXTRA, escape

__all__ = [
    "MAX_COMPONENT_BYTES",
    "MAX_DEPTH",
    "MAX_PATH_BYTES",
    "UnsafeName",
    "is_root",
    "normal_mode",
    "printable",
    "safe_path",
    "suffix_allowed",
]

#: Longest accepted path (bytes of UTF-8) and component, as on Linux.
MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255
#: Deepest accepted folder nesting.
MAX_DEPTH = 128

_CONTROL = re.compile("[\x01-\x1f\x7f-\x9f]")
_INVISIBLE = re.compile(
    "[\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb"
    + INVISIBLE_EXTRA
    + "]"
)
_SURROGATE = re.compile("[\ud800-\udfff]")
# Code points HFS+ ignores when comparing names, so ".g\u200cit" opens ".git" there.
_IGNORABLE = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")


# Names made only of these characters, with no component starting with a dot, need no
# further checks but their lengths (the common case, checked first for speed).
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*(?:/[A-Za-z0-9_-][A-Za-z0-9._-]*)*")


class UnsafeName(ValueError):
    """A name that must not be accepted; the message is the reason."""


def printable(name: str | bytes) -> str:
    """Show ``name`` on one line with every unsafe character escaped (``\\xNN``)."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    return escape(name)


def _is_git_dir(part: str) -> bool:
    folded = _IGNORABLE.sub("", part).rstrip(". ").lower()
    return folded == ".git" or part.lower() == "git~1"


def safe_path(raw: str) -> str:
    """Return ``raw`` normalised (``a/b``), or raise :class:`UnsafeName` with the reason.

    ``raw`` is a name as decoded with ``surrogateescape``: undecodable bytes show up as
    lone surrogates and are refused as not UTF-8. An empty result (``.``, ``./``) raises
    too; callers that accept the root folder check for it first.
    """
    plain = raw[2:] if raw.startswith("./") else raw
    if (
        _PLAIN.fullmatch(plain)
        and len(plain) <= MAX_PATH_BYTES
        and plain.count("/") < MAX_DEPTH
        and all(len(part) <= MAX_COMPONENT_BYTES for part in plain.split("/"))
    ):
        return plain
    return checked_path(raw)


def checked_path(raw: str) -> str:
    """:func:`safe_path` without its fast path: every rule, one after the other."""
    if "\x00" in raw:
        raise UnsafeName("name contains a NUL byte")
    if _SURROGATE.search(raw):
        raise UnsafeName("name is not valid UTF-8")
    if _CONTROL.search(raw):
        raise UnsafeName("name contains control characters")
    if _INVISIBLE.search(raw):
        raise UnsafeName("name contains invisible or bidirectional control characters")
    if raw.startswith("/"):
        raise UnsafeName("absolute name (must be relative to the outbox)")
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if not parts:
        raise UnsafeName("empty name")
    if ".." in parts:
        raise UnsafeName("name has a '..' component")
    if any(_is_git_dir(part) for part in parts):
        raise UnsafeName("name has a '.git' component (git metadata is never collected)")
    path = "/".join(parts)
    if len(path.encode()) > MAX_PATH_BYTES:
        raise UnsafeName(f"name is longer than {MAX_PATH_BYTES} bytes")
    if any(len(part.encode()) > MAX_COMPONENT_BYTES for part in parts):
        raise UnsafeName(f"a name component is longer than {MAX_COMPONENT_BYTES} bytes")
    if len(parts) > MAX_DEPTH:
        raise UnsafeName(f"name is nested more than {MAX_DEPTH} folders deep")
    return path


def is_root(raw: str) -> bool:
    """True for the names a tar stream uses for its top folder (``.``, ``./``, empty)."""
    return all(part in ("", ".") for part in raw.split("/")) and not raw.startswith("/")


def suffix_allowed(path: str, suffixes: list[str] | tuple[str, ...] | None) -> bool:
    """True when ``suffixes`` is None or ``path`` ends with one of them (case-sensitive)."""
    return suffixes is None or any(path.endswith(suffix) for suffix in suffixes)


def normal_mode(st_mode: int) -> int:
    """``0o755`` when any execute bit is set, else ``0o644``: never setuid, setgid, sticky."""
    return 0o755 if st_mode & 0o111 else 0o644
