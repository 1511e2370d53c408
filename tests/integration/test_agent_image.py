"""``orchestrator/agent``: the image for agent workers has the tools an agent expects, and
runs hardened like any worker image (its user unprivileged, no set-id file)."""

from __future__ import annotations

import json

import pytest

from orchestrator.docker.images import AGENT_IMAGE, WORKER_IMAGE, build_image
from tests.integration.conftest import cli

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
    if not engine.image_exists(AGENT_IMAGE):  # what `images build --with-agent` does
        base = "orchestrator/base:bookworm"
        build_image(engine, "agent", AGENT_IMAGE, base, lambda _: None,
                    buildargs={"WORKER": WORKER_IMAGE})  # fmt: skip
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
