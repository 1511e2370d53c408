"""Which local images a project's builds may name (``FROM``, ``COPY --from``). Pure.

Every image on the engine is readable by a build that names it: another project's, the
orchestrator's own proxies'. So a project says which ones its builds may use
(``build.images``: names or patterns), on top of the images the orchestrator ships
(:data:`SHIPPED`); anything else is refused in one line before any step runs. A stage of
the same Dockerfile is always allowed. The egress proxy's and the credential proxy's
images are never a build's, whatever the list says (the builder compares image ids, so
another tag of the same image is refused too).

A name is compared as Docker reads it: ``debian`` is ``debian:latest``,
``docker.io/library/debian:12`` is ``debian:12``. In a pattern ``*`` matches any
characters (``/`` too) and ``?`` one; a pattern without a tag (``debian``,
``my-org/*``) matches every tag and digest of the names it matches.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

__all__ = ["SHIPPED", "BaseImages", "normal_ref"]

#: The images the orchestrator ships (``orchestrator images build``): the Debian base it
#: bootstraps, the worker image and the agent image.
SHIPPED = ("orchestrator/base:*", "orchestrator/worker:*", "orchestrator/agent:*")
_REGISTRY_PREFIXES = ("docker.io/library/", "index.docker.io/library/", "docker.io/",
                      "index.docker.io/", "library/")  # fmt: skip


def _split(ref: str) -> tuple[str, str]:
    """``(name, tag-or-digest suffix)``: ``('debian', ':12')``, ``('x', '@sha256:…')``,
    ``('x', '')``."""
    name, at, digest = ref.partition("@")
    if at:
        return name, f"@{digest}"
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon:]
    return name, ""


def _strip_registry(name: str) -> str:
    for prefix in _REGISTRY_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def normal_ref(ref: str) -> str:
    """``ref`` as Docker reads it: lower case, no default registry, ``:latest`` when it
    names neither a tag nor a digest."""
    name, suffix = _split(ref.strip().lower())
    return _strip_registry(name) + (suffix or ":latest")


@dataclass(frozen=True)
class BaseImages:
    """The images a project's builds may name: :data:`SHIPPED` and ``listed``."""

    listed: tuple[str, ...] = ()
    declared_in: str = "the project file"

    def allows(self, ref: str) -> bool:
        wanted = normal_ref(ref)
        bare = _split(wanted)[0]
        for pattern in (*SHIPPED, *self.listed):
            name, suffix = _split(pattern.lower())
            name = _strip_registry(name)
            if fnmatch.fnmatchcase(wanted, name + suffix):
                return True
            if not suffix and fnmatch.fnmatchcase(bare, name):
                return True
        return False

    def refusal(self, ref: str) -> str:
        """Why ``ref`` is refused, and the setting that widens the list."""
        name = normal_ref(ref)
        pattern = _split(name)[0]
        return (
            f"image '{ref}' is not one this project's builds may name (the images the "
            f"orchestrator ships, {', '.join(SHIPPED)}, and build.images in "
            f"{self.declared_in}); add '{name}' or a pattern such as '{pattern}' to "
            "build.images"
        )
