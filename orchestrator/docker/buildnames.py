"""Build step containers' names: a step's container carries no labels (they would pass
into the image it is committed as), so its name says who owns it, and ``gc`` reads the
owner back from it. Standard library only: every engine listing loads it."""

from __future__ import annotations

import re
import secrets

from orchestrator import labels

__all__ = ["NAME_PREFIX", "container_name", "owner_labels"]

#: Every build step container's name starts so.
NAME_PREFIX = "orchestrator-build-"
_NAME = re.compile(rf"^{NAME_PREFIX}(\d+)-(\d+)-(\d+)-([0-9a-f]+)$")


def container_name(token: str | None = None) -> str:
    owner = labels.current_owner()
    ns = re.sub(r"\D", "", owner.pid_ns) or "0"
    return f"{NAME_PREFIX}{owner.pid}-{owner.start or 0}-{ns}-{token or secrets.token_hex(6)}"


def owner_labels(name: str) -> dict[str, str] | None:
    """The owner labels ``gc`` judges a step's container by, read from its name; None for
    a name that is not a build step's."""
    match = _NAME.match(name)
    if match is None:
        return None
    pid, start, ns, _ = match.groups()
    return {labels.MANAGED: "true", labels.OWNER_PID: pid, labels.OWNER_START: start,
            labels.OWNER_NS: f"pid:[{ns}]", labels.WORKER: "build"}  # fmt: skip
