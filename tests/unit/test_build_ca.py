"""``build.ca``: the setting's forms, where its CAs are read from, and that its files are
policy files (docs/build.md#corporate-cas-buildca). The step's mount is tested against the
engine in tests/integration/test_build_ca.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import build
from orchestrator.build.dockerfile import BuildRefused
from orchestrator.config import load_project
from orchestrator.errors import ConfigError
from orchestrator.policy.grant import policy_paths

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def project(tmp_path: Path, text: str):
    (tmp_path / "orchestrator.yaml").write_text(text)
    (tmp_path / "workers").mkdir(exist_ok=True)
    return load_project(tmp_path)


def test_build_ca_is_host_or_a_list_of_files_and_nothing_else(tmp_path):
    assert project(tmp_path, "build: {ca: host}\n").config.build.ca == "host"
    assert project(tmp_path, "build: {ca: [a.pem]}\n").config.build.ca == ["a.pem"]
    assert project(tmp_path, "build: {}\n").config.build.ca == []
    with pytest.raises(ConfigError) as refused:
        project(tmp_path, "build: {ca: everything}\n")
    assert "build.ca" in str(refused.value)


def test_host_reads_the_machine_s_bundle_and_says_when_there_is_none(tmp_path, monkeypatch):
    bundle = tmp_path / "host-bundle.crt"
    bundle.write_bytes(CA)
    monkeypatch.setattr(build, "HOST_BUNDLES", (str(tmp_path / "absent"), str(bundle)))
    loaded = project(tmp_path, "build: {ca: host}\n")
    assert build._build_cas(loaded) == CA
    monkeypatch.setattr(build, "HOST_BUNDLES", (str(tmp_path / "absent"),))
    with pytest.raises(BuildRefused, match="build.ca: host: this machine has no CA bundle"):
        build._build_cas(loaded)


def test_named_files_are_read_as_policy_files_and_a_key_is_refused(tmp_path):
    (tmp_path / "ca.pem").write_bytes(CA)
    loaded = project(tmp_path, "build: {ca: [ca.pem]}\n")
    assert build._build_cas(loaded) == CA
    assert tmp_path / "ca.pem" in policy_paths(loaded)
    (tmp_path / "ca.pem").write_bytes(CA + b"-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(BuildRefused, match="build.ca: .*ca.pem is not a PEM certificate"):
        build._build_cas(loaded)
    (tmp_path / "ca.pem").unlink()
    (tmp_path / "ca.pem").symlink_to(tmp_path / "elsewhere.pem")
    (tmp_path / "elsewhere.pem").write_bytes(CA)
    with pytest.raises(BuildRefused, match="build.ca: cannot read .*ca.pem"):
        build._build_cas(loaded)
