"""The host's backports suite, derived from its own apt sources (no archive is named here).

Debian 12's own ``runsc`` is too old to run everyday tools (see :mod:`.runsc`); the
release's backports suite carries a newer build of the same package. :func:`backports_source`
reads the sources the host already uses and writes the backports suite for the same URIs,
components and keys, in the host's own format:

- deb822 (``*.sources``, Debian 12's default): every paragraph of ``Types: deb`` whose
  ``Suites`` name the release itself becomes one with ``Suites: RELEASE-backports``;
- one-line (``sources.list``, ``*.list``): every ``deb [options] URI RELEASE COMPONENTS``
  line becomes the same line with ``RELEASE-backports``.

Suites such as ``RELEASE-security`` or ``RELEASE-updates`` are not the release's own, so
their archives (the security archive has no backports) are left out. Pure functions over
text, so every case is testable without apt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SourcesFile:
    """One apt sources file: its name (for the format) and its text."""

    name: str
    text: str

    @property
    def deb822(self) -> bool:
        return self.name.endswith(".sources")


def suite(release: str) -> str:
    return f"{release}-backports"


def has_backports(files: Iterable[SourcesFile], release: str) -> bool:
    """Whether an enabled ``deb`` source already names the release's backports suite."""
    wanted = suite(release)
    for file in files:
        if file.deb822:
            for fields in _paragraphs(file.text):
                if _is_deb(fields) and wanted in _words(fields, "suites"):
                    return True
        else:
            for line in _one_line_entries(file.text):
                if line[2] == wanted:
                    return True
    return False


def backports_source(files: Iterable[SourcesFile], release: str) -> SourcesFile | None:
    """The backports suite for every archive the host uses for ``release``, as one new
    sources file (deb822 when the host's release entries are deb822, one-line otherwise);
    None when no source names the release."""
    paragraphs: list[str] = []
    lines: list[str] = []
    for file in files:
        if file.deb822:
            for fields in _paragraphs(file.text):
                if _is_deb(fields) and release in _words(fields, "suites"):
                    paragraphs.append(_backports_paragraph(fields, release))
        else:
            for options, uri, _suite, components in _release_lines(file.text, release):
                lines.append(" ".join(["deb", *options, uri, suite(release), *components]))
    header = (
        f"# {suite(release)}, for the same archives as the host's {release} entries; written "
        "by `orchestrator engine setup --gvisor` to install runsc from it (only runsc).\n"
    )
    if paragraphs:
        text = header + "\n".join(dict.fromkeys(paragraphs))
        return SourcesFile(f"orchestrator-{suite(release)}.sources", text)
    if lines:
        text = header + "".join(f"{line}\n" for line in dict.fromkeys(lines))
        return SourcesFile(f"orchestrator-{suite(release)}.list", text)
    return None


# -- deb822 -------------------------------------------------------------------------------


def _paragraphs(text: str) -> list[list[tuple[str, str]]]:
    """Each paragraph as ``[(Field, value)]`` in file order; comments dropped, continuation
    lines joined to their field's value with a newline."""
    found: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if current:
                found.append(current)
                current = []
            continue
        if raw[0] in " \t" and current:
            name, value = current[-1]
            current[-1] = (name, f"{value}\n{raw.rstrip()}")
            continue
        name, sep, value = raw.partition(":")
        if sep:
            current.append((name.strip(), value.strip()))
    if current:
        found.append(current)
    return found


def _value(fields: list[tuple[str, str]], name: str) -> str:
    for field, value in fields:
        if field.lower() == name:
            return value
    return ""


def _words(fields: list[tuple[str, str]], name: str) -> list[str]:
    return _value(fields, name).split()


def _is_deb(fields: list[tuple[str, str]]) -> bool:
    """An enabled paragraph of binary packages."""
    enabled = _value(fields, "enabled").lower() not in ("no", "false", "0")
    return enabled and "deb" in _words(fields, "types")


def _backports_paragraph(fields: list[tuple[str, str]], release: str) -> str:
    out = []
    for field, value in fields:
        key = field.lower()
        if key == "enabled":
            continue
        if key == "types":
            value = "deb"
        elif key == "suites":
            value = suite(release)
        separator = "" if value.startswith("\n") else " "
        out.append(f"{field}:{separator}{value}\n")
    return "".join(out)


# -- one-line -----------------------------------------------------------------------------


def _one_line_entries(text: str) -> list[tuple[list[str], str, str, list[str]]]:
    """Each ``deb`` line as (options, URI, suite, components)."""
    found = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        rest = line[len("deb ") :].strip()
        options: list[str] = []
        if rest.startswith("["):
            closing = rest.find("]")
            if closing < 0:
                continue
            options = [rest[: closing + 1]]
            rest = rest[closing + 1 :].strip()
        words = rest.split()
        if len(words) >= 2:
            found.append((options, words[0], words[1], words[2:]))
    return found


def _release_lines(text: str, release: str) -> list[tuple[list[str], str, str, list[str]]]:
    return [entry for entry in _one_line_entries(text) if entry[2] == release]
