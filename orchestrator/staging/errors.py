"""Errors of the staging package. Each message is one line naming the change set or path.

::

    StagingError                 every staging failure (an OrchestratorError: CLI exit 125)
    ├── CollectionError          an outbox or tar stream cannot be collected at all
    ├── InvalidChangeId          an id that is not one (a typo, a path, '../x')
    ├── ChangeNotFound           no change set has that id
    ├── ManifestError            a manifest is damaged or was edited by hand
    ├── TransitionError          a status change the state machine forbids
    │   └── StatusConflict       compare-and-set lost: the status is not the expected one
    └── BlobMismatch             a blob's content no longer matches the manifest

Rejected entries of an outbox are not errors: they are :class:`Rejection`\\ s recorded in
the change set, so that one hostile entry never hides the rest of a run's output.
"""

from __future__ import annotations

from orchestrator.errors import OrchestratorError

__all__ = [
    "BlobMismatch",
    "ChangeNotFound",
    "CollectionError",
    "InvalidChangeId",
    "ManifestError",
    "StagingError",
    "StatusConflict",
    "TransitionError",
]


class StagingError(OrchestratorError):
    """Base class of every staging failure."""


class CollectionError(StagingError):
    """The outbox cannot be collected at all (missing, not a folder, host disk failing)."""


class InvalidChangeId(StagingError):
    """A change set id that is malformed: ids are hex digits, never paths."""

    def __init__(self, value: str, detail: str = "") -> None:
        self.value = value
        shown = value.encode("unicode_escape", "backslashreplace").decode("ascii")[:80]
        super().__init__(
            f"'{shown}' is not a change set id{detail}; ids are 12 hex digits as shown by "
            "`orchestrator staged list` (a unique prefix of 4 or more also works)"
        )


class ChangeNotFound(StagingError):
    """No change set has the id asked for."""

    def __init__(self, change_id: str, root: object) -> None:
        self.change_id = change_id
        super().__init__(
            f"change set {change_id} does not exist in {root}; "
            "see `orchestrator staged list` for the ids there"
        )


class ManifestError(StagingError):
    """A manifest cannot be read or does not have the expected shape."""


class TransitionError(StagingError):
    """A status change that the change-set state machine does not allow."""


class StatusConflict(TransitionError):
    """A compare-and-set status change found another status than the one expected."""


class BlobMismatch(StagingError):
    """A stored blob is missing or its content differs from what the manifest records."""
