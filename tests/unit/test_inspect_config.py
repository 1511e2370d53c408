"""The Inspect AI provider's settings and its pure parts: no engine, no Inspect eval."""

from __future__ import annotations

import errno
import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from orchestrator import Orchestrator
from orchestrator.errors import ConfigError
from orchestrator.integrations.inspect import Environment, OrchestratorSandboxConfig
from orchestrator.integrations.inspect.config import resolve
from orchestrator.integrations.inspect.sandboxes import TOOLS_DIR, _tailor
from orchestrator.integrations.transfer import failure
from tests.conftest import ProjectDir


def test_a_single_environment_may_be_given_at_the_top_level():
    config = OrchestratorSandboxConfig.model_validate({"project": "p", "worker": "agent"})
    assert config.project == "p"
    assert list(config.environments) == ["default"]
    assert config.environments["default"].worker == "agent"
    assert hash(config) == hash(OrchestratorSandboxConfig.model_validate(config.model_dump()))


def test_a_worker_file_and_inline_fields_are_not_mixed():
    with pytest.raises(ValueError, match="drop them here"):
        Environment(worker="agent", image="x", network="none")


def test_a_settings_file_is_checked_with_file_line_and_field(tmp_path: Path, project):
    settings = tmp_path / "sandbox.yaml"
    settings.write_text(f"project: {project.root}\nenvironments:\n  main:\n    pool: -1\n")
    with pytest.raises(ConfigError) as info:
        resolve("sandbox.yaml", tmp_path)
    assert info.value.problems == [
        f"{settings}:4: environments.main.pool: must be at least 0; write 0 or more"
    ]
    with pytest.raises(ConfigError, match="no such file"):
        resolve("missing.yaml", tmp_path)
    with pytest.raises(ConfigError, match="needs a config"):
        resolve(None, tmp_path)


def test_paths_resolve_against_the_settings_file_and_a_worker_file_finds_its_project(project):
    project.worker("agent", "command: [sh]\nnetwork: none")
    (project.root / "evals").mkdir()
    (project.root / "evals" / "sandbox.yaml").write_text(
        "project: ..\nenvironments:\n  a: {worker: ../workers/agent.worker}\n  b: {worker: agent}\n"
    )
    settings = resolve("evals/sandbox.yaml", project.root)
    assert settings.project.root == project.root
    assert settings.worker("a") == str(project.root / "workers" / "agent.worker")
    assert settings.worker("b") == "agent"
    by_file = resolve("workers/agent.worker", project.root)
    assert by_file.project.root == project.root
    assert by_file.worker("default") == str(project.root / "workers" / "agent.worker")


def test_an_inline_worker_gets_a_writable_var_tmp_for_inspect_s_tools(project):
    settings = resolve(
        OrchestratorSandboxConfig.model_validate(
            {"project": str(project.root), "resources": {"memory": "64m"}, "tools_tmp": "1g"}
        ),
        Path("/"),
    )
    worker = settings.worker("default")
    orch = Orchestrator(project.root)
    spec = _tailor(1 << 30)(orch.prepare(worker)).spec
    assert spec.mounts == []  # no zones asked for: no mounts
    tools = spec.tmpfs_at(TOOLS_DIR)
    assert tools is not None and not tools.noexec
    assert tools.size == spec.limits.memory == 64 << 20  # never more than the memory
    assert _tailor(None)(orch.prepare(worker)).spec.tmpfs_at(TOOLS_DIR) is None


@pytest.mark.parametrize(
    ("stderr", "kind", "number"),
    [
        ("cat: a: No such file or directory\n", FileNotFoundError, errno.ENOENT),
        ("sh: 1: cannot create a: Permission denied\n", PermissionError, errno.EACCES),
        ("mkdir: cannot create directory 'x': Read-only file system\n", PermissionError,
         errno.EROFS),
        ("a: Is a directory\n", IsADirectoryError, errno.EISDIR),
        ("cat: write error: No space left on device\n", OSError, errno.ENOSPC),
        ("something else\n", OSError, errno.EIO),
    ],
)  # fmt: skip
def test_transfer_failures_become_the_exceptions_inspect_expects(stderr, kind, number):
    error = failure("dir/a", stderr, "read_file")
    assert type(error) is kind
    assert error.errno == number
    assert "dir/a" in str(error)


def test_the_provider_is_registered_through_the_inspect_ai_entry_point_group():
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    text = pyproject.read_text()
    assert (
        '[project.entry-points.inspect_ai]\norchestrator = "orchestrator.integrations.inspect.provider"'
        in text
    )
    found = entry_points(group="inspect_ai", name="orchestrator")
    # Installed from this pyproject under CI; on a laptop an older install may predate it.
    if found or os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        assert [e.value for e in found] == ["orchestrator.integrations.inspect.provider"]
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    import orchestrator.integrations.inspect.provider as provider

    assert registry_find_sandboxenv("orchestrator") is provider.OrchestratorSandboxEnvironment


@pytest.fixture
def elsewhere(tmp_path_factory):
    """Another project on the machine, whose worker has a read-write zone on a folder."""
    other = ProjectDir(tmp_path_factory.mktemp("elsewhere") / "p")
    other.zone("victim", "rw")
    other.worker("evil", "sandbox:\n  zones:\n    - {name: victim, mode: rw}\nnetwork: none")
    return other


def test_a_config_from_a_path_or_data_names_only_files_inside_the_task(project, elsewhere):
    task = project.root
    project.worker("agent", "command: [sh]\nnetwork: none")
    evil = elsewhere.root / "workers" / "evil.worker"
    os.symlink(evil, task / "linked.worker")
    (task / "out").symlink_to(elsewhere.root)
    cases = {
        str(evil): "is outside the task's folder",
        os.path.relpath(evil, task): "leads out of ('..') the task's folder",
        "linked.worker": "linked.worker is a symbolic link",
        "out/workers/evil.worker": "out is a symbolic link",
    }
    for given, why in cases.items():
        with pytest.raises(ConfigError) as info:
            resolve(given, task)
        (problem,) = info.value.problems
        assert why in problem and "inside the task's folder" in problem, problem
    (task / "s.yaml").write_text(f"project: {elsewhere.root}\nworker: evil\n")
    with pytest.raises(ConfigError, match="project /.*: is outside the task's folder"):
        resolve("s.yaml", task)
    (task / "s.yaml").write_text("project: .\nworker: ../../elsewhere0/p/workers/evil.worker\n")
    with pytest.raises(ConfigError, match="environments.default.worker .*: leads out"):
        resolve("s.yaml", task)
    # The same fields as data (a dataset's mapping, read by config_deserialize): the same.
    data = {"project": str(elsewhere.root), "worker": "evil"}
    with pytest.raises(ConfigError, match="is outside the task's folder"):
        resolve(OrchestratorSandboxConfig.from_data(data), task)
    # A model the task builds in Python may name another project: the task's code is trusted.
    built = resolve(OrchestratorSandboxConfig.model_validate(data), task)
    assert built.project.root == elsewhere.root
    assert resolve("workers/agent.worker", task).project.root == task
    assert resolve(str(task / "workers" / "agent.worker"), task).project.root == task


@pytest.mark.parametrize("what", ["worker", "project", "folder"])
def test_project_and_worker_files_another_user_can_write_are_refused(project, what):
    project.worker("agent", "command: [sh]\nnetwork: none")
    changed = {
        "worker": (project.root / "workers" / "agent.worker", 0o664),
        "project": (project.root / "orchestrator.yaml", 0o646),
        "folder": (project.root / "workers", 0o777),
    }
    path, mode = changed[what]
    if what == "worker":  # writable by a group of other users ('nogroup': nobody's)
        os.chown(path, -1, 65534)
    config = OrchestratorSandboxConfig.model_validate(
        {"project": str(project.root), "worker": "agent"}
    )
    assert resolve(config, project.root).project.root == project.root
    path.chmod(mode)
    for given in (config, "workers/agent.worker"):
        with pytest.raises(ConfigError) as info:
            resolve(given, project.root)
        assert f"{path} has mode {mode:04o}: other users could change" in info.value.problems[0]
    path.chmod(mode | 0o1000 if what == "folder" else mode)
    if what == "folder":  # sticky: others may add names, never replace the worker file
        assert resolve(config, project.root).project.root == project.root


def test_an_environment_may_name_a_dockerfile_never_a_compose_file(tmp_path: Path, project):
    task = project.root / "task"
    task.mkdir()
    (task / "Dockerfile").write_text("FROM orchestrator/worker:latest\nRUN true\n")
    settings = task / "sandbox.yaml"
    settings.write_text(f"project: {project.root}\ndockerfile: Dockerfile\nimage_user: true\n")
    resolved = resolve(str(settings), tmp_path)
    assert resolved.dockerfile("default") == task / "Dockerfile"
    worker = resolved.worker("default", image="sha256:built")
    assert (worker.config.image, worker.config.image_user) == ("sha256:built", True)

    # A Dockerfile named as the whole config: its project is the folder above it.
    direct = resolve(str(task / "Dockerfile"), tmp_path)
    assert (direct.project.root, direct.dockerfile("default")) == (
        project.root,
        task / "Dockerfile",
    )

    with pytest.raises(ValueError, match="image or dockerfile, not both"):
        Environment(image="x", dockerfile="Dockerfile")
    with pytest.raises(ValueError, match="compose file, which is not supported"):
        Environment(dockerfile="docker-compose.yml")
    (task / "compose.yaml").write_text("services: {}\n")
    with pytest.raises(ConfigError) as info:
        resolve(str(task / "compose.yaml"), tmp_path)
    (line,) = info.value.problems
    assert "compose files are not supported" in line and "Dockerfile" in line
