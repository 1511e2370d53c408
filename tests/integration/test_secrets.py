"""Secrets: only for trusted-enough workers, as files on an in-memory mount, redacted."""

from __future__ import annotations

import json
import textwrap

import pytest

from orchestrator.audit import AuditLog
from orchestrator.config import load_project, load_worker
from orchestrator.errors import PolicyError
from orchestrator.prepare import prepare
from orchestrator.runtime import execute
from orchestrator.runtime.container import ContainerBackend

pytestmark = pytest.mark.docker

TOKEN = "tok-Zq81-secret-value-7731"


@pytest.fixture
def secret_project(project):
    project.extra = "credentials:\n  api: {source: env, env: API_TOKEN}\n"
    project.write_project()
    return project


def test_untrusted_workers_never_get_secrets(secret_project):
    secret_project.worker("w", 'command: ["true"]\nsecrets: [api]')
    loaded = load_project(secret_project.root)
    with pytest.raises(PolicyError, match="refused at trust 'untrusted'"):
        prepare(loaded, load_worker(loaded, "w"))


def test_unknown_secret_names_are_refused(secret_project):
    secret_project.worker("w", 'command: ["true"]\ntrust: session\nsecrets: [nope]')
    loaded = load_project(secret_project.root)
    with pytest.raises(PolicyError, match="'nope' is not in .* credentials .*known: api"):
        prepare(loaded, load_worker(loaded, "w"))


def test_secret_is_a_file_in_memory_not_env_and_redacted_everywhere(engine, secret_project):
    script = textwrap.dedent(
        """
        import os
        value = open("/run/secrets/api").read()
        print("env has it:", any(value in v for v in os.environ.values()))
        print("mount:", [l.split()[2] for l in open("/proc/self/mounts") if " /run/secrets " in l])
        print("leak attempt:", value)
        try:
            open("/run/secrets/api", "w")
        except OSError as e:
            print("write refused", e.errno)
        raise SystemExit("failing with " + value)
        """
    )
    secret_project.worker(
        "w", f"command: {json.dumps(['python3', '-c', script])}\ntrust: session\nsecrets: [api]"
    )
    loaded = load_project(secret_project.root)
    prepared = prepare(loaded, load_worker(loaded, "w"))
    audit = AuditLog(loaded.sandbox_root / "audit.jsonl")
    shown: list[bytes] = []
    result = execute(
        ContainerBackend(engine),
        prepared,
        audit=audit,
        staging=None,
        secrets={"api": TOKEN},
        on_output=lambda stream, chunk: shown.append(chunk),
    )
    assert result.exit_code == 1
    assert "env has it: False" in result.stdout
    assert "mount: ['tmpfs']" in result.stdout  # the host's /dev/shm: memory, not disk
    assert "write refused" in result.stdout
    assert "leak attempt: [REDACTED]" in result.stdout
    assert "failing with [REDACTED]" in result.stderr
    assert TOKEN.encode() not in b"".join(shown)
    assert not prepared.paths.secrets_dir.exists()  # removed after the run
    # Nowhere in the sandbox root (audit log, sessions, runs) either.
    for path in loaded.sandbox_root.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
