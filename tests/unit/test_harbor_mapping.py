"""A Harbor task's environment as this project's declarations (pure; no Harbor needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_project
from orchestrator.errors import ConfigError
from orchestrator.integrations.harbor import mapping
from tests.conftest import ProjectDir


def _refused(call, *args) -> str:
    with pytest.raises(ConfigError) as caught:
        call(*args)
    (line,) = caught.value.problems
    assert "\n" not in line and line.startswith("orchestrator environment: ")
    return line


def test_network_modes_map_onto_the_project_s():
    assert mapping.network_of("no-network", [], (80, 443)) == "none"
    assert mapping.network_of("public", [], (80, 443)) == "full"
    assert mapping.network_of("allowlist", [], (80, 443)) == "none"
    assert mapping.network_of("allowlist", ["pypi.org", "*.example.org", "192.0.2.7"], (443,)) == {
        "allow": ["pypi.org:443", "*.example.org:443", "192.0.2.7:443"]
    }
    assert mapping.network_of("allowlist", ["a.example.org"], (80, 8080)) == {
        "allow": ["a.example.org:80", "a.example.org:8080"]
    }


@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("10.0.0.0/8", "CIDR ranges cannot be enforced exactly"),
        ("2001:db8::1", "IPv6 addresses cannot be enforced"),
        ("localhost", "the task is refused"),
        ("127.0.0.1", "the task is refused"),
    ],
)
def test_allowlists_it_cannot_enforce_exactly_are_refused_in_one_line(host, words):
    assert words in _refused(mapping.network_of, "allowlist", [host], (80, 443))


def test_allow_ports():
    assert mapping.allowlist_ports(None) == (80, 443)
    assert mapping.allowlist_ports("443, 8080") == (443, 8080)
    assert mapping.allowlist_ports(8443) == (8443,)
    assert mapping.allowlist_ports((80, 80)) == (80,)
    assert "not a port" in _refused(mapping.allowlist_ports, "http")
    assert "not a port" in _refused(mapping.allowlist_ports, "0")


def test_mounts_are_zones_at_their_own_paths(tmp_path: Path):
    project_dir = ProjectDir(tmp_path / "p")
    code = project_dir.zone("code", "rw")
    project = load_project(project_dir.root)
    bind = {"type": "bind", "source": str(code), "target": "/code"}
    assert mapping.zones_of(project, []) is None
    (ro,) = mapping.zones_of(project, [{**bind, "read_only": True}]) or []
    assert (ro.name, ro.mode) == ("code", "ro")
    (rw,) = mapping.zones_of(project, [bind]) or []
    assert rw.mode == "rw"
    assert "is mounted at /code" in _refused(mapping.zones_of, project, [{**bind, "target": "/x"}])
    other = {**bind, "source": str(tmp_path)}
    assert "not a zone's folder" in _refused(mapping.zones_of, project, [other])
    volume = {**bind, "type": "volume"}
    assert "only bind mounts" in _refused(mapping.zones_of, project, [volume])


def test_the_image_comes_from_the_task_built_only_when_it_must_be(tmp_path: Path):
    env = tmp_path / "environment"
    env.mkdir()
    assert mapping.image_of(env, "local/image:1") == mapping.Image("local/image:1")
    assert "no Dockerfile" in _refused(mapping.image_of, env, None)
    (env / "Dockerfile").write_text(
        "# a base made here\nFROM orchestrator/worker:latest AS base\n"
        'WORKDIR /app\nENV A=1 B="two words"\nENV C \\\n  three\n'
    )
    assert mapping.image_of(env, None) == mapping.Image(
        "orchestrator/worker:latest", "/app", {"A": "1", "B": "two words", "C": "three"}
    )
    (env / "Dockerfile").write_text("FROM orchestrator/worker:latest\nRUN apt-get install -y x\n")
    assert mapping.image_of(env, None) == mapping.Image("", dockerfile=env / "Dockerfile")
    (env / "Dockerfile").write_text("FROM a AS one\nFROM b\n")  # stages: built too
    assert mapping.image_of(env, None) == mapping.Image("", dockerfile=env / "Dockerfile")
    (env / "docker-compose.yaml").write_text("services: {}\n")
    assert "compose environments are not supported" in _refused(mapping.image_of, env, None)


def test_a_task_image_run_as_it_is_must_be_one_the_project_s_builds_may_name(tmp_path):
    """``docker_image`` (or a Dockerfile that only says ``FROM``) names an image that is
    run without a build: it is held to ``build.images`` as a build's ``FROM`` is, so a
    task never runs another project's image or a proxy's by naming it."""
    shipped = mapping.Image("orchestrator/worker:latest")
    mapping.check_image(shipped, [], "p/orchestrator.yaml")  # shipped: always allowed
    mapping.check_image(mapping.Image("debian:bookworm"), ["debian"], "p/orchestrator.yaml")
    built = mapping.Image("", dockerfile=tmp_path / "Dockerfile")  # the builder checks it
    mapping.check_image(built, [], "p/orchestrator.yaml")
    for name in ("orchestrator/proxy:latest", "other-project/task:latest", "debian:bookworm"):
        line = _refused(mapping.check_image, mapping.Image(name), [], "p/orchestrator.yaml")
        assert f"image '{name}' is not one this project's builds may name" in line, line
        assert "build.images in p/orchestrator.yaml" in line, line
