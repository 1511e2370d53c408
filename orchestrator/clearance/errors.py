"""Clearance failures: every one names the change set, the path or the remote, and the fix.

::

    ClearanceError          clearance refused or failed; nothing half-done is left behind
    ├── ClearanceDeclined   the person at the prompt said no (CLI exit 1)
    └── PushFailed          committed locally (safe), but the push did not go through

(``CredentialError``, for an unreadable credential, is the top-level one in
:mod:`orchestrator.errors`: credentials also serve worker secrets.)

They are :class:`~orchestrator.errors.OrchestratorError`\\ s, so the main command turns
them into one line and exit code 125 (1 for a declined prompt).
"""

from __future__ import annotations

from orchestrator.errors import CredentialError, OrchestratorError

__all__ = ["ClearanceDeclined", "ClearanceError", "CredentialError", "PushFailed"]


class ClearanceError(OrchestratorError):
    """A change set cannot be cleared into the repository (or pushed from it)."""

    def __init__(self, message: str, *, change_id: str | None = None) -> None:
        self.change_id = change_id
        super().__init__(message)


class ClearanceDeclined(ClearanceError):
    """Confirmation was refused: nothing was cleared or pushed."""

    exit_code = 1


class PushFailed(ClearanceError):
    """The commit exists locally and the change set is marked committed; the push failed.

    Retrying is safe: ``orchestrator clear ID --push`` finds the commit by its
    ``Staged-Id`` trailer and only pushes.
    """

    def __init__(self, message: str, *, change_id: str, commit: str, remote: str) -> None:
        self.commit = commit
        self.remote = remote
        super().__init__(message, change_id=change_id)
