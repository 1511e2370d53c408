"""``orchestrator/agent``: the image for agent workers has the tools an agent expects, and
runs hardened like any worker image (its user unprivileged, no set-id file). It is built
by the orchestrator's own builder, its apt step reaching the host's apt archives through
an allowlist made for that build."""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestrator.build.agent import build_agent_image
from orchestrator.build.builder import PROVENANCE
from orchestrator.docker.images import AGENT_IMAGE
from tests.integration.conftest import cli, require_gvisor

pytestmark = pytest.mark.docker

TOOLS = "git curl jq rg ps less patch unzip python3 pip3"
SCRIPT = f"""
set -eu
for tool in {TOOLS}; do command -v "$tool" >/dev/null && echo "have $tool"; done
python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'print("venv ok")'
test -s /etc/ssl/certs/ca-certificates.crt && echo "have ca-certificates"
echo "setid files: $(find / -xdev -perm /6000 -type f 2>/dev/null | wc -l)"
echo "uid $(id -u)"
"""


@pytest.fixture(scope="module")
def agent_image(engine) -> str:
    require_gvisor(engine)
    build_agent_image(lambda _: None)  # what `images build --with-agent` does (cached: ~1 s)
    return AGENT_IMAGE


def test_the_agent_image_has_an_agent_s_tools_and_no_setid_file(engine, project, agent_image):
    project.worker("agent", f"image: {agent_image}\ncommand: {json.dumps(['sh', '-c', SCRIPT])}")
    done = cli("run", "agent", "--project", str(project.root), "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    printed = done.json()["stdout"]
    for tool in TOOLS.split():
        assert f"have {tool}\n" in printed, printed
    assert "venv ok" in printed and "have ca-certificates" in printed
    assert "setid files: 0\n" in printed
    assert f"uid {project.identity[0]}\n" in printed  # a worker's uid, as with every image


def test_the_agent_image_is_built_by_the_orchestrator_s_builder_leaving_no_build_files(
    engine, agent_image
):
    found = engine.api.inspect_image(agent_image)
    labels = found["Config"]["Labels"]
    assert labels[PROVENANCE["runtime"]] == "orchestrator-runsc-build"
    assert labels["io.orchestrator.image"] == "agent"
    shown = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", agent_image, "-c",
         "ls -A /tmp; ls /var/lib/apt/lists | grep -c _ || true"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout.split() == ["0"]  # nothing left in /tmp, no package lists kept
