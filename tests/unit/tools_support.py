"""A fake session over real sandbox files, for the tools' unit tests."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from orchestrator.audit import AuditLog
from orchestrator.config import load_project, load_worker
from orchestrator.prepare import prepare
from orchestrator.runtime.host_folders import make_host_folders
from orchestrator.sandbox import SandboxFiles
from orchestrator.tools import Toolset


@dataclass(frozen=True)
class FakeExecResult:
    argv: list[str]
    exit_code: int = 0
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.01
    timed_out: bool = False

    def to_dict(self):
        return asdict(self)


@dataclass
class FakeSession:
    files: SandboxFiles
    id: str
    run_id: str = "run-1"
    worker: str = "w"
    execs: list = field(default_factory=list)
    staged: list = field(default_factory=list)

    def read(self, path, offset=None, limit=None):
        return self.files.read(path, offset, limit)

    def write(self, path, content, append=False):
        return self.files.write(path, content, append)

    def delete(self, path):
        return self.files.delete(path)

    def list(self, path="/"):
        return self.files.list(path)

    def stat(self, path):
        return self.files.stat(path)

    def security_context(self):
        return self.files.security_context()

    def exec(self, command, *, cwd=None, env=None, timeout=None, stdin=None):
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        self.execs.append((argv, cwd, env, timeout, stdin))
        return FakeExecResult(argv, stdout="hi\n")

    def stage(self, files, message):
        self.staged.append((list(files), message))
        return "cs-1"


def toolset_for(project):
    """A Toolset over a fake session on real sandbox files (a generator: yield, close)."""
    project.zone("input", "ro", files={"a.txt": "one\ntwo\n"})
    project.zone("output", "rw")
    project.zone("data", "rw", files={"kept.txt": "original"})
    project.zone("notes", "rw", files={"n.txt": "note"})
    project.worker(
        "w",
        "trust: session\nsandbox: {zones: [{name: input}, {name: output, mode: rw}, "
        "{name: data, mode: rw, approval: {write: ask, delete: ask}}, "
        "{name: notes, mode: rw, approval: {write: ask, delete: blocked}}]}",
    )
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    make_host_folders(prepared)
    audit = AuditLog(project.root / "audit.jsonl")
    files = SandboxFiles(
        prepared.grant,
        owner=(prepared.uid, prepared.gid),
        audit=audit,
        session_id=prepared.session_id,
        worker="w",
    )
    session = FakeSession(files, prepared.session_id)
    toolset = Toolset(session)
    toolset.audit_log = audit
    toolset.root = project.root
    yield toolset
    files.close()
