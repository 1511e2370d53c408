"""The project's build cache key: the cache is the project's own.

The engine's images are shared by every project on the machine, and a cached step is
reused on its key alone. A key made of what the step *is* (its command, its parent, the
files it reads) would let project B reuse a step project A built with A's secret value
or A's wider allowlist. So every step's key is an HMAC-SHA256 under a key of the
project's own: 32 random bytes, ``build-cache.key`` in its checked sandbox root (made on
first use, mode 0600, never through a link; see
:mod:`orchestrator.runtime.state_root`). Another project has another key and never
computes, so never finds, a key this project's builds committed; a Dockerfile cannot set
the label the key is kept in (``LABEL io.orchestrator.*`` is refused). Removing the file
(or the sandbox root) starts the project's cache afresh.
"""

from __future__ import annotations

import os

from orchestrator.config import Project
from orchestrator.runtime.state_key import key_in
from orchestrator.runtime.state_root import open_state_root

__all__ = ["CACHE_KEY_FILE", "project_cache_key"]

CACHE_KEY_FILE = "build-cache.key"


def project_cache_key(project: Project) -> bytes:
    """The project's cache key, made on first use in its sandbox root."""
    folder = open_state_root(project)
    try:
        path = project.sandbox_root / CACHE_KEY_FILE
        return key_in(folder, CACHE_KEY_FILE, path, "the build cache key")
    finally:
        os.close(folder)
