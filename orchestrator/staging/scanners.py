"""Scanners: small checks run over a change set before it may be cleared.

A scanner has a ``name`` and ``scan(change, store) -> ScanResult``; a result that is not
``ok`` blocks clearance unless a person overrides it (:func:`blocking` lists those). A
scanner that crashes counts as failed, never as passed. Findings name the file and what
was seen, never the secret itself, since they are stored in the manifest and the log.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from orchestrator.config.models import OutboxLimits
from orchestrator.staging.blobs import CHUNK
from orchestrator.staging.content import (
    MAX_SHOWN_BYTES,
    SAMPLE_BYTES,
    TextCheck,
    describe_type,
    entropy,
)
from orchestrator.staging.manifest import ChangeFile, ChangeSet, Finding, ScanResult
from orchestrator.staging.names import suffix_allowed
from orchestrator.staging.store import ChangeStore

__all__ = [
    "DANGEROUS_SUFFIXES",
    "DEFAULT_SCANNERS",
    "SECRET_PATTERNS",
    "SENSITIVE",
    "SENSITIVE_PATHS",
    "ContentScanner",
    "Scanner",
    "SecretScanner",
    "SensitivePathScanner",
    "SizeScanner",
    "SuffixScanner",
    "acknowledgement_problem",
    "blocking",
    "run_scanners",
    "scanners_for",
    "sensitive_pattern",
    "split_sensitive",
]


@runtime_checkable
class Scanner(Protocol):
    """A check over a change set."""

    @property
    def name(self) -> str: ...

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult: ...


def _contents(change: ChangeSet) -> list[ChangeFile]:
    return [f for f in change.files if f.sha256 is not None]


def _result(name: str, findings: list[Finding]) -> ScanResult:
    return ScanResult(name, not findings, tuple(findings))


def _windows(store: ChangeStore, change: ChangeSet, item: ChangeFile) -> Iterator[bytes]:
    """The file's content, :data:`SAMPLE_BYTES` at a time."""
    assert item.sha256 is not None
    with store.open_blob(change.id, item.sha256) as blob:
        while window := blob.read(SAMPLE_BYTES):
            yield window


@dataclass(frozen=True)
class SizeScanner:
    """Files over a per-file cap, a change set over a total cap, and files too large for
    the diff to show (`staged show` summarises them: the review would not see their bytes)."""

    max_file_size: int = OutboxLimits().max_file_size
    max_total: int = OutboxLimits().size
    name: str = "size"
    max_shown: int = MAX_SHOWN_BYTES

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = [
            Finding(f.path, f"{f.size} bytes, over the per-file cap of {self.max_file_size}")
            if f.size > self.max_file_size
            else Finding(
                f.path,
                f"{f.size} bytes, over the {self.max_shown} the diff shows: "
                "the review does not show its content",
            )
            for f in _contents(change)
            if f.size > min(self.max_file_size, self.max_shown)
        ]
        total = sum(f.size for f in change.files)
        if total > self.max_total:
            findings.append(Finding("", f"{total} bytes in all, over the cap of {self.max_total}"))
        return _result(self.name, findings)


@dataclass(frozen=True)
class ContentScanner:
    """Binary files (named by type), text that is not UTF-8, and high-entropy text
    (encoded or encrypted data). Every byte of every file is read: text up front hides
    nothing behind it."""

    text_entropy: float = 5.8
    """Bits per byte above which a window of at least ``min_sample`` bytes is flagged
    (windows of :data:`SAMPLE_BYTES` in the first :data:`MAX_SHOWN_BYTES`)."""
    min_sample: int = 1024
    name: str = "binary"

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = []
        for item in _contents(change):
            message = self._judge(store, change, item)
            if message is not None:
                findings.append(Finding(item.path, message))
        return _result(self.name, findings)

    def _judge(self, store: ChangeStore, change: ChangeSet, item: ChangeFile) -> str | None:
        check, head, offset = TextCheck(), b"", 0
        bits, where = 0.0, 0  # the highest entropy of a window, and where that window starts
        for window in _windows(store, change, item):
            check.feed(window)
            head = head or window
            # Entropy where the diff shows the text (a larger file is flagged by size).
            shown = offset < MAX_SHOWN_BYTES and len(window) >= self.min_sample
            if shown and (found := entropy(window)) > bits:
                bits, where = found, offset
            offset += len(window)
        check.finish()
        if check.nul is not None:
            if check.nul < len(head):
                return f"binary content: {describe_type(head)}"
            return f"binary content from byte {check.nul}"
        if check.invalid is not None:
            return (
                f"not UTF-8 text from byte {check.invalid}: the diff shows its undecodable "
                "bytes escaped (\\xNN)"
            )
        if bits > self.text_entropy:
            at = f" from byte {where}" if where else ""
            return f"high-entropy text ({bits:.2f} bits/byte{at}): encoded data?"
        return None


#: Suffixes of executables and scripts that run on double-click, flagged by default.
DANGEROUS_SUFFIXES = (
    ".exe", ".dll", ".so", ".dylib", ".com", ".scr", ".msi", ".bat", ".cmd", ".ps1",
    ".vbs", ".lnk", ".jar", ".apk", ".app", ".pif", ".hta", ".wsf", ".reg",
)  # fmt: skip


@dataclass(frozen=True)
class SuffixScanner:
    """Names outside an allowlist (when given) or with an executable suffix."""

    allowed: tuple[str, ...] | None = None
    denied: tuple[str, ...] = DANGEROUS_SUFFIXES
    name: str = "suffix"

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = []
        for item in _contents(change):
            if not suffix_allowed(item.path, self.allowed):
                findings.append(Finding(item.path, "suffix is not in this target's allowlist"))
            elif item.path.lower().endswith(self.denied):
                findings.append(Finding(item.path, "executable or script file type"))
        return _result(self.name, findings)


#: (what, pattern) pairs matched against file bytes.
SECRET_PATTERNS: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("private key (PEM)", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    (
        "AWS access key id",
        re.compile(
            rb"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA)[A-Z0-9]{16}(?![A-Z0-9])"
        ),
    ),
    ("GitHub token", re.compile(rb"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36,}")),
    ("GitHub fine-grained token", re.compile(rb"github_pat_[A-Za-z0-9_]{22,}")),
    ("Slack token", re.compile(rb"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}")),
    ("Slack webhook", re.compile(rb"hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/")),
    (
        "password or key assignment",
        re.compile(
            rb"(?i)(?<![a-z0-9])(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|"
            rb"access[_-]?token|auth[_-]?token|client[_-]?secret|private[_-]?key)"
            rb"[\"']?\s*[:=]\s*[\"']?[^\s\"'`,;]{12,}"
        ),
    ),
)
_OVERLAP = 4096


def _chunks(store: ChangeStore, change: ChangeSet, item: ChangeFile) -> Iterator[bytes]:
    assert item.sha256 is not None
    with store.open_blob(change.id, item.sha256) as blob:
        while data := blob.read(CHUNK):
            yield data


@dataclass(frozen=True)
class SecretScanner:
    """Secret-looking content: private keys, cloud and chat tokens, password assignments."""

    patterns: tuple[tuple[str, re.Pattern[bytes]], ...] = SECRET_PATTERNS
    name: str = "secrets"

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = []
        for item in _contents(change):
            seen: set[tuple[str, int]] = set()
            for what, line in self._matches(store, change, item):
                if (what, line) not in seen:
                    seen.add((what, line))
                    findings.append(Finding(item.path, f"{what} on line {line}"))
        return _result(self.name, findings)

    def _matches(
        self, store: ChangeStore, change: ChangeSet, item: ChangeFile
    ) -> Iterator[tuple[str, int]]:
        tail, offset, lines = b"", 0, 1  # tail starts at ``offset``, on line ``lines``
        starts: set[tuple[str, int]] = set()
        for chunk in _chunks(store, change, item):
            window = tail + chunk
            for what, pattern in self.patterns:
                for match in pattern.finditer(window):
                    if (what, offset + match.start()) not in starts:
                        starts.add((what, offset + match.start()))
                        yield what, lines + window.count(b"\n", 0, match.start())
            keep = max(0, len(window) - _OVERLAP)
            lines += window.count(b"\n", 0, keep)
            offset += keep
            tail = window[keep:]


#: Files that run code by themselves: at the next build, test or CI run, in an editor, in
#: git. Patterns as ``clearance.sensitive_paths`` takes them (docs/configuration.md): a
#: pattern without ``/`` matches a file name in any folder, one with ``/`` the whole path;
#: ``*`` and ``?`` stay within a name, ``**`` spans folders; letter case is ignored.
SENSITIVE_PATHS: tuple[str, ...] = (
    # tests and builds: run by pytest, make, pip, npm, cargo, docker, ...
    "conftest.py", "pytest.ini", "tox.ini", "noxfile.py", "setup.py", "setup.cfg",
    "pyproject.toml", "sitecustomize.py", "usercustomize.py",
    "Makefile", "GNUmakefile", "*.mk", "CMakeLists.txt", "*.cmake", "meson.build",
    "justfile", "Taskfile.yml", "Taskfile.yaml", "Rakefile", "Gemfile", "*.gemspec",
    "package.json", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs", "build.rs",
    "Cargo.toml", ".cargo/**", "**/.cargo/**", "build.gradle", "build.gradle.kts",
    "settings.gradle", "settings.gradle.kts", "gradlew", "pom.xml", "Dockerfile",
    "Dockerfile.*", "*.dockerfile", "Containerfile", "docker-compose.yml",
    "docker-compose.yaml", "compose.yml", "compose.yaml",
    # CI definitions
    ".github/**", ".gitlab/**", ".gitea/**", ".forgejo/**", ".circleci/**", ".buildkite/**",
    ".gitlab-ci.yml", ".gitlab-ci.yaml", ".travis.yml", ".travis.yaml", ".woodpecker.yml",
    ".woodpecker.yaml", ".woodpecker/**", "Jenkinsfile", "azure-pipelines.yml",
    "azure-pipelines.yaml",
    # editors, shells, tool managers
    ".vscode/**", ".idea/**", ".devcontainer/**", ".devcontainer.json", ".envrc",
    ".mise.toml", ".tool-versions", ".pre-commit-config.yaml", ".pre-commit-config.yml",
    # git
    ".gitmodules", ".gitattributes", ".gitignore", ".lfsconfig",
    "**/.githooks/**", "**/hooks/**", "**/.husky/**",
)  # fmt: skip
#: The name of the scanner whose findings `clear` wants acknowledged one by one.
SENSITIVE = "sensitive-paths"
_RUNS_CODE = "runs code by itself (at the next build, test or CI run, in an editor or in git)"


def _glob(pattern: str) -> str:
    parts = pattern.split("/")
    out = "^" if len(parts) > 1 else "(?:^|/)"
    for number, part in enumerate(parts):
        last = number == len(parts) - 1
        if part == "**":
            out += ".*" if last else "(?:[^/]*/)*"
            continue
        out += "".join({"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c)) for c in part)
        out += "$" if last else "/"
    return out


def sensitive_pattern(patterns: Sequence[str]) -> re.Pattern[str]:
    """One regular expression matching a path that any of ``patterns`` matches."""
    return re.compile("(?i)" + "|".join(f"(?:{_glob(p)})" for p in patterns))


@dataclass(frozen=True)
class SensitivePathScanner:
    """New or changed files that builds, tests, CI, editors or git run by themselves, and
    executables. `clear` wants each of them acknowledged by name (``--ack-sensitive``)."""

    name: str = SENSITIVE
    pattern: re.Pattern[str] = field(default=sensitive_pattern(SENSITIVE_PATHS))

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = [
            Finding(f.path, _RUNS_CODE) for f in _contents(change) if self.pattern.search(f.path)
        ]
        findings += [
            Finding(f.path, "executable (mode 0755): a program or hook, not a result to read")
            for f in _contents(change)
            if f.mode is not None and f.mode & 0o111 and not self.pattern.search(f.path)
        ]
        return _result(self.name, findings)


DEFAULT_SCANNERS: tuple[Scanner, ...] = (
    SizeScanner(),
    ContentScanner(),
    SuffixScanner(),
    SecretScanner(),
    SensitivePathScanner(),
)


def scanners_for(
    *,
    limits: OutboxLimits | None = None,
    suffixes: Sequence[str] | None = None,
    sensitive: Sequence[str] = (),
) -> tuple[Scanner, ...]:
    """The default scanners with a target's own caps and suffix allowlist, and the
    project's ``sensitive`` path patterns on top of :data:`SENSITIVE_PATHS`."""
    limits = limits or OutboxLimits()
    paths = SensitivePathScanner(pattern=sensitive_pattern((*SENSITIVE_PATHS, *sensitive)))
    return (
        SizeScanner(limits.max_file_size, limits.size),
        ContentScanner(),
        SuffixScanner(tuple(suffixes) if suffixes is not None else None),
        SecretScanner(),
        paths,
    )


def run_scanners(
    change: ChangeSet, store: ChangeStore, scanners: Sequence[Scanner] = DEFAULT_SCANNERS
) -> list[ScanResult]:
    """Run every scanner; one that raises is a failed result naming the error."""
    results = []
    for scanner in scanners:
        try:
            results.append(scanner.scan(change, store))
        except Exception as exc:  # noqa: BLE001 - a broken check must fail closed, not crash
            message = f"scanner failed: {type(exc).__name__}: {exc}"[:300]
            results.append(ScanResult(scanner.name, False, (Finding("", message),)))
    return results


def blocking(results: Sequence[ScanResult]) -> list[ScanResult]:
    """The results that block clearance (not ``ok``); empty means clear to go."""
    return [result for result in results if not result.ok]


def split_sensitive(failing: Sequence[ScanResult]) -> tuple[list[ScanResult], tuple[str, ...]]:
    """``failing`` without the ``sensitive-paths`` result, and the paths it found: those
    are acknowledged by name, never overridden. A finding without a path (the scanner
    crashed) leaves the result among the others, where it blocks as usual."""
    paths = [f.path for r in failing if r.name == SENSITIVE for f in r.findings]
    if not paths or not all(paths):
        return list(failing), ()
    return [r for r in failing if r.name != SENSITIVE], tuple(dict.fromkeys(paths))


def acknowledgement_problem(
    change_id: str, sensitive: Sequence[str], acknowledged: Sequence[str]
) -> str | None:
    """Why ``acknowledged`` does not cover ``sensitive`` (files that run code by themselves)
    exactly, as one line naming the paths and the flags that fix it; None when it does."""
    missing = [path for path in sensitive if path not in acknowledged]
    if missing:
        flags = " ".join(f"--ack-sensitive {shlex.quote(path)}" for path in missing[:10])
        more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
        return (
            f"it changes {len(missing)} file(s) that run code by themselves at the next "
            f"build, test or CI run: {', '.join(missing[:10])}{more} (--override-scanners "
            f"does not cover them); read them in `orchestrator staged show {change_id}`, then "
            f"pass {flags}{more}"
        )
    unknown = [path for path in acknowledged if path not in sensitive]
    if unknown:
        listed = ", ".join(sensitive) or "none"
        return (
            f"--ack-sensitive {shlex.quote(unknown[0])} names no file of it that runs code "
            f"by itself (those are: {listed}); fix the path"
        )
    return None
