"""What the sandbox file API raises besides :class:`~orchestrator.errors.PolicyError`.

::

    OrchestratorError
    ├── PolicyError            the grant does not allow it (zone, mode, suffix, size, mask)
    └── SandboxError           the file system refuses it: a link, FIFO, socket or device on
        │                      the way, a folder where a file is needed, an I/O failure
        └── SandboxNotFound    nothing exists at the path (also a FileNotFoundError)

Every message starts "Cannot <verb> '<path>':" and says what to do instead, for a person or
an LLM reading it.
"""

from __future__ import annotations

from orchestrator.errors import OrchestratorError


class SandboxError(OrchestratorError):
    """A sandbox path cannot be used as asked; the message names the path and the way out."""


class SandboxNotFound(SandboxError, FileNotFoundError):
    """Nothing exists at the path (or at a folder on the way to it)."""
