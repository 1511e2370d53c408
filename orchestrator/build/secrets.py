"""Build secrets: ``RUN --mount=type=secret,id=NAME`` for the names a project declares.

A project lists under ``build.secrets`` the credentials (``credentials:``) a Dockerfile may
mount. A step asking for another name is refused before the build starts. A declared
value is read on the host when the first step that mounts it runs (never for a cached
step), registered with the audit log's redaction, and written to a file of its own in a
folder on the host's ``/dev/shm`` (in memory, never on disk; the folder 0700, the
orchestrator's) with the mount's mode (0400) and owner; that one file is bind-mounted
read-only at the target for that one step's container and removed with it. The step's
output shown and kept is redacted; the cache key holds a digest of the name only; the
audit log records the name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator import labels
from orchestrator.build.dockerfile import SecretMount
from orchestrator.errors import OrchestratorError

__all__ = ["SHM", "BuildSecrets", "Delivered", "delivered", "key_part"]

#: Where secret files are written (a tmpfs): the folders carry the owner in their name,
#: so ``orchestrator gc`` sweeps what a killed build left.
SHM = Path("/dev/shm")
#: The file's name in its folder (the secret's own name never reaches the host's paths).
FILE = "value"


class BuildSecrets:
    """The secrets a project declares for builds, each read once, when first needed."""

    def __init__(self, readers: Mapping[str, Callable[[], str]], declared_in: str) -> None:
        self._readers = dict(readers)
        self._values: dict[str, str] = {}
        self.declared_in = declared_in
        """Where they are declared (the project file), for a refusal's fix."""

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._readers)

    def value(self, name: str) -> str:
        """The value of ``name``, read from its source on first use (raises the
        credential's one-line error when it cannot be read)."""
        if name not in self._values:
            self._values[name] = self._readers[name]()
        return self._values[name]

    def read(self) -> list[str]:
        """Every value read so far (what a step's output is redacted of)."""
        return list(self._values.values())

    def __repr__(self) -> str:
        return f"BuildSecrets(names={sorted(self._readers)!r})"


def key_part(mount: SecretMount, target: str) -> str:
    """What a secret mount puts in its step's cache key: a digest of the name, the
    target, owner and mode; never the value."""
    digest = hashlib.sha256(mount.id.encode()).hexdigest()
    return f"secret:{digest}:{target}:{mount.uid}:{mount.gid}:{mount.mode:o}"


@dataclass(frozen=True)
class Delivered:
    """A secret file on the host and where a step sees it."""

    source: str
    target: str


@contextlib.contextmanager
def delivered(
    build_id: str, files: list[tuple[SecretMount, str, str]], root: Path = SHM
) -> Iterator[list[Delivered]]:
    """Each ``(mount, target, value)`` as a file of the mount's mode and owner, in a new
    folder of its own under ``root`` (a tmpfs, checked: never on disk), for the body;
    removed after it. The folder stays the orchestrator's (mode 0700: the engine reads the
    file as root), so nobody else can swap the file; the file is made with ``O_EXCL |
    O_NOFOLLOW`` and given its owner and mode through its own descriptor."""
    from orchestrator.policy.grant import SECRETS_PREFIX
    from orchestrator.runtime.secrets import is_tmpfs

    if files and not is_tmpfs(root):
        raise OrchestratorError(
            f"{root} is not an in-memory filesystem; build secrets are only ever delivered "
            "from memory (mount a tmpfs there)"
        )
    owner = labels.current_owner()
    made: list[Path] = []
    out: list[Delivered] = []
    try:
        for index, (mount, target, value) in enumerate(files):
            folder = root / f"{SECRETS_PREFIX}{owner.pid}-{owner.start}-build-{build_id}-{index}"
            folder.mkdir(mode=0o700)  # fails when anyone made it first
            made.append(folder)
            fd = os.open(folder / FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o400)  # fmt: skip
            try:
                os.write(fd, value.encode())
                if os.getuid() == 0:
                    os.fchown(fd, mount.uid, mount.gid)
                os.fchmod(fd, mount.mode)
            finally:
                os.close(fd)
            out.append(Delivered(str(folder / FILE), target))
        yield out
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
