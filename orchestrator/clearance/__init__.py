"""Clearance: the manual, host-only step that brings a reviewed change set into the user's
git repository, and optionally pushes it. The only package that imports git (GitPython).

::

    from orchestrator.clearance import clear, resolve

    credential = resolve("github", project.config.credentials["github"], audit=log)
    result = clear(store, "3f9c...", project.repo, push=True, credential=credential,
                   confirm=lambda summary: ask(summary.render()), audit=log)
    print(result.commit)

Git never runs a hook or an fsmonitor here, files are written without following symlinks,
and a run killed at any point can be re-run safely. See docs/clearance.md.
"""

from orchestrator.clearance.clearing import clear
from orchestrator.clearance.errors import (
    ClearanceDeclined,
    ClearanceError,
    CredentialError,
    PushFailed,
)
from orchestrator.clearance.gitrepo import SAFE_CONFIG
from orchestrator.clearance.push import can_push
from orchestrator.clearance.store import ChangeSet, ChangeStore, Scanners
from orchestrator.clearance.summary import ClearResult, Summary, SummaryFile
from orchestrator.credentials import Credential, resolve

__all__ = [
    "SAFE_CONFIG",
    "ChangeSet",
    "ChangeStore",
    "ClearResult",
    "ClearanceDeclined",
    "ClearanceError",
    "Credential",
    "CredentialError",
    "PushFailed",
    "Scanners",
    "Summary",
    "SummaryFile",
    "can_push",
    "clear",
    "resolve",
]
