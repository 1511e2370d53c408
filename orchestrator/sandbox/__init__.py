"""The host-side file API over a sandbox's virtual paths (``/input/a.pdf``, ``/session/x``).

::

    with SandboxFiles(prepared.grant, owner=(prepared.uid, prepared.gid), audit=log,
                      session_id=prepared.session_id) as files:
        files.list("/")                      # the granted zones, as folders
        page = files.read("/input/notes.txt", offset=1, limit=200)
        files.write("/session/draft.md", "# Draft\\n")
        files.security_context()             # trust, zones, approvals, network, limits

The worker may be changing the same folders meanwhile: paths are resolved from each zone's
root descriptor, one component at a time, never following a link (see ``nofollow``).
Refusals raise :class:`~orchestrator.errors.PolicyError` (the grant does not allow it) or
:class:`SandboxError` (what is on disk cannot be used), each naming what is allowed instead.
"""

from orchestrator.sandbox.content import ReadCaps
from orchestrator.sandbox.errors import SandboxError, SandboxNotFound
from orchestrator.sandbox.files import OutboxWriter, SandboxFiles
from orchestrator.sandbox.results import (
    BinaryContent,
    DeleteResult,
    Entry,
    FileStat,
    ImageContent,
    Listing,
    ReadResult,
    Resolved,
    TextContent,
    WriteResult,
    as_dict,
)

__all__ = [
    "BinaryContent",
    "DeleteResult",
    "Entry",
    "FileStat",
    "ImageContent",
    "Listing",
    "OutboxWriter",
    "ReadCaps",
    "ReadResult",
    "Resolved",
    "SandboxError",
    "SandboxFiles",
    "SandboxNotFound",
    "TextContent",
    "WriteResult",
    "as_dict",
]
