"""Declarations: strict validation, one line per problem naming file, line, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_project, load_worker, parse_size
from orchestrator.config.models import human_size
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
        == f"{project.root / 'workers' / 'w.worker'}:4: resources.memroy: unknown field; did you mean 'memory'? (or remove it)"
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


@pytest.mark.parametrize(
    ("front", "expected"),
    [
        ("command: [true]", "command.0: must be text; quote it"),
        ("resources: {pids: 4}", "resources.pids: must be at least 8; write 8 or more"),
        ("sandbox: {zones: 5}", "sandbox.zones: must be a list; write [a, b]"),
        ("env: [1]", "env: must be a mapping; write 'name: value' pairs"),
        ("resources: {cpus: abc}", "resources.cpus: must be a number"),
    ],
)
def test_type_errors_say_what_to_write(project, front, expected):
    project.worker("w", front)
    with pytest.raises(ConfigError) as excinfo:
        load_worker(load_project(project.root), "w")
    (line,) = problems(excinfo)
    assert f"w.worker:2: {expected}" in line, line


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
        ConfigError, match=r"orchestrator\.yaml:2: zones\.all\.path: '/' is the host's root"
    ):
        load_project(project.root)
    (project.root / "orchestrator.yaml").write_text("zones:\n  sock: {path: /var}\n")
    with pytest.raises(ConfigError, match="resolves to /var, which holds /var/"):
        load_project(project.root)


@pytest.mark.parametrize(
    "target",
    [
        "/proc",
        "/proc/self",
        "/sys/kernel",
        "/dev",
        "/dev/shm",
        "/run",
        "/var/run",
        "/run/lock",
        "/var/lib",
    ],
)
def test_zone_resolving_into_host_only_folders_is_refused(project, target):
    (project.root / "orchestrator.yaml").write_text(
        f"zones:\n  ok: {{path: .}}\n  direct: {{path: '{target}'}}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_project(project.root)
    (line,) = problems(excinfo)
    assert line.startswith(
        f"{project.root / 'orchestrator.yaml'}:3: zones.direct.path: '{target}' resolves to "
        f"{target}, "
    )
    assert ", inside /" in line or ", which holds /var/lib/docker" in line
    assert line.endswith(("; name a project folder", "; name a narrower folder"))


@pytest.mark.parametrize("target", ["/proc", "/sys/kernel", "/run", "/tmp"])
def test_a_link_on_a_zone_path_is_refused_naming_it_wherever_it_points(project, target):
    (project.root / "innocent").symlink_to(target)
    (project.root / "orchestrator.yaml").write_text(
        "zones:\n  ok: {path: .}\n  sneaky: {path: innocent/.}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_project(project.root)
    (line,) = problems(excinfo)
    assert line == (
        f"{project.root / 'orchestrator.yaml'}:3: zones.sneaky.path: 'innocent/.' leads "
        f"through a symbolic link: {project.root / 'innocent'} -> {target}; links are never "
        "followed on these paths (a worker could have planted one): name the real path, or "
        "remove the link if a worker made it"
    )


def test_links_on_the_project_own_folders_are_refused(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project.root / "workers").rename(project.root / "workers.old")
    (project.root / "workers").symlink_to(elsewhere)
    (project.root / "state").symlink_to(elsewhere)
    project.extra = "sandbox: {root: state/sb}\n"
    project.write_project()
    with pytest.raises(ConfigError) as excinfo:
        load_project(project.root)
    found = problems(excinfo)
    assert [line.split(": ", 2)[1] for line in found] == ["sandbox.root", "workers"]
    assert all(f"-> {elsewhere}" in line for line in found)


def test_zone_next_to_the_engine_socket_named_by_docker_host_is_refused(project, monkeypatch):
    sockets = project.root / "engine"
    sockets.mkdir()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sockets}/docker.sock")
    (project.root / "orchestrator.yaml").write_text("zones:\n  e: {path: engine}\n")
    with pytest.raises(ConfigError, match="would expose the Docker socket"):
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


@pytest.mark.parametrize(
    "nested",
    [
        "[" * 1000 + "]" * 1000,
        "{a: " * 1000 + "1" + "}" * 1000,
        "\n" + "".join("  " * i + "-\n" for i in range(1000)) + "  " * 1000 + "- 1",
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences"],
)
def test_deep_nesting_is_one_line_not_a_recursion_error(project, nested):
    project.worker("w", f'command: ["true"]\nenv: {nested}')
    with pytest.raises(ConfigError) as excinfo:
        load_worker(load_project(project.root), "w")
    (line,) = problems(excinfo)
    assert "w.worker:" in line
    assert "invalid YAML: nested deeper than 32 levels" in line
    (project.root / "orchestrator.yaml").write_text(f"zones: {nested}\n")
    with pytest.raises(ConfigError, match=r"orchestrator\.yaml:\d+: invalid YAML: nested deeper"):
        load_project(project.root)


def test_duplicate_keys_name_both_lines_at_any_level(project):
    project.zone("z")
    (project.root / "orchestrator.yaml").write_text(
        "zones: {z: {path: ., mode: ro}, z: {path: /etc, mode: ro}}\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_project(project.root)
    assert problems(excinfo) == [
        f"{project.root / 'orchestrator.yaml'}:1: zones: duplicate key 'z' (first at line 1); "
        "keep one"
    ]
    project.worker(
        "w",
        'command: ["true"]\nresources:\n  memory: 1g\n  memory: 2g\n'
        "sandbox:\n  zones:\n    - {name: z, mode: ro, mode: rw}\ncommand: [x]",
    )
    project.write_project()
    with pytest.raises(ConfigError) as excinfo:
        load_worker(load_project(project.root), "w")
    assert [line.split("w.worker:")[1] for line in problems(excinfo)] == [
        "5: resources: duplicate key 'memory' (first at line 4); keep one",
        "8: sandbox.zones.0: duplicate key 'mode' (first at line 8); keep one",
        "9: (top level): duplicate key 'command' (first at line 2); keep one",
    ]


def test_merge_keys_and_aliases_are_not_duplicates(project):
    project.worker(
        "w",
        'command: ["true"]\nresources: &r {memory: 1g}\nenv: {A: x, <<: {B: y}, B: z}',
    )
    worker = load_worker(load_project(project.root), "w")
    assert worker.config.env == {"A": "x", "B": "z"}


def test_non_string_env_values_give_one_line_each(project):
    project.worker("w", 'command: ["true"]\nenv: {A: [1], B: {x: 1}, C: ok, D: 2}')
    with pytest.raises(ConfigError) as excinfo:
        load_worker(load_project(project.root), "w")
    assert [line.split("w.worker:")[1] for line in problems(excinfo)] == [
        "3: env.A: must be a string, number or boolean, not a list; quote it",
        "3: env.B: must be a string, number or boolean, not a mapping; quote it",
    ]


def test_engine_minimums_are_checked_when_loading(project):
    project.worker("w", 'command: ["true"]\nresources: {memory: 1k, cpus: 0.001}')
    with pytest.raises(ConfigError) as excinfo:
        load_worker(load_project(project.root), "w")
    assert [line.split("w.worker:")[1] for line in problems(excinfo)] == [
        "3: resources.memory: 1 KiB is below the engine's minimum memory limit of 6 MiB; "
        "write at least 6m",
        "3: resources.cpus: 0.001 is below the engine's minimum of 0.01 CPUs",
    ]
    project.extra = "defaults: {resources: {memory: 5m}}\n"
    project.write_project()
    with pytest.raises(ConfigError, match=r"orchestrator\.yaml:\d+: defaults\.resources\.memory"):
        load_project(project.root)
    project.worker("ok", 'command: ["true"]\nresources: {memory: 6m, cpus: 0.01}')
    project.extra = ""
    project.write_project()
    assert load_worker(load_project(project.root), "ok").config.resources.memory == 6 << 20


@pytest.mark.parametrize(
    ("size", "text"),
    [(2 << 30, "2 GiB"), (1536 << 20, "1.5 GiB"), (999 << 40, "999 TiB"), (100, "100 bytes"),
     (6 << 20, "6 MiB"), (4096, "4 KiB")],
)  # fmt: skip
def test_human_sizes(size, text):
    assert human_size(size) == text


def test_invalid_fields_leave_a_partial_worker_for_the_grant_checks(project):
    project.worker("w", 'command: ["true"]\nresources: {memory: 1k, cpus: 2}\nenv: {A: [1]}')
    with pytest.raises(ConfigError) as caught:
        load_worker(load_project(project.root), "w")
    partial = caught.value.partial
    assert partial is not None
    assert partial.config.resources.memory is None  # the failing field is left out
    assert partial.config.resources.cpus == 2  # the valid ones are kept
    assert "A" not in partial.config.env


def test_an_invalid_grant_field_leaves_no_partial_worker(project):
    project.worker("w", 'command: ["true"]\nresources: {memory: 1k}\ntrust: root')
    with pytest.raises(ConfigError) as caught:
        load_worker(load_project(project.root), "w")
    assert caught.value.partial is None


def test_clearance_sensitive_paths_take_relative_patterns(project):
    project.extra = "clearance:\n  sensitive_paths: ['tools/*.sh', 'ci/**', 'bad/../x', '/abs']\n"
    project.write_project()
    with pytest.raises(ConfigError) as excinfo:
        load_project(project.root)
    assert len(problems(excinfo)) == 2  # the good patterns pass
    joined = "\n".join(problems(excinfo))
    assert "clearance.sensitive_paths.2: 'bad/../x' has an empty" in joined
    assert "clearance.sensitive_paths.3: '/abs' is not a relative path" in joined
    project.extra = "clearance: {sensitive_paths: ['tools/*.sh', 'ci/**']}\n"
    project.write_project()
    settings = load_project(project.root).config.clearance
    assert settings.sensitive_paths == ["tools/*.sh", "ci/**"]


def test_build_secrets_name_credentials_that_hold_a_value(project):
    (project.root / "orchestrator.yaml").write_text(
        "credentials:\n"
        "  token: {source: env, env: TOKEN}\n"
        "  api: {source: env, env: API, egress: {hosts: [api.example.org]}}\n"
        "  agent: {source: env, mode: inherit}\n"
        "build:\n"
        "  secrets: [token, tokn, api, agent]\n"
    )
    with pytest.raises(ConfigError) as excinfo:
        load_project(project.root)
    unknown, egress, inherit = problems(excinfo)
    assert unknown.endswith(
        "orchestrator.yaml:6: build.secrets[1]: 'tokn' is not in credentials (known: agent, "
        "api, token); did you mean 'token'? declare it under credentials or remove it"
    )
    assert "build.secrets[2]: 'api' is an egress credential" in egress
    assert "build.secrets[3]: 'agent' is mode inherit and holds no value" in inherit
    (project.root / "orchestrator.yaml").write_text(
        "credentials:\n  token: {source: env, env: TOKEN}\nbuild:\n  secrets: [token]\n"
    )
    assert load_project(project.root).config.build.secrets == ["token"]
