"""``orchestrator/agent`` built by the orchestrator's own builder (``images/agent``).

Its one ``RUN`` installs packages from the host's apt archives: the host's ``/etc/apt``
sources are read when the build starts, their ``http``/``https`` hosts become the
allowlist of that one build (through the egress proxy, nothing else reachable), and the
entries themselves the ``APT_SOURCES`` build argument, which the step writes to a sources
file in its ``/tmp`` for its ``apt-get`` calls and removes. No archive's address is written
into a file. There is no project: the build runs in a throw-away one (its audit log goes
with it). See docs/build.md.
"""

from __future__ import annotations

import tempfile
import urllib.parse
from pathlib import Path

from orchestrator.docker.aptsources import Source, host_sources
from orchestrator.docker.images import AGENT_IMAGE, WORKER_IMAGE, Progress, images_dir
from orchestrator.errors import ImageBuildError

__all__ = ["AGENT_BUILD_MEMORY", "AGENT_BUILD_TIMEOUT_S", "apt_allowlist", "build_agent_image"]

#: What the agent image's build may use (its apt step): per step, and the whole build.
AGENT_BUILD_MEMORY = 2 << 30
AGENT_BUILD_TIMEOUT_S = 1800.0


def apt_allowlist(sources: list[Source]) -> list[str]:
    """``host:port`` of each archive the apt ``sources`` name over HTTP or HTTPS."""
    allow = []
    for source in sources:
        parsed = urllib.parse.urlsplit(source.uri)
        if parsed.scheme in ("http", "https") and parsed.hostname:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
            allow.append(f"{parsed.hostname}:{port}")
    return sorted(set(allow))


def build_agent_image(
    progress: Progress, *, tag: str = AGENT_IMAGE, sources: list[Source] | None = None
) -> str:
    """Build ``images/agent`` as ``tag`` with the orchestrator's own builder (each ``RUN``
    under gVisor); its apt step reaches the host's apt archives (``sources``, default:
    read from the host's /etc/apt now) and nothing else. Returns the image id."""
    from orchestrator.build import build_image as build_dockerfile
    from orchestrator.config import PROJECT_FILE
    from orchestrator.labels import PREFIX
    from orchestrator.runtime.state_key import derived_key

    sources = host_sources() if sources is None else sources
    allow = apt_allowlist(sources)
    if not allow:
        raise ImageBuildError(
            "the host's apt sources (/etc/apt/sources.list, sources.list.d) name no http or "
            "https archive: the agent image's packages come from them; add one, or build "
            "images/agent yourself"
        )
    reachable = [s for s in sources if s.uri.startswith(("http://", "https://"))]
    progress(f"building {tag} with the orchestrator's builder (apt through {', '.join(allow)})")
    with tempfile.TemporaryDirectory(prefix="orchestrator-agent-") as project:
        Path(project, PROJECT_FILE).write_text("{}\n")
        result = build_dockerfile(
            images_dir() / "agent",
            tag=tag,
            project=project,
            build_args={"WORKER": WORKER_IMAGE,
                        "APT_SOURCES": "\n".join(s.line() for s in reachable)},
            allow=allow,
            # The orchestrator's own label (a Dockerfile may not set one), and a cache of
            # this user's: the project is new each time.
            labels={f"{PREFIX}.image": "agent"},
            cache_key=derived_key("build-cache:agent-image"),
            memory=AGENT_BUILD_MEMORY,
            timeout=AGENT_BUILD_TIMEOUT_S,
            say=progress,
        )  # fmt: skip
    return result.image_id
