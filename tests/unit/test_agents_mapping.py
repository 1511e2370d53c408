"""What an agents-SDK sandbox asks for, as this project's declarations (pure; no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import Worker, load_project
from orchestrator.errors import ConfigError, PolicyError
from orchestrator.integrations.agents import mapping
from orchestrator.prepare import prepare
from tests.conftest import ProjectDir


def _spec(project: ProjectDir, fields: dict):
    loaded = load_project(project.root)
    env = mapping.environment_of(fields)
    worker = mapping.worker_of(env, loaded, project.root)
    assert isinstance(worker, Worker)
    return prepare(loaded, worker).spec


def _one_line(call, *args) -> str:
    with pytest.raises(ConfigError) as caught:
        call(*args)
    (line,) = caught.value.problems
    assert "\n" not in line and line.startswith("orchestrator sandbox: ")
    return line


def test_nothing_asked_nothing_refused():
    assert (
        mapping.refusals(exposed_ports=(), users=[], groups=[], mounts=[], root="/workspace") == []
    )


@pytest.mark.parametrize(
    ("asked", "words"),
    [
        ({"exposed_ports": (8080,)}, "publishes no ports"),
        ({"users": ["root"]}, "runs as its own uid only"),
        ({"groups": ["staff"]}, "group staff"),
        ({"mounts": ["/workspace/bucket"]}, "FUSE and SYS_ADMIN"),
        ({"host_grants": ["/srv"]}, "only as the project's zones"),
        ({"root": "work"}, "absolute folder"),
        ({"root": "/"}, "absolute folder"),
    ],
)
def test_each_unsupported_request_is_named(asked, words):
    given = {"exposed_ports": (), "users": [], "groups": [], "mounts": [], "root": "/workspace"}
    (problem,) = mapping.refusals(**{**given, **asked})
    assert words in problem and "\n" not in problem


def test_only_the_worker_s_own_uid_is_a_user():
    assert mapping.user_allowed(None, 1000, 1000)
    assert mapping.user_allowed("1000", 1000, 1000)
    assert mapping.user_allowed("1000:1001", 1000, 1001)
    assert not mapping.user_allowed("root", 1000, 1000)
    assert not mapping.user_allowed("0", 1000, 1000)
    assert not mapping.user_allowed("sandbox-user", 1000, 1000)


def test_the_worker_is_named_or_described_inline(tmp_path: Path):
    project = ProjectDir(tmp_path / "p")
    project.write_project()
    loaded = load_project(project.root)
    env = mapping.environment_of({"worker": "agent", "trust": "untrusted", "project": "x"})
    assert mapping.worker_of(env, loaded, tmp_path) == "agent"
    env = mapping.environment_of({"worker": "w/agent.worker"})
    assert mapping.worker_of(env, loaded, tmp_path) == str(tmp_path / "w" / "agent.worker")
    inline = mapping.worker_of(mapping.environment_of({"network": "none"}), loaded, tmp_path)
    assert isinstance(inline, Worker) and inline.config.name == mapping.INLINE_NAME


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"network": "wide"}, "network"),
        ({"isolation": "kvm"}, "isolation"),
        ({"worker": "agent", "image": "x"}, "worker names a worker file"),
        ({"zones": [{"name": "data", "mode": "rwx"}]}, "zones.0.mode"),
    ],
)
def test_wrong_options_are_one_line_naming_the_field(fields, words):
    assert words in _one_line(mapping.environment_of, fields)


def test_the_workspace_gets_a_tmpfs_only_where_the_worker_cannot_write(tmp_path: Path):
    project = ProjectDir(tmp_path / "p")
    project.zone("data", "ro")
    project.zone("out", "rw", extra="untrusted_output: true")
    zones = [{"name": "data", "mode": "ro"}, {"name": "out", "mode": "rw"}]
    spec = _spec(project, {"zones": zones})
    assert mapping.workspace_tmpfs(spec, "/workspace")
    assert not mapping.workspace_tmpfs(spec, "/tmp/work")
    assert not mapping.workspace_tmpfs(spec, "/out/work")
    assert "inside /data" in _one_line(mapping.workspace_tmpfs, spec, "/data/work")


def test_the_network_is_what_the_options_ask_never_wider(tmp_path: Path):
    project = ProjectDir(tmp_path / "p")
    project.write_project()
    assert _spec(project, {}).network.mode == "none"
    allowed = _spec(project, {"network": {"allow": ["example.org:443"]}}).network
    assert allowed.mode == "allowlist"
    assert [str(entry) for entry in allowed.allow] == ["example.org:443"]
    # wider than the project gives untrusted workers: refused, not narrowed or widened
    with pytest.raises(PolicyError, match="'full' is more than"):
        _spec(project, {"network": "full"})
