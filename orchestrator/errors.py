"""The orchestrator's exceptions. Catch :class:`OrchestratorError` to catch them all.

::

    OrchestratorError              every failure of the orchestrator itself (CLI exit 125)
    ├── ConfigError                a declaration is invalid; one line per problem
    │   └── PolicyError            a valid declaration asks for more than it may have
    ├── EngineError                the container engine failed or refused
    │   ├── EngineUnreachable      no engine answers
    │   ├── ContainerStopped       a run's container stopped under it (no exec can start)
    │   ├── StartFailure           the worker's command cannot run (not found, not runnable)
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

from orchestrator.exits import Exit


class OrchestratorError(Exception):
    """Base class: catch this to catch every orchestrator failure."""

    exit_code: int = Exit.ERROR


class ConfigError(OrchestratorError):
    """One or more problems in a project or worker file.

    ``problems`` holds one self-contained line per problem, each naming the file, the
    field path and the fix.
    """

    def __init__(self, problems: list[str], *, partial: object | None = None) -> None:
        self.problems = list(problems)
        self.partial = partial
        """For a worker file with invalid fields: the same file with those fields left out
        (when that still validates), so that checks further on can report their problems
        too instead of hiding them until these are fixed."""
        super().__init__("\n".join(self.problems))


class PolicyError(ConfigError):
    """A declaration asks for access the project or a parent does not allow."""


class EngineError(OrchestratorError):
    """The container engine failed or refused a request."""


class EngineUnreachable(EngineError):
    """No container engine answers."""


class ContainerStopped(EngineError):
    """A run's container is no longer running, so no command can start in it (e.g. a gVisor
    sandbox killed as a whole at its memory limit)."""


class StartFailure(EngineError):
    """The engine could not start a command at all: it is not there (``code`` 127) or
    cannot be run (126), the codes a shell gives. The engine adapter reads its own engine's
    words for it; the runtime sees only this. A worker's own failure, not the
    orchestrator's: a run ends with status ``error`` and ``code`` as its exit code."""

    def __init__(self, message: str, *, code: int) -> None:
        self.code = code
        super().__init__(message)


#: The images ``orchestrator images build`` makes (repository names), and the option
#: that asks for one it does not make by default.
OWN_IMAGES = {
    "orchestrator/worker": "",
    "orchestrator/proxy": "",
    "orchestrator/credproxy": "",
    "orchestrator/orchestrator": " --with-orchestrator",
}


class ImageMissing(EngineError):
    """The image a plan names does not exist locally."""

    def __init__(self, image: str) -> None:
        self.image = image
        super().__init__(f"image '{image}' is not on this machine: {image_fix(image)}")


def image_fix(image: str) -> str:
    """How to get ``image`` here: the command that builds the orchestrator's own images,
    else the ways to build or load any other (nothing is ever pulled)."""
    repository = image.rsplit(":", 1)[0] if "/" not in image.rsplit(":", 1)[-1] else image
    if repository in OWN_IMAGES:
        return (
            f"build it with `orchestrator images build{OWN_IMAGES[repository]}` "
            "(no registry is consulted)"
        )
    return (
        f"build it here from its Dockerfile (`orchestrator build DIR -t {image}`, each step "
        f"a hardened run, or `docker build -t {image} DIR`) or `docker load` it; no "
        "registry is consulted"
    )


class ImageBuildError(OrchestratorError):
    """Building or bootstrapping an image failed."""


class AuditError(OrchestratorError):
    """The audit log cannot be read or written; nothing unaudited is allowed to run."""


class CredentialError(OrchestratorError):
    """A named credential cannot be read; the message names it and its source, never a value."""
