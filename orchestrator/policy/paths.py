"""Host-side questions about virtual paths (``/zone/...``) under a grant.

Tools that act for a worker on the host ask here before touching anything: ``..`` and
symlink escapes are refused, masked paths are invisible, suffix allowlists and per-file size
caps from the zone's config are enforced, and every refusal says what *is* allowed:
"Cannot write '/input/x': /input is read-only. Writable: /output, /session".
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from orchestrator.errors import PolicyError
from orchestrator.policy.grant import Grant, ZoneGrant


class ZoneView:
    """Read and write checks over one grant's mounts, in the container's own path names."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        # Longest target first, so /repo/.git wins over /repo.
        self._mounts = sorted(grant.zones, key=lambda z: len(z.target), reverse=True)

    def _deny(self, verb: str, path: str, reason: str) -> PolicyError:
        return PolicyError([f"Cannot {verb} '{path}': {reason}"])

    def _writable_list(self) -> str:
        names = sorted({z.target for z in self.grant.zones if not z.read_only})
        return ", ".join(names) or "nothing"

    def _readable_list(self) -> str:  # the outbox is write-only
        names = sorted({z.target for z in self.grant.zones if not z.outbox})
        return ", ".join(names) or "nothing"

    def writable(self) -> str:
        """The writable zones, for messages: "/output, /session" (or "nothing")."""
        return self._writable_list()

    def readable(self) -> str:
        """The readable zones, for messages: "/input, /session" (or "nothing")."""
        return self._readable_list()

    def locate(self, verb: str, path: str) -> tuple[ZoneGrant, str]:
        """The zone holding ``path`` and the clean path inside it (``a/b``; ``""`` for the
        zone's root). Refuses relative paths, ``..``, NUL and masked or ungranted paths; the
        outbox is returned like any zone (callers decide what it allows)."""
        if not path.startswith("/"):
            raise self._deny(verb, path, "use an absolute path such as /zone/file")
        if ".." in path.split("/"):
            raise self._deny(verb, path, "'..' is not allowed in paths")
        if "\0" in path:
            raise self._deny(verb, path, "a NUL character is not allowed in paths")
        clean = posixpath.normpath(path)
        for mask in self.grant.masks:
            if clean == mask or clean.startswith(mask + "/"):
                raise self._deny(verb, path, f"{mask} is hidden from workers")
        for zone in self._mounts:
            if clean == zone.target or clean.startswith(zone.target + "/"):
                return zone, clean[len(zone.target) :].lstrip("/")
        raise self._deny(
            verb,
            path,
            f"outside the sandbox: it is in no granted zone. Readable: {self._readable_list()}",
        )

    def _locate(self, verb: str, path: str) -> tuple[ZoneGrant, Path]:
        zone, relative = self.locate(verb, path)
        if zone.outbox:
            raise self._deny(verb, path, f"{zone.target} is the run's write-only outbox")
        return zone, zone.host_path / relative

    def resolve(self, path: str, *, verb: str = "read") -> Path:
        """The host path behind a virtual path, refusing anything that escapes its zone."""
        zone, host = self._locate(verb, path)
        root = Path(os.path.realpath(zone.host_path))
        real = Path(os.path.realpath(host))
        if real != root and not real.is_relative_to(root):
            raise self._deny(verb, path, f"it leads outside {zone.target} through a symlink")
        return real

    def check_read(self, path: str) -> Path:
        return self.resolve(path)

    def check_write(self, path: str, size: int | None = None) -> Path:
        """The host path to write ``path`` at, or a PolicyError naming what is writable."""
        self.write_zone(path, size)
        return self.resolve(path, verb="write")

    def write_zone(self, path: str, size: int | None = None) -> ZoneGrant:
        """The zone ``path`` would be written in, after the mode, suffix and size checks
        (no file-system access: callers that open files check links themselves)."""
        zone, _ = self._locate("write", path)
        if zone.read_only:
            raise self._deny(
                "write", path, f"{zone.target} is read-only. Writable: {self._writable_list()}"
            )
        if zone.suffixes is not None and not path.endswith(tuple(zone.suffixes)):
            raise self._deny(
                "write", path, f"{zone.target} accepts only {', '.join(zone.suffixes)} files"
            )
        if size is not None and zone.max_file_size is not None and size > zone.max_file_size:
            raise self._deny(
                "write",
                path,
                f"{size} bytes exceeds {zone.target}'s per-file cap of {zone.max_file_size}",
            )
        return zone

    def can_read(self, path: str) -> bool:
        try:
            self.check_read(path)
        except PolicyError:
            return False
        return True

    def can_write(self, path: str, size: int | None = None) -> bool:
        try:
            self.check_write(path, size)
        except PolicyError:
            return False
        return True
