"""A batch's folder on the host: ``<sandbox>/batches/<id>/``.

- ``batch.json``: the worker, its definition hash, the options and every input (path,
  key), written once when the batch is created;
- ``results.jsonl``: one line per finished input, appended and fsynced as each input ends,
  so that a SIGKILLed batch loses at most the inputs still running;
- ``blobs/<sha256>``: what the inputs' outboxes held, until the batch's change set is made;
- ``.lock``: held (``flock``) by the process running the batch, so two cannot run one batch.

The latest line of an input wins: a resumed batch appends new lines for what it re-ran.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.batch.inputs import BatchInput
from orchestrator.errors import ConfigError, OrchestratorError

__all__ = ["BATCHES_FOLDER", "BatchFolder", "BatchLocked"]

BATCHES_FOLDER = "batches"
RESULTS = "results.jsonl"
_ID = re.compile(r"^[0-9a-f]{12}$")


class BatchLocked(OrchestratorError):
    """Another live process runs this batch."""


@dataclass
class BatchFolder:
    """One batch's folder, opened (created or resumed) and locked by this process."""

    root: Path
    batch_id: str
    meta: dict[str, Any]
    _lock_fd: int = field(default=-1, repr=False)

    @property
    def folder(self) -> Path:
        return self.root / self.batch_id

    @property
    def results_file(self) -> Path:
        return self.folder / RESULTS

    @property
    def blobs(self) -> Path:
        return self.folder / "blobs"

    @property
    def inputs(self) -> list[BatchInput]:
        return [BatchInput(Path(i["path"]), i["key"]) for i in self.meta["inputs"]]

    @classmethod
    def create(cls, sandbox_root: Path, meta: dict[str, Any]) -> BatchFolder:
        root = sandbox_root / BATCHES_FOLDER
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        batch_id = secrets.token_hex(6)
        folder = root / batch_id
        folder.mkdir(mode=0o700)
        (folder / "blobs").mkdir(mode=0o700)
        data = (json.dumps({"batch_id": batch_id, **meta}, indent=2) + "\n").encode()
        _write_new(folder / "batch.json", data)
        batch = cls(root, batch_id, {"batch_id": batch_id, **meta})
        batch.lock()
        return batch

    @classmethod
    def open(cls, sandbox_root: Path, batch_id: str) -> BatchFolder:
        root = sandbox_root / BATCHES_FOLDER
        if not _ID.match(batch_id):
            raise ConfigError([f"--resume '{batch_id[:40]}': not a batch id (12 hex digits)"])
        file = root / batch_id / "batch.json"
        try:
            meta = json.loads(file.read_text())
        except FileNotFoundError:
            raise ConfigError(
                [f"--resume {batch_id}: no such batch under {root}; see `ls {root}`"]
            ) from None
        except (OSError, ValueError) as exc:
            raise OrchestratorError(f"{file}: unreadable ({exc}); start a new batch") from None
        batch = cls(root, batch_id, meta)
        batch.lock()
        (batch.folder / "blobs").mkdir(mode=0o700, exist_ok=True)
        return batch

    def lock(self) -> None:
        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BatchLocked(
                f"batch {self.batch_id} is being run by another process; wait for it to end"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def append(self, record: dict[str, Any]) -> None:
        """Append one result line and fsync it (a line is whole or absent after a crash)."""
        line = (json.dumps(record, ensure_ascii=True, sort_keys=True) + "\n").encode()
        fd = os.open(
            self.results_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def results(self) -> dict[str, dict[str, Any]]:
        """The latest result of each input key (a torn last line is ignored)."""
        latest: dict[str, dict[str, Any]] = {}
        try:
            text = self.results_file.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return latest
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("key"), str):
                latest[record["key"]] = record
        return latest

    def set_change(self, change_id: str | None) -> None:
        self.meta["change_id"] = change_id
        data = (json.dumps(self.meta, indent=2) + "\n").encode()
        tmp = self.folder / f".batch.json.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        _write_new(tmp, data)
        os.replace(tmp, self.folder / "batch.json")

    def drop_blobs(self) -> None:
        shutil.rmtree(self.blobs, ignore_errors=True)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
