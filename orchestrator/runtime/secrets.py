"""Secrets for trusted-enough workers: files on an in-memory mount, redacted everywhere.

Values are written to a private folder on the host's ``/dev/shm`` (a tmpfs: never on disk),
readable only by the worker's uid, mounted read-only at ``/run/secrets``, and removed when
the run ends. They are never placed in the environment. Anything the orchestrator captures
or logs passes through :class:`StreamRedactor` first.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from orchestrator import labels
from orchestrator.audit.redact import MIN_SECRET_LENGTH
from orchestrator.audit.redact import REDACTED as AUDIT_REDACTED
from orchestrator.errors import OrchestratorError
from orchestrator.policy.grant import SECRETS_PREFIX
from orchestrator.runtime.engine import Stream

REDACTED = AUDIT_REDACTED.encode()


def is_tmpfs(folder: Path) -> bool:
    """Whether ``folder`` lies on an in-memory file system (tmpfs)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    best, fs_type = "", ""
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and str(folder).startswith(fields[1]) and len(fields[1]) >= len(best):
            best, fs_type = fields[1], fields[2]
    return fs_type == "tmpfs"


@contextmanager
def delivered(folder: Path, values: Mapping[str, str], uid: int, gid: int) -> Iterator[Path | None]:
    """Write ``values`` as files in ``folder`` (in memory) for the run; remove them after."""
    if not values:
        yield None
        return
    if not is_tmpfs(folder.parent):
        raise OrchestratorError(
            f"{folder.parent} is not an in-memory filesystem; secrets are only ever delivered "
            "from memory (mount a tmpfs there)"
        )
    folder.mkdir(mode=0o700)
    try:
        for name, value in values.items():
            path = folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "w") as handle:
                handle.write(value)
            if os.getuid() == 0:
                os.chown(path, uid, gid)
        if os.getuid() == 0:
            os.chown(folder, uid, gid)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class StreamRedactor:
    """Replaces secret values in a byte stream, also across chunk boundaries."""

    def __init__(self, values: Mapping[str, str] | list[str]) -> None:
        secrets = values.values() if isinstance(values, Mapping) else values
        self.secrets = sorted(
            {v.encode() for v in secrets if len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True
        )
        self.keep = max((len(s) for s in self.secrets), default=1) - 1
        self.pending = b""

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def scrub(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, REDACTED)
        return data

    def feed(self, chunk: bytes) -> bytes:
        """Return what can be shown now; hold back a tail that may start a secret."""
        data = self.scrub(self.pending + chunk)
        if self.keep <= 0:
            self.pending = b""
            return data
        self.pending = data[-self.keep :]
        return data[: -self.keep]

    def flush(self) -> bytes:
        data, self.pending = self.scrub(self.pending), b""
        return data

    def text(self, text: str) -> str:
        return self.scrub(text.encode()).decode(errors="replace")

    def tail(self, data: bytes | bytearray, *, truncated: bool) -> str:
        """A captured tail, redacted. When it was cut, its first bytes may be the end of a
        secret whose start fell off; those are dropped."""
        if self.secrets and truncated:
            data = data[self.keep :]
        return self.scrub(bytes(data)).decode("utf-8", errors="replace")


class RedactingSink:
    """An output sink that redacts secrets, per stream, before passing output on."""

    def __init__(self, sink: Callable[[Stream, bytes], None], values: Mapping[str, str]) -> None:
        self.sink = sink
        self.redactors: dict[Stream, StreamRedactor] = {
            "stdout": StreamRedactor(values),
            "stderr": StreamRedactor(values),
        }

    def __call__(self, stream: Stream, chunk: bytes) -> None:
        shown = self.redactors[stream].feed(chunk)
        if shown:
            self.sink(stream, shown)

    def flush(self) -> None:
        for stream, redactor in self.redactors.items():
            rest = redactor.flush()
            if rest:
                self.sink(stream, rest)


def folder_owner(name: str) -> dict[str, str]:
    """The owner labels a run's secrets folder's name (or a name starting with it) gives:
    the process that made it, in this pid namespace (:data:`SECRETS_PREFIX`, pid, start)."""
    pid, _, rest = name.removeprefix(SECRETS_PREFIX).partition("-")
    start = rest.partition("-")[0]
    ns = labels.current_owner().pid_ns
    return {labels.OWNER_PID: pid, labels.OWNER_START: start, labels.OWNER_NS: ns}


def sweep_orphaned(root: Path = Path("/dev/shm")) -> list[str]:
    """Remove secret folders whose run's orchestrator is gone (killed before cleaning up)."""
    removed = []
    for folder in root.glob(f"{SECRETS_PREFIX}*"):
        if labels.owner_state(folder_owner(folder.name)) == "gone":
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed
