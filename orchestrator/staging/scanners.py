"""Scanners: small checks run over a change set before it may be cleared.

A scanner has a ``name`` and ``scan(change, store) -> ScanResult``; a result that is not
``ok`` blocks clearance unless a person overrides it (:func:`blocking` lists those). A
scanner that crashes counts as failed, never as passed. Findings name the file and what
was seen, never the secret itself, since they are stored in the manifest and the log.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from orchestrator.config.models import OutboxLimits
from orchestrator.staging.blobs import CHUNK
from orchestrator.staging.content import SAMPLE_BYTES, describe_type, entropy, is_binary
from orchestrator.staging.manifest import ChangeFile, ChangeSet, Finding, ScanResult
from orchestrator.staging.names import suffix_allowed
from orchestrator.staging.store import ChangeStore

__all__ = [
    "DANGEROUS_SUFFIXES",
    "DEFAULT_SCANNERS",
    "SECRET_PATTERNS",
    "ContentScanner",
    "Scanner",
    "SecretScanner",
    "SensitivePathScanner",
    "SizeScanner",
    "SuffixScanner",
    "blocking",
    "run_scanners",
    "scanners_for",
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


def _binary_after(
    store: ChangeStore, change: ChangeSet, item: ChangeFile, start: int
) -> int | None:
    """The offset of the first NUL byte after ``start`` (binary hidden behind text)."""
    assert item.sha256 is not None
    with store.open_blob(change.id, item.sha256) as blob:
        blob.seek(start)
        offset = start
        while chunk := blob.read(1 << 20):
            found = chunk.find(b"\0")
            if found >= 0:
                return offset + found
            offset += len(chunk)
    return None


def _head(store: ChangeStore, change: ChangeSet, item: ChangeFile, size: int) -> bytes:
    assert item.sha256 is not None
    with store.open_blob(change.id, item.sha256) as blob:
        return blob.read(size)


@dataclass(frozen=True)
class SizeScanner:
    """Files over a per-file cap, and a change set over a total cap."""

    max_file_size: int = OutboxLimits().max_file_size
    max_total: int = OutboxLimits().size
    name: str = "size"

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = [
            Finding(f.path, f"{f.size} bytes, over the per-file cap of {self.max_file_size}")
            for f in change.files
            if f.size > self.max_file_size
        ]
        total = sum(f.size for f in change.files)
        if total > self.max_total:
            findings.append(Finding("", f"{total} bytes in all, over the cap of {self.max_total}"))
        return _result(self.name, findings)


@dataclass(frozen=True)
class ContentScanner:
    """Binary files (named by type) and high-entropy text (encoded or encrypted data)."""

    text_entropy: float = 5.8
    """Bits per byte above which text of at least ``min_sample`` bytes is flagged."""
    min_sample: int = 1024
    name: str = "binary"

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = []
        for item in _contents(change):
            head = _head(store, change, item, SAMPLE_BYTES)
            if is_binary(head):
                findings.append(Finding(item.path, f"binary content: {describe_type(head)}"))
            elif (offset := _binary_after(store, change, item, len(head))) is not None:
                # Text up front hides nothing from this check: the whole file is read.
                findings.append(Finding(item.path, f"binary content from byte {offset}"))
            elif len(head) >= self.min_sample and (bits := entropy(head)) > self.text_entropy:
                findings.append(
                    Finding(item.path, f"high-entropy text ({bits:.2f} bits/byte): encoded data?")
                )
        return _result(self.name, findings)


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


#: Paths that make tools run code: CI definitions, editor tasks, git attributes, hooks.
_SENSITIVE = re.compile(
    r"(?i)(?:^|/)(?:\.gitmodules|\.gitattributes|\.gitignore|\.lfsconfig|\.envrc"
    r"|\.pre-commit-config\.ya?ml|\.devcontainer\.json|\.yarnrc(?:\.yml)?|\.npmrc"
    r"|\.mise\.toml|\.tool-versions)$"
    r"|(?:^|/)(?:\.githooks|hooks|\.husky)/"
    r"|^(?:\.github|\.gitlab|\.gitea|\.forgejo|\.circleci|\.buildkite|\.vscode|\.idea"
    r"|\.devcontainer)/"
    r"|^(?:\.gitlab-ci\.ya?ml|\.travis\.ya?ml|\.woodpecker(?:\.ya?ml|/.*)|Jenkinsfile"
    r"|azure-pipelines\.ya?ml)$"
)


@dataclass(frozen=True)
class SensitivePathScanner:
    """New or changed files that CI, editors or git act on by themselves."""

    name: str = "sensitive-paths"
    pattern: re.Pattern[str] = field(default=_SENSITIVE)

    def scan(self, change: ChangeSet, store: ChangeStore) -> ScanResult:
        findings = [
            Finding(f.path, "CI, editor, hook or git configuration: it can run code by itself")
            for f in _contents(change)
            if self.pattern.search(f.path)
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
    *, limits: OutboxLimits | None = None, suffixes: Sequence[str] | None = None
) -> tuple[Scanner, ...]:
    """The default scanners with a target's own caps and suffix allowlist."""
    limits = limits or OutboxLimits()
    return (
        SizeScanner(limits.max_file_size, limits.size),
        ContentScanner(),
        SuffixScanner(tuple(suffixes) if suffixes is not None else None),
        SecretScanner(),
        SensitivePathScanner(),
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
