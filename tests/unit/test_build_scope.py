"""What a project's build may take from the engine, without an engine: the base images it
may name (``build.images``), the orchestrator's labels (never from a Dockerfile or a base
image), and the cache key (the project's own; a networked step's carries its allowlist).
The real engine: tests/integration/test_build.py."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from orchestrator.build.bases import BaseImages, normal_ref
from orchestrator.build.builder import Builder
from orchestrator.build.context import Context
from orchestrator.build.dockerfile import BuildRefused, parse
from orchestrator.build.engine import StepLimits
from orchestrator.build.scope import CACHE_KEY_FILE, project_cache_key
from orchestrator.config import load_project
from orchestrator.config.loader import ConfigError
from orchestrator.credproxy import CREDPROXY_IMAGE
from orchestrator.egress import PROXY_IMAGE
from orchestrator.labels import NEUTRAL, explicit

SHIPPED_NAMES = ["orchestrator/worker:latest", "orchestrator/agent:latest",
                 "orchestrator/base:bookworm", "orchestrator/worker"]  # fmt: skip


@pytest.mark.parametrize(
    ("ref", "normal"),
    [("debian", "debian:latest"), ("docker.io/library/debian:12", "debian:12"),
     ("library/Debian:12", "debian:12"), ("my.registry:5000/a/b", "my.registry:5000/a/b:latest"),
     ("x@sha256:ab", "x@sha256:ab")],
)  # fmt: skip
def test_a_name_is_compared_as_docker_reads_it(ref, normal):
    assert normal_ref(ref) == normal


def test_the_shipped_images_are_allowed_and_nothing_else_by_default():
    images = BaseImages()
    assert all(images.allows(ref) for ref in SHIPPED_NAMES)
    for ref in ("debian:bookworm", PROXY_IMAGE, CREDPROXY_IMAGE, "orchestrator/orchestrator",
                "orchestrator-test/other-project:1", "sha256:" + "a" * 64, "e015e0716a7b"):  # fmt: skip
        assert not images.allows(ref), ref


def test_the_list_widens_by_name_and_pattern():
    images = BaseImages(("debian:bookworm", "python", "my-org/*"))
    assert images.allows("debian:bookworm") and images.allows("docker.io/library/debian:bookworm")
    assert not images.allows("debian:trixie")
    assert images.allows("python:3.12-slim") and images.allows("python")  # no tag: every tag
    assert images.allows("my-org/tools:1") and images.allows("my-org/a/b")
    assert not images.allows("my-orgx/tools:1")
    assert BaseImages(("*",)).allows("anything/at:all")


def test_the_loader_checks_build_images(tmp_path):
    (tmp_path / "orchestrator.yaml").write_text("build:\n  images: ['debian:*', 'bad name']\n")
    with pytest.raises(ConfigError) as refused:
        load_project(tmp_path)
    said = str(refused.value)
    assert (
        "orchestrator.yaml:2: build.images.1: 'bad name': an image name or pattern has no spaces"
        in said
    )
    (tmp_path / "orchestrator.yaml").write_text("build:\n  images: ['debian:*']\n")
    assert load_project(tmp_path).config.build.images == ["debian:*"]


class _Engine:
    """Images by name (each its own id and labels); anything else is an error."""

    def __init__(self, labels: dict[str, dict[str, str]] | None = None) -> None:
        self.labels = labels or {}
        self.alias: dict[str, str] = {}

    def image(self, ref: str) -> tuple[str, dict[str, Any]]:
        ref = self.alias.get(ref, ref)
        return "sha256:" + hashlib.sha256(ref.encode()).hexdigest(), {
            "Labels": self.labels.get(ref, {})
        }

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused build called the engine's {name}")


class _Audit:
    def record(self, event: str, **fields: Any) -> None:
        pass


def _build(tmp_path: Path, text: str, engine: _Engine | None = None, **options: Any) -> str:
    (tmp_path / "Dockerfile").write_text(text)
    limits = StepLimits(memory=1 << 30, cpus=1.0, pids=100, timeout_s=60.0, disk=1 << 30)
    builder = Builder(engine or _Engine(), _Audit(), Context.open(tmp_path),  # type: ignore[arg-type]
                      parse(tmp_path / "Dockerfile", text), limits, cache_key=b"k" * 32,
                      **options)  # fmt: skip
    with pytest.raises(BuildRefused) as refused:
        builder.build(None, None)
    return str(refused.value).removeprefix(f"{tmp_path}/")


def test_an_image_off_the_list_is_refused_naming_the_line_and_the_setting(tmp_path):
    images = BaseImages((), "/p/orchestrator.yaml")
    said = _build(tmp_path, "FROM orchestrator/worker\nRUN true\nFROM other/project:1\n",
                  images=images)  # fmt: skip
    assert said == (
        "Dockerfile:3: FROM: image 'other/project:1' is not one this project's builds may "
        "name (the images the orchestrator ships, orchestrator/base:*, orchestrator/worker:*, "
        "orchestrator/agent:*, and build.images in /p/orchestrator.yaml); add "
        "'other/project:1' or a pattern such as 'other/project' to build.images"
    )
    said = _build(tmp_path, "FROM orchestrator/worker AS a\nFROM a\nCOPY --from=secret/x /a /b\n")
    assert said.startswith("Dockerfile:3: COPY: image 'secret/x' is not one this project's")


@pytest.mark.parametrize("proxy", [PROXY_IMAGE, CREDPROXY_IMAGE])
def test_the_proxies_images_are_refused_whatever_the_list_and_the_name(tmp_path, proxy):
    engine = _Engine()
    engine.alias["innocent/name:1"] = proxy  # another tag of the same image
    for text in (f"FROM {proxy}\n", "FROM innocent/name:1\n",
                 f"FROM orchestrator/worker\nCOPY --from={proxy} /etc/passwd /x\n"):  # fmt: skip
        said = _build(tmp_path, text, engine, images=BaseImages(("*",)))
        assert said.endswith("image: no build may read it"), said
        assert "proxy's image" in said


@pytest.mark.parametrize(
    "label",
    ["LABEL io.orchestrator.managed=true io.orchestrator.owner-pid=999999",
     "LABEL ok=1 io.orchestrator.shared=true", 'LABEL "io.orchestrator.build.key"=abc',
     "LABEL IO.Orchestrator.Shared=true", "ARG NAME=io.orchestrator.session\nLABEL $NAME=x"],
)  # fmt: skip
def test_a_dockerfile_never_sets_the_orchestrators_labels(tmp_path, label):
    said = _build(tmp_path, f"FROM orchestrator/worker\n{label}\n", _Engine())
    line = 3 if label.startswith("ARG") else 2
    assert said.startswith(f"Dockerfile:{line}: LABEL: "), said
    assert "labels are the orchestrator's own; a Dockerfile may not set them" in said


def test_a_base_image_carrying_the_orchestrators_labels_is_refused(tmp_path):
    forged = {"io.orchestrator.managed": "true", "io.orchestrator.owner-pid": "999999"}
    engine = _Engine({"forged/base:1": forged})
    said = _build(tmp_path, "FROM forged/base:1\n", engine, images=BaseImages(("forged/*",)))
    assert said == (
        "Dockerfile:1: FROM: image 'forged/base:1' carries the label io.orchestrator.managed, "
        "which only the orchestrator sets (the engine would pass it into the image and every "
        "container made from it): rebuild that image without it"
    )


def _keys(tmp_path: Path, cache_key: bytes, allow: list[str]) -> list[str]:
    """The keys a one-step build asks the engine's cache for."""
    asked: list[str] = []

    class Cached(_Engine):
        def cached(self, key: str, parent: str) -> str:
            asked.append(key)
            return "sha256:" + "c" * 64

        def empty_image(self) -> str:
            return "sha256:" + "e" * 64

        def runtime(self) -> str:
            return "test"

    text = "FROM orchestrator/worker\nRUN --mount=type=secret,id=tok cp /run/secrets/tok /x\n"
    (tmp_path / "Dockerfile").write_text(text)
    from orchestrator.build.secrets import BuildSecrets

    limits = StepLimits(memory=1 << 30, cpus=1.0, pids=100, timeout_s=60.0, disk=1 << 30)
    builder = Builder(Cached(), _Audit(), Context.open(tmp_path),  # type: ignore[arg-type]
                      parse(tmp_path / "Dockerfile", text), limits, cache_key=cache_key,
                      allow=allow, secrets=BuildSecrets({"tok": lambda: "v"}, "p"))  # fmt: skip
    builder.build(None, None)
    return asked


def test_the_cache_key_is_the_projects_own_and_carries_a_networked_steps_allowlist(tmp_path):
    first = _keys(tmp_path, b"a" * 32, [])
    assert first == _keys(tmp_path, b"a" * 32, [])  # the same project finds its own
    assert not set(first) & set(_keys(tmp_path, b"b" * 32, []))  # another project: nothing
    wide = _keys(tmp_path, b"a" * 32, ["pkgs.example.org:8000", "other.example.org:8000"])
    narrow = _keys(tmp_path, b"a" * 32, ["pkgs.example.org:8000"])
    assert wide[0] != narrow[0] != first[0]
    same = _keys(tmp_path, b"a" * 32, ["OTHER.example.org:8000", "pkgs.example.org:8000"])
    assert same[0] == wide[0]  # the list normalised: order and case do not matter


def test_the_projects_cache_key_is_made_once_private_in_its_sandbox_root(tmp_path):
    (tmp_path / "orchestrator.yaml").write_text("{}\n")
    project = load_project(tmp_path)
    key = project_cache_key(project)
    assert len(key) == 32 and key == project_cache_key(project)
    info = os.lstat(project.sandbox_root / CACHE_KEY_FILE)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    other = tmp_path / "other"
    other.mkdir()
    (other / "orchestrator.yaml").write_text("{}\n")
    assert project_cache_key(load_project(other)) != key
    # A key someone else could read, or a link planted in its place, is refused.
    os.chmod(project.sandbox_root / CACHE_KEY_FILE, 0o644)
    with pytest.raises(Exception, match="the build cache key .* only you can read"):
        project_cache_key(project)
    os.unlink(project.sandbox_root / CACHE_KEY_FILE)
    os.symlink("/etc/hostname", project.sandbox_root / CACHE_KEY_FILE)
    with pytest.raises(Exception, match="link|build cache key"):
        project_cache_key(project)


def test_every_label_gc_reads_is_explicit_on_what_the_orchestrator_makes():
    made = explicit({"io.orchestrator.run-id": "r1"})
    assert set(NEUTRAL) <= set(made)
    assert made["io.orchestrator.shared"] == "false" and made["io.orchestrator.run-id"] == "r1"
    assert made["io.orchestrator.managed"] == "false"  # unless the maker says "true"
