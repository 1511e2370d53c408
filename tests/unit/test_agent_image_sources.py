"""The agent image's build reaches the host's apt archives only: the allowlist made from
the host's apt sources at build time (no archive's address is written anywhere)."""

from __future__ import annotations

import pytest

from orchestrator.build.agent import apt_allowlist, build_agent_image
from orchestrator.docker.aptsources import Source
from orchestrator.errors import ImageBuildError


def test_each_http_or_https_archive_becomes_one_host_and_port():
    sources = [
        Source("http://archive.example/debian", "bookworm", ("main",)),
        Source("http://archive.example/debian-security", "bookworm-security", ("main",)),
        Source("https://secure.example:8443/deb", "bookworm", ("main",)),
        Source("https://plain-tls.example/deb", "bookworm", ("main",)),
        Source("file:/srv/local-repo", "bookworm", ("main",)),
        Source("cdrom:[Debian]/", "bookworm", ("main",)),
    ]
    assert apt_allowlist(sources) == [
        "archive.example:80", "plain-tls.example:443", "secure.example:8443"
    ]  # fmt: skip


def test_no_archive_reachable_over_http_is_one_line_before_any_build():
    with pytest.raises(ImageBuildError, match=r"name no http or https archive"):
        build_agent_image(lambda _: None, sources=[Source("file:/srv/r", "bookworm", ("main",))])
