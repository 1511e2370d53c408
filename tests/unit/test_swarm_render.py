"""The swarm service a plan becomes: pure, no engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.config import load_project, load_worker
from orchestrator.docker.swarm import render
from orchestrator.plan import SECRETS_DIR, Mount, Network, Tmpfs
from orchestrator.prepare import prepare


@pytest.fixture
def spec(project):
    project.extra = "isolation: {untrusted: runc}\n"
    project.write_project()
    project.worker(
        "w",
        'command: ["python3", "-c", "print(1)"]\nsandbox: {}\nresources: {memory: 96m, pids: 48, tmp: 8m}',
    )
    loaded = load_project(project.root)
    return prepare(loaded, load_worker(loaded, "w")).spec


def test_the_task_carries_the_plans_hardening(spec):
    service = render.service_spec(spec, argv=["python3", "-c", "x"], network="net1", results="/r")
    container = service.task_template["ContainerSpec"]
    assert container["User"] == spec.user and container["ReadOnly"] is True
    assert container["CapabilityDrop"] == ["ALL"] and container["Init"] is True
    assert container["Command"] == ["python3", "-c", "x"]
    assert {"Name": "core", "Soft": 0, "Hard": 0} in container["Ulimits"]
    limits = service.task_template["Resources"]["Limits"]
    assert limits == {"NanoCPUs": int(spec.limits.cpus * 1e9), "MemoryBytes": 96 << 20, "Pids": 48}
    assert service.task_template["RestartPolicy"]["Condition"] == "none"
    assert service.task_template["Networks"] == [{"Target": "net1"}]
    mounts = {m["Target"]: m for m in container["Mounts"]}
    assert mounts["/tmp"]["TmpfsOptions"] == {"SizeBytes": 8 << 20, "Mode": 0o1777}
    # The outbox tmpfs becomes the run's results folder.
    assert mounts[spec.outbox] == {"Type": "bind", "Source": "/r", "Target": spec.outbox}
    assert service.name == f"orchestrator-{spec.run_id}"


def test_secrets_are_swarm_secrets_not_the_host_folder(spec):
    spec = replace(spec, mounts=[*spec.mounts, Mount("/dev/shm/x", SECRETS_DIR, True)])
    ref = render.SecretRef("id1", "orchestrator-run-api", "api")
    service = render.service_spec(spec, argv=None, network="n", secrets=[ref])
    container = service.task_template["ContainerSpec"]
    assert SECRETS_DIR not in {m["Target"] for m in container["Mounts"]}
    uid, gid = spec.user.split(":")
    assert container["Secrets"] == [
        {
            "SecretID": "id1",
            "SecretName": "orchestrator-run-api",
            "File": {"Name": "api", "UID": uid, "GID": gid, "Mode": 0o400},
        }
    ]
    assert "Command" not in container  # the image's own


def test_masks_stay_read_only_tmpfs(spec):
    spec = replace(spec, tmpfs=[*spec.tmpfs, Tmpfs.masking("/repo/.sandbox")])
    service = render.service_spec(spec, argv=None, network="n")
    mounts = {m["Target"]: m for m in service.task_template["ContainerSpec"]["Mounts"]}
    assert mounts["/repo/.sandbox"]["ReadOnly"] is True
    assert mounts["/repo/.sandbox"]["TmpfsOptions"]["Mode"] == 0o555
    assert mounts["/tmp"]["ReadOnly"] is False


def test_what_the_swarm_cannot_enforce_is_stated(spec):
    lines = " ".join(render.not_enforced(spec))
    assert "no-new-privileges" in lines and "seccomp" in lines and "swap" in lines
    assert "nosuid" in lines and "refused" in lines and "zone.setid_stripped" in lines


def test_gvisor_and_full_network_are_refused_with_their_way_out(spec):
    gvisor = render.refusal(replace(spec, isolation="gvisor"))
    assert gvisor is not None and f"isolation: {{{spec.trust}: runc}}" in gvisor
    allowlist = Network(mode="allowlist", allow=["example.org:443"])
    assert render.refusal(replace(spec, network=allowlist)) is None
    full = render.refusal(replace(spec, network=Network(mode="full", project="x")))
    assert full is not None and "network: full" in full
    assert render.refusal(spec) is None
