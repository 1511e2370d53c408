"""The host's Debian apt sources, read at run time and carried over to another release.

An image that needs a newer Debian than the host's (the credential proxy's mitmproxy needs
Python >= 3.12: Debian trixie) is bootstrapped from the same archives the host uses. The
host's sources are read here, when the image is built, and handed to ``mmdebstrap`` on its
command line with the host's release name replaced by the wanted one (``bookworm`` ->
``trixie``, ``bookworm-security`` -> ``trixie-security``). No archive's address is ever
written into a file of this project.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Source", "carried_over", "host_sources"]

APT = Path("/etc/apt")
#: Suites of the host's release that are carried over (backports are not needed).
_KEPT = ("", "-updates", "-security")


@dataclass(frozen=True)
class Source:
    """One ``deb`` entry: an archive, a suite and its components."""

    uri: str
    suite: str
    components: tuple[str, ...]
    signed_by: str = ""

    def line(self) -> str:
        """The entry in apt's one-line form, as mmdebstrap takes it."""
        options = f"[signed-by={self.signed_by}] " if self.signed_by else ""
        return f"deb {options}{self.uri} {self.suite} {' '.join(self.components)}"


def host_sources(root: Path = APT) -> list[Source]:
    """Every ``deb`` entry in the host's apt sources (one-line and deb822 files)."""
    found: list[Source] = []
    files = [root / "sources.list", *sorted((root / "sources.list.d").glob("*"))]
    for file in files:
        try:
            text = file.read_text(errors="replace")
        except OSError:
            continue
        if file.suffix == ".sources":
            found += _deb822(text)
        elif file.name == "sources.list" or file.suffix == ".list":
            found += _one_line(text)
    return found


def carried_over(sources: Iterable[Source], host: str, wanted: str) -> list[Source]:
    """The host's entries for release ``host`` rewritten for release ``wanted``."""
    result: list[Source] = []
    for source in sources:
        for tail in _KEPT:
            if source.suite == host + tail:
                moved = Source(source.uri, wanted + tail, source.components, source.signed_by)
                if moved not in result:
                    result.append(moved)
    return result


def _one_line(text: str) -> list[Source]:
    found = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        signed_by = ""
        if "[" in line and "]" in line:
            options, _, rest = line[4:].partition("]")
            for option in options.strip(" [").split():
                key, _, value = option.partition("=")
                if key == "signed-by":
                    signed_by = value
            fields = rest.split()
        else:
            fields = line.split()[1:]
        if len(fields) >= 3:
            found.append(Source(fields[0], fields[1], tuple(fields[2:]), signed_by))
    return found


def _deb822(text: str) -> list[Source]:
    found = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for raw in stanza.splitlines():
            if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                continue
            key, _, value = raw.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        components = tuple(fields.get("components", "").split())
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                found.append(Source(uri, suite, components, fields.get("signed-by", "")))
    return found
