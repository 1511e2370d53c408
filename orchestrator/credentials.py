"""Named credentials for ``git push``: read when needed, kept in memory, never shown.

``resolve(name, config)`` reads the value from an environment variable, a file (its first
line) or a command (the first line of its output, with a timeout). The value lives only in
a :class:`Credential`, whose ``repr``/``str`` never show it and which refuses to be pickled,
and is registered with the audit log's redaction before anything is logged.

Modes: ``inherit`` reads nothing (git uses the host's SSH agent and credential helpers as
configured); ``explicit`` hands the value to the one push process only (see :mod:`.push`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from orchestrator.audit.redact import MIN_SECRET_LENGTH
from orchestrator.config.models import CredentialConfig
from orchestrator.errors import CredentialError
from orchestrator.hostfs.paths import PathRefused, open_path

if TYPE_CHECKING:
    from orchestrator.audit import AuditLog

__all__ = ["COMMAND_TIMEOUT", "Credential", "resolve"]

#: Seconds a credential command may take.
COMMAND_TIMEOUT = 30.0
_MAX_FILE = 64 << 10


class Credential:
    """A resolved credential. The value is reachable only through :meth:`reveal`."""

    __slots__ = ("_value", "mode", "name", "username")

    def __init__(self, name: str, *, mode: str, username: str, value: str | None) -> None:
        self.name = name
        self.mode = mode
        self.username = username
        self._value = value

    @property
    def explicit(self) -> bool:
        """True when the push must use this value and nothing else."""
        return self.mode == "explicit"

    def reveal(self) -> str:
        """The secret value (explicit credentials only)."""
        if self._value is None:
            raise CredentialError(f"credential '{self.name}' is 'inherit': it holds no value")
        return self._value

    def __repr__(self) -> str:
        return f"Credential(name={self.name!r}, mode={self.mode!r}, value=<hidden>)"

    def __str__(self) -> str:
        return f"credential '{self.name}' ({self.mode})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Credential is never pickled: its value stays in this process")


def resolve(
    name: str,
    config: CredentialConfig,
    *,
    audit: AuditLog | None = None,
    base: Path | None = None,
    timeout: float = COMMAND_TIMEOUT,
) -> Credential:
    """Read credential ``name`` as ``config`` says; relative file paths start at ``base``."""
    if config.mode == "inherit":
        return Credential(name, mode="inherit", username=config.username, value=None)
    if config.source == "env":
        value = _from_env(name, config.env or "")
    elif config.source == "file":
        value = _from_file(name, Path(config.path or "").expanduser(), base)
    else:
        value = _from_command(name, config.command or [], base, timeout)
    if len(value) < MIN_SECRET_LENGTH:
        raise CredentialError(
            f"credential '{name}': the value is empty or shorter than {MIN_SECRET_LENGTH} "
            "characters, too short to be kept out of logs; check its source"
        )
    if audit is not None:
        audit.add_secret(value)
    return Credential(name, mode="explicit", username=config.username, value=value)


def _first_line(text: str) -> str:
    lines = text.splitlines()
    return lines[0].strip() if lines else ""


def _from_env(name: str, variable: str) -> str:
    value = os.environ.get(variable)
    if value is None:
        raise CredentialError(
            f"credential '{name}': environment variable {variable} is not set; "
            "export it before running the command"
        )
    return _first_line(value)


def _from_file(name: str, path: Path, base: Path | None) -> str:
    if not path.is_absolute() and base is not None:
        path = base / path
    try:
        # Never through a link: the file may sit in a folder a worker can rename and
        # replace with a link to any file root can read.
        held = open_path(Path(os.path.normpath(path)), file_ok=True)
        try:
            with open(f"/proc/self/fd/{held}", "rb") as handle:
                raw = handle.read(_MAX_FILE)
        finally:
            os.close(held)
    except PathRefused as refused:
        if refused.missing:
            raise CredentialError(
                f"credential '{name}': cannot read {path}: {refused.component} does not "
                "exist; fix 'path' in the project's credentials"
            ) from None
        raise CredentialError(
            f"credential '{name}': cannot read {path}: {refused.reason}; name the real path "
            "in the project's credentials (a link there could have been planted)"
        ) from None
    except OSError as exc:
        raise CredentialError(
            f"credential '{name}': cannot read {path}: {exc.strerror}; "
            "fix 'path' in the project's credentials"
        ) from None
    try:
        return _first_line(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CredentialError(f"credential '{name}': {path} is not UTF-8 text") from None


def _from_command(name: str, command: list[str], base: Path | None, timeout: float) -> str:
    program = command[0] if command else "(none)"
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            cwd=base,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CredentialError(
            f"credential '{name}': {program} did not finish within {timeout:g} s"
        ) from None
    except OSError as exc:
        raise CredentialError(
            f"credential '{name}': cannot run {program}: {exc.strerror}; "
            "fix 'command' in the project's credentials"
        ) from None
    if done.returncode != 0:
        # Its output is never shown: it may hold part of the secret.
        raise CredentialError(
            f"credential '{name}': {program} exited with code {done.returncode}; "
            "run it by hand to see why"
        )
    try:
        return _first_line(done.stdout.decode("utf-8"))
    except UnicodeDecodeError:
        raise CredentialError(f"credential '{name}': {program} printed no UTF-8 text") from None
