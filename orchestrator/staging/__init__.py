"""Staging: untrusted output → a reviewed change set, and nothing else reaches the host.

Collect what a run produced, treating every entry as hostile; store it as an immutable,
content-addressed change set; show it to a reviewer; scan it::

    store = ChangeStore(project.sandbox_root / "changes")
    with store.scratch() as tmp:
        with collect_tar(stream, limits=limits, suffixes=zone.suffixes, tmp_dir=tmp) as found:
            meta = ChangeMeta(worker="w", trust="untrusted", target=ChangeTarget.zone("out"))
            change = create_and_audit(store, found, meta, audit)
    results = run_scanners(change, store, scanners_for(limits=limits))
    store.record_scans(change.id, results)
    print(render_diff(change, store, zone.host_path, color=True))
    store.set_status(change.id, "approved", reason="looks right", expect="pending")

Imports neither docker nor git: the runtime collects, the clearance package applies. See
``docs/staging.md`` for the rules and the guarantees.
"""

from orchestrator.staging.collected import STREAM, Collected, CollectedFile, Rejection
from orchestrator.staging.content import TextCheck, describe_type, entropy, escape, is_binary
from orchestrator.staging.diff import (
    MAX_DIFF_BYTES,
    TargetState,
    diff_files,
    read_target,
    render_diff,
)
from orchestrator.staging.errors import (
    BlobMismatch,
    ChangeNotFound,
    CollectionError,
    InvalidChangeId,
    ManifestError,
    StagingError,
    StatusConflict,
    TransitionError,
)
from orchestrator.staging.events import create_and_audit, record_change
from orchestrator.staging.manifest import (
    FINAL,
    OPEN,
    ChangeFile,
    ChangeMeta,
    ChangeSet,
    ChangeTarget,
    Finding,
    ScanResult,
    Status,
    StatusChange,
    check_id,
    check_transition,
)
from orchestrator.staging.names import normal_mode, printable, safe_path, suffix_allowed
from orchestrator.staging.scanners import (
    DEFAULT_SCANNERS,
    SENSITIVE,
    SENSITIVE_PATHS,
    ContentScanner,
    Scanner,
    SecretScanner,
    SensitivePathScanner,
    SizeScanner,
    SuffixScanner,
    blocking,
    run_scanners,
    scanners_for,
)
from orchestrator.staging.store import ChangeStore
from orchestrator.staging.tarstream import collect_tar, stream_budget
from orchestrator.staging.walk import collect_dir

__all__ = [
    "DEFAULT_SCANNERS",
    "FINAL",
    "MAX_DIFF_BYTES",
    "OPEN",
    "SENSITIVE",
    "SENSITIVE_PATHS",
    "STREAM",
    "BlobMismatch",
    "ChangeFile",
    "ChangeMeta",
    "ChangeNotFound",
    "ChangeSet",
    "ChangeStore",
    "ChangeTarget",
    "Collected",
    "CollectedFile",
    "CollectionError",
    "ContentScanner",
    "Finding",
    "InvalidChangeId",
    "ManifestError",
    "Rejection",
    "ScanResult",
    "Scanner",
    "SecretScanner",
    "SensitivePathScanner",
    "SizeScanner",
    "StagingError",
    "Status",
    "StatusChange",
    "StatusConflict",
    "SuffixScanner",
    "TargetState",
    "TextCheck",
    "TransitionError",
    "blocking",
    "check_id",
    "check_transition",
    "collect_dir",
    "collect_tar",
    "create_and_audit",
    "describe_type",
    "diff_files",
    "entropy",
    "escape",
    "is_binary",
    "normal_mode",
    "printable",
    "read_target",
    "record_change",
    "render_diff",
    "run_scanners",
    "safe_path",
    "scanners_for",
    "stream_budget",
    "suffix_allowed",
]
