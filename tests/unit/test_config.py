"""Declarations: strict validation, one line per problem naming file, line, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_project, load_worker, parse_size
from orchestrator.errors import ConfigError


def problems(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return excinfo.value.problems


@pytest.mark.parametrize(
    ("text", "size"),
    [("512m", 512 << 20), ("1g", 1 << 30), ("1.5GiB", int(1.5 * (1 << 30))), (4096, 4096),
     ("64k", 64 << 10), ("100", 100)],
)  # fmt: skip
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1m", "0", "12x", True])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_loads_a_project_and_worker(project):
    project.zone("input", files={"a.txt": "x"})
    project.zone("output", "rw")
    project.worker(
        "triage",
        """
        description: reads things
        command: ["python3", "-c", "print(1)"]
        env: {LEVEL: 3, VERBOSE: true, NAME: x}
        resources: {memory: 256m, cpus: 0.5, pids: 64, timeout: 30}
        sandbox:
          zones:
            - {name: input, mode: ro}
            - {name: output, mode: rw}
        network: none
        """,
        body="Read the inputs.\n",
    )
    loaded = load_project(project.root)
    assert loaded.zones["input"].host_path == (project.root / "input").resolve()
    assert loaded.sandbox_root == project.root.resolve() / ".sandbox"
    worker = load_worker(loaded, "triage")
    assert worker.config.resources.memory == 256 << 20
    assert worker.instructions == "Read the inputs."
    assert worker.config.sandbox is not None
    assert [z.mode for z in worker.config.sandbox.zones] == ["ro", "rw"]
    # A path works as well as a name.
    assert load_worker(loaded, str(project.root / "workers" / "triage.worker")).name == "triage"


def test_unknown_key_names_file_line_and_field(project):
    project.worker("w", 'command: ["true"]\nresources:\n  memroy: 1g')
    loaded = load_project(project.root)
    with pytest.raises(ConfigError) as excinfo:
        load_worker(loaded, "w")
    (line,) = problems(excinfo)
    assert (
        line
        == f"{project.root / 'workers' / 'w.worker'}:4: resources.memroy: unknown field; remove it or check its spelling"
    )


def test_every_problem_is_reported_once(project):
    project.worker("w", "network: wide\nresources: {memory: lots, pids: 1}\nbogus: 1")
    with pytest.raises(ConfigError) as excinfo:
        load_worker(load_project(project.root), "w")
    lines = problems(excinfo)
    assert len(lines) == 4
    joined = "\n".join(lines)
    assert "network: 'wide' must be none, full, or {allow: [DOMAIN, ...]}" in joined
    assert "resources.memory: 'lots' is not a size; write it like 512m or 2g" in joined
    assert "resources.pids:" in joined
    assert "bogus: unknown field" in joined
    assert all("w.worker:" in line for line in lines)


def test_project_errors(project):
    (project.root / "orchestrator.yaml").write_text(
        "zones:\n  etc: {path: x}\n  good: {path: y, mode: rwx}\nsandbox: {root: .s, extra: 1}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_project(project.root)
    joined = "\n".join(problems(excinfo))
    assert "would hide the container's /etc" in joined
    assert "zones.good.mode: must be one of 'ro' or 'rw'" in joined
    assert "orchestrator.yaml:4: sandbox.extra: unknown field" in joined


@pytest.mark.parametrize(
    ("name", "message"),
    [("session", "reserved"), ("Bad", "invalid"), ("proc", "hide")],
)
def test_zone_names(project, name, message):
    (project.root / "orchestrator.yaml").write_text(f"zones:\n  {name}: {{path: x}}\n")
    with pytest.raises(ConfigError, match=message):
        load_project(project.root)


def test_zone_cannot_be_root_or_hold_the_docker_socket(project):
    (project.root / "orchestrator.yaml").write_text("zones:\n  all: {path: /}\n")
    with pytest.raises(
        ConfigError, match=r"orchestrator\.yaml:2: zones\.all\.path: the host's root"
    ):
        load_project(project.root)
    (project.root / "orchestrator.yaml").write_text("zones:\n  sock: {path: /var/run}\n")
    with pytest.raises(ConfigError, match="Docker socket"):
        load_project(project.root)


def test_zone_may_not_overlap_the_sandbox_root(project):
    (project.root / "orchestrator.yaml").write_text("zones:\n  state: {path: .sandbox/runs}\n")
    with pytest.raises(ConfigError, match="overlaps the sandbox root"):
        load_project(project.root)


def test_missing_project_file(tmp_path):
    with pytest.raises(ConfigError, match="no project file here; create orchestrator.yaml"):
        load_project(tmp_path)


def test_invalid_yaml_names_the_line(project):
    project.worker("w", 'command: ["true"\nnetwork: none')
    with pytest.raises(ConfigError, match=r"w\.worker:\d+: invalid YAML"):
        load_worker(load_project(project.root), "w")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name: w\n", "starts with a '---' line"),
        ("---\nname: w\n", "front matter is not closed"),
        ("---\n- a\n---\n", "front matter must be a mapping"),
        ("---\nname: other\n---\n", "differs from the file name"),
        ("---\nworkdir: rel\n---\n", "must be an absolute path"),
        ("---\nenv: {'1BAD': x}\n---\n", "not a valid environment variable name"),
        ("---\nsandbox: {zones: [{name: a}, {name: a}]}\n---\n", "listed twice"),
    ],
)
def test_worker_file_shape(project, content, message):
    (project.root / "workers" / "w.worker").write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_worker(load_project(project.root), "w")


def test_unknown_worker_lists_known_ones(project):
    project.worker("alpha", 'command: ["true"]')
    with pytest.raises(ConfigError, match="no worker named 'beta'.*known workers: alpha"):
        load_worker(load_project(project.root), "beta")


def test_not_utf8(project):
    (project.root / "workers" / "w.worker").write_bytes(b"---\nname: \xff\n---\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_worker(load_project(project.root), "w")


def test_project_path_may_be_given_relative(project, monkeypatch):
    monkeypatch.chdir(project.root.parent)
    assert load_project(Path(project.root.name)).root == project.root.resolve()
