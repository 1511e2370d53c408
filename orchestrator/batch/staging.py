"""Every input's outbox, collected by the same hostile-safe rules, into ONE change set.

:class:`BatchStaging` is the outbox reader a batch's runs get: each run's tar stream is
parsed by :func:`orchestrator.staging.collect_tar` exactly as a single run's would be (names,
links, sizes, counts), and what survives is kept in the batch folder's ``blobs/`` (content
addressed) instead of becoming a change set of its own; the list of files goes into that
input's line of ``results.jsonl``. :func:`make_change_set` then makes one pending change set
of the whole batch: each input's files under ``<input key>/``, and ``BATCH-MANIFEST.json``
saying which input (path, sha256, run, status) each key stands for. It is reviewed
(``orchestrator staged show``) and cleared like any other change set.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.audit import AuditLog
from orchestrator.plan import ContainerSpec
from orchestrator.prepare import Prepared
from orchestrator.runtime.outbox import StagingReader
from orchestrator.staging import (
    ChangeMeta,
    ChangeTarget,
    Collected,
    CollectedFile,
    Rejection,
    collect_dir,
    collect_tar,
    create_and_audit,
)

__all__ = ["MANIFEST_NAME", "BatchOutbox", "BatchStaging", "make_change_set"]

MANIFEST_NAME = "BATCH-MANIFEST.json"


@dataclass(frozen=True)
class BatchOutbox:
    """What one input's outbox held: files (path, sha256, size, mode) and refusals."""

    files: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"files": self.files, "rejected": self.rejected}


class BatchStaging:
    """The :class:`~orchestrator.runtime.run.Staging` of a batch's runs (thread-safe)."""

    def __init__(self, reader: StagingReader, blobs: Path) -> None:
        self.reader = reader
        self.blobs = blobs

    def outbox(
        self, spec: ContainerSpec, stream: IO[bytes], *, message: str | None = None
    ) -> BatchOutbox:
        limits = self.reader.project.config.sandbox.outbox
        with (
            self.reader.store.scratch() as tmp,
            collect_tar(stream, limits=limits, tmp_dir=tmp) as found,  # type: ignore[arg-type]
        ):
            return self._keep_all(found)

    def outbox_dir(
        self, spec: ContainerSpec, folder: Path, *, message: str | None = None
    ) -> BatchOutbox:
        """The same for a host results folder (see ``StagingReader.outbox_dir``)."""
        limits = self.reader.project.config.sandbox.outbox
        with (
            self.reader.store.scratch() as tmp,
            collect_dir(folder, limits=limits, tmp_dir=tmp) as found,
        ):
            return self._keep_all(found)

    def _keep_all(self, found: Collected) -> BatchOutbox:
        files = []
        for item in found.files:
            if item.blob is None or item.sha256 is None:
                continue
            _keep(item.blob, self.blobs / item.sha256)
            files.append(
                {"path": item.path, "sha256": item.sha256, "size": item.size, "mode": item.mode}
            )
        rejected = [{"path": r.path, "reason": r.reason} for r in found.rejected]
        return BatchOutbox(files, rejected)

    def zones(self, prepared: Prepared) -> list[Any]:
        """``ask`` zones still make a change set per run: they target a zone, not the batch."""
        return self.reader.zones(prepared)


def make_change_set(
    reader: StagingReader,
    audit: AuditLog,
    blobs: Path,
    *,
    batch_id: str,
    worker: str,
    trust: str,
    records: Iterable[dict[str, Any]],
) -> tuple[str | None, int]:
    """One pending change set of every recorded input's files (``<key>/<path>``) and the
    manifest; returns its id (None when no input produced anything) and its file count."""
    files: list[CollectedFile] = []
    rejected: list[Rejection] = []
    entries = []
    for record in sorted(records, key=lambda r: str(r["key"])):
        key = record["key"]
        produced = record.get("files") or []
        for item in produced:
            blob = blobs / item["sha256"]
            files.append(
                CollectedFile(
                    f"{key}/{item['path']}",
                    "create",
                    item["size"],
                    item["sha256"],
                    item["mode"],
                    blob,
                )
            )
        rejected += [Rejection(f"{key}/{r['path']}", r["reason"]) for r in record["rejected"]]
        entries.append(
            {
                name: record.get(name)
                for name in ("key", "input", "sha256", "run_id", "status", "exit_code", "error")
            }
            | {"files": [f["path"] for f in produced], "rejected": len(record["rejected"])}
        )
    if not files and not rejected:
        return None, 0
    manifest = (
        json.dumps(
            {"batch_id": batch_id, "worker": worker, "inputs": entries}, indent=2, ensure_ascii=True
        ).encode()
        + b"\n"
    )
    digest = hashlib.sha256(manifest).hexdigest()
    (blobs / digest).write_bytes(manifest)
    files.append(
        CollectedFile(MANIFEST_NAME, "create", len(manifest), digest, 0o644, blobs / digest)
    )
    collected = Collected(sorted(files, key=lambda f: f.path), rejected, blobs)
    meta = ChangeMeta(
        worker=worker,
        trust=trust,
        target=ChangeTarget.repo(),
        message=f"{worker}: results of batch {batch_id} ({len(entries)} inputs)",
    )
    change = create_and_audit(reader.store, collected, meta, audit)
    return change.id, len(change.files)


def _keep(blob: Path, target: Path) -> None:
    """Move a collected blob into the batch's blobs (content addressed: one copy each)."""
    if target.exists():
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{id(blob)}")
    try:
        os.link(blob, tmp)
    except OSError:
        shutil.copyfile(blob, tmp, follow_symlinks=False)
    fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
