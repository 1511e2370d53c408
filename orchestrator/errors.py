"""The orchestrator's exceptions. Catch :class:`OrchestratorError` to catch them all.

::

    OrchestratorError              every failure of the orchestrator itself (CLI exit 125)
    ├── ConfigError                a declaration is invalid; one line per problem
    │   └── PolicyError            a valid declaration asks for more than it may have
    ├── EngineError                the container engine failed or refused
    │   ├── EngineUnreachable      no engine answers
    │   └── ImageMissing           the image a plan names is not there
    ├── ImageBuildError            building an image failed
    ├── CredentialError            a named credential cannot be read
    └── AuditError                 the audit log cannot be read or written

Packages add their own branches: ``staging.StagingError``, ``clearance.ClearanceError``.

A worker's own failure is not an exception: it is a run result with an exit code.
Every message is written for the person at the terminal: it says what is wrong, where
(file, field or path) and how to fix it.
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base class: catch this to catch every orchestrator failure."""

    exit_code = 125


class ConfigError(OrchestratorError):
    """One or more problems in a project or worker file.

    ``problems`` holds one self-contained line per problem, each naming the file, the
    field path and the fix.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class PolicyError(ConfigError):
    """A declaration asks for access the project or a parent does not allow."""


class EngineError(OrchestratorError):
    """The container engine failed or refused a request."""


class EngineUnreachable(EngineError):
    """No container engine answers."""


class ImageMissing(EngineError):
    """The image a plan names does not exist locally."""

    def __init__(self, image: str) -> None:
        self.image = image
        super().__init__(
            f"image '{image}' is not available locally: build it with "
            "`orchestrator images build` (no registry is consulted)"
        )


class ImageBuildError(OrchestratorError):
    """Building or bootstrapping an image failed."""


class AuditError(OrchestratorError):
    """The audit log cannot be read or written; nothing unaudited is allowed to run."""


class CredentialError(OrchestratorError):
    """A named credential cannot be read; the message names it and its source, never a value."""
