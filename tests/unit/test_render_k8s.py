"""plan --format k8s: every rendered document valid against the Kubernetes schemas (strict:
no unknown field), with the plan's hardening carried over and what cannot be said so."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from orchestrator.config import load_project, load_worker
from orchestrator.plan import Mount
from orchestrator.prepare import prepare
from orchestrator.render import k8s

K8S_VERSION = "1.33.0"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def rendered(project, name="w", volumes="pvc", **options):
    loaded = load_project(project.root)
    prepared = prepare(loaded, load_worker(loaded, name), **options)
    grant = prepared.grant
    zones = {zone.target: zone.name for zone in grant.zones}
    documents = k8s.render(prepared.spec, zones=zones, secrets=grant.secrets, volumes=volumes)
    for document in documents:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
        assert DNS_LABEL.match(document["metadata"]["name"])
        assert len(document["metadata"]["name"]) <= 63
        for value in document["metadata"]["labels"].values():
            assert len(value) <= 63 and LABEL_VALUE.match(value)
    # What the command line prints must read back as the same documents.
    assert list(yaml.safe_load_all(yaml.safe_dump_all(documents))) == documents
    return prepared.spec, {d["kind"]: d for d in documents}


def pod_of(job):
    return job["spec"]["template"]["spec"]


def mounts_of(job):
    return {m["mountPath"]: m for m in pod_of(job)["containers"][0]["volumeMounts"]}


def volumes_of(job):
    return {v["name"]: v for v in pod_of(job)["volumes"]}


def test_untrusted_none_gvisor_with_ro_and_rw_zones(project):
    project.zone("data", "ro")
    project.zone("out", "rw", extra="untrusted_output: true")
    project.worker(
        "w",
        'command: ["true"]\nsandbox: {zones: [{name: data}, {name: out, mode: rw}]}\n'
        "resources: {memory: 128m, cpus: 0.5, timeout: 90.5}\nnetwork: none",
    )
    spec, docs = rendered(project)
    assert set(docs) == {"NetworkPolicy", "PersistentVolumeClaim", "Job"}
    job = docs["Job"]
    pod = pod_of(job)
    container = pod["containers"][0]
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"
    uid, gid = spec.uid, spec.gid
    assert pod["securityContext"]["runAsUser"] == container["securityContext"]["runAsUser"] == uid
    assert pod["securityContext"]["runAsGroup"] == gid
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["resources"]["limits"] == {"memory": str(128 << 20), "cpu": "500m"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 91
    assert job["spec"]["ttlSecondsAfterFinished"] == k8s.TTL_AFTER_FINISHED
    mounts, volumes = mounts_of(job), volumes_of(job)
    assert mounts["/data"]["readOnly"] is True
    assert "readOnly" not in mounts["/out"]
    claim = volumes[mounts["/data"]["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == "orchestrator-zone-data"
    tmp = volumes[mounts["/tmp"]["name"]]["emptyDir"]
    assert tmp == {"medium": "Memory", "sizeLimit": str(spec.tmpfs_at("/tmp").size)}
    # The outbox outlives the pod: a claim of its own, named after the run.
    outbox = docs["PersistentVolumeClaim"]
    assert outbox["metadata"]["name"] == f"orchestrator-staged-{spec.run_id}"
    assert (
        volumes[mounts["/staged"]["name"]]["persistentVolumeClaim"]["claimName"]
        == (outbox["metadata"]["name"])
    )
    # none: the run's pods get no ingress and no egress at all.
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"io.orchestrator.run-id": spec.run_id}
    assert job["spec"]["template"]["metadata"]["labels"]["io.orchestrator.run-id"] == spec.run_id
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [] and policy["egress"] == []
    notes = job["metadata"]["annotations"]["io.orchestrator/not-carried-over"]
    assert "ulimits (core 0/0, nofile 1024/4096)" in notes
    for words in ("pids limit", "Localhost profile", "outbox and results"):
        assert words in notes


def test_allowlist_runc_egress_only_to_the_proxy_and_dns(project):
    project.isolation = "runc"
    project.write_project()
    project.worker("w", 'command: ["true"]\nnetwork: {allow: [api.example.org]}')
    _, docs = rendered(project)
    pod = pod_of(docs["Job"])
    assert "runtimeClassName" not in pod
    assert pod["containers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    egress = docs["NetworkPolicy"]["spec"]["egress"]
    assert egress[0] == {
        "to": [{"podSelector": {"matchLabels": {"io.orchestrator.role": "egress-proxy"}}}],
        "ports": [{"protocol": "TCP", "port": 3128}],
    }
    assert egress[1]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert egress[1]["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert len(egress) == 2  # nothing else: no ipBlock, no other pods
    assert docs["NetworkPolicy"]["spec"]["ingress"] == []
    assert "api.example.org" in docs["Job"]["metadata"]["annotations"]["io.orchestrator/network"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == "http://proxy:3128"
    assert (
        "DNS to the cluster resolver is open"
        in (docs["Job"]["metadata"]["annotations"]["io.orchestrator/not-carried-over"])
    )


def test_full_network_has_no_policy_and_says_so(project):
    project.extra = "untrusted_network: full\n"
    project.write_project()
    project.worker("w", 'command: ["true"]\nnetwork: full')
    _, docs = rendered(project)
    assert "NetworkPolicy" not in docs
    assert docs["Job"]["metadata"]["annotations"]["io.orchestrator/network"].startswith(
        "full: no NetworkPolicy"
    )


def test_secrets_are_a_secret_reference_never_values(project, monkeypatch):
    monkeypatch.setenv("TOKEN_A", "very-secret-value-a")
    project.extra = "credentials:\n  a: {source: env, env: TOKEN_A}\n"
    project.write_project()
    project.worker("w", 'command: ["true"]\ntrust: session\nsecrets: [a]')
    _, docs = rendered(project)
    job = docs["Job"]
    volume = volumes_of(job)[mounts_of(job)["/run/secrets"]["name"]]["secret"]
    assert volume["secretName"] == "orchestrator-secrets-w"
    assert volume["items"] == [{"key": "a", "path": "a"}]
    assert mounts_of(job)["/run/secrets"]["readOnly"] is True
    assert "very-secret-value-a" not in yaml.safe_dump_all(list(docs.values()))


def test_sessions_never_share_a_claim(project):
    project.worker("w", 'command: ["true"]\ntrust: session\nsandbox: {zones: []}')
    claims = set()
    for _ in range(2):
        _, docs = rendered(project)
        job = docs["Job"]
        volume = volumes_of(job)[mounts_of(job)["/session"]["name"]]
        claims.add(volume["persistentVolumeClaim"]["claimName"])
    assert len(claims) == 2
    assert all(claim.startswith("orchestrator-session-") for claim in claims)


def test_inputs_and_args(project, tmp_path):
    project.isolation = "runc"
    project.write_project()
    project.worker("w", "network: none")  # no command: the image's own
    given = tmp_path / "in.txt"
    given.write_text("x")
    spec, docs = rendered(
        project, inputs=[given], args=["--fast", "a b", "$(HOME)"], env={"PRICE": "$$5 $(X)"}
    )
    job = docs["Job"]
    container = pod_of(job)["containers"][0]
    # Kubernetes would expand $(HOME) and read $$ as $: every $ is doubled to stay literal.
    assert container["args"] == ["--fast", "a b", "$$(HOME)"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PRICE"] == "$$$$5 $$(X)"
    assert "command" not in container
    inputs = mounts_of(job)["/inputs"]
    assert inputs["readOnly"] is True
    assert volumes_of(job)[inputs["name"]]["persistentVolumeClaim"]["claimName"] == (
        f"orchestrator-inputs-{spec.run_id}"
    )
    notes = job["metadata"]["annotations"]["io.orchestrator/not-carried-over"]
    assert "replace the image's CMD" in notes
    assert "orchestrator-inputs-" in notes


def test_one_zone_mounted_twice_is_one_claim_with_a_read_only_subpath(project):
    project.zone("data", "rw", extra="untrusted_output: true")
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: data, mode: rw}]}')
    loaded = load_project(project.root)
    spec = prepare(loaded, load_worker(loaded, "w")).spec
    root = next(m for m in spec.mounts if m.target == "/data")
    guard = Mount(f"{root.source}/.git", "/data/.git", read_only=True)
    spec = dataclasses.replace(spec, mounts=[*spec.mounts, guard])
    zones = {"/data": "data", "/data/.git": "data"}
    documents = k8s.render(spec, zones=zones)
    job = documents[-1]
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    mounts = mounts_of(job)
    assert mounts["/data/.git"] == {
        "name": mounts["/data"]["name"],
        "mountPath": "/data/.git",
        "readOnly": True,
        "subPath": ".git",
    }
    hostpath = mounts_of(k8s.render(spec, zones=zones, volumes="hostpath")[-1])
    volumes = volumes_of(k8s.render(spec, zones=zones, volumes="hostpath")[-1])
    assert volumes[hostpath["/data/.git"]["name"]]["hostPath"] == {"path": guard.source}
    assert hostpath["/data/.git"]["readOnly"] is True


def test_hostpath_volumes_validate_and_are_read_only_per_mode(project):
    project.zone("data", "ro")
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: data}]}')
    spec, docs = rendered(project, volumes="hostpath")
    job = docs["Job"]
    data = mounts_of(job)["/data"]
    assert data["readOnly"] is True
    source = next(m.source for m in spec.mounts if m.target == "/data")
    assert volumes_of(job)[data["name"]]["hostPath"] == {"path": source}
    assert (
        "most clusters refuse hostPath"
        in (job["metadata"]["annotations"]["io.orchestrator/not-carried-over"])
    )


@pytest.mark.parametrize(
    "text", ["Worker_Name", "a" * 80, "-x-", "ünïcode name", "UPPER.dots.and/slash"]
)
def test_names_and_label_values_are_always_valid(text):
    name = k8s.dns_label(text)
    assert DNS_LABEL.match(name) and len(name) <= 63
    value = k8s.label_value(text)
    assert LABEL_VALUE.match(value) and len(value) <= 63
    assert k8s.dns_label(text + "!") != name  # a changed name carries a hash of the original


def orchestrator(*args):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_console_entry_prints_yaml_and_refuses_a_bad_format(project):
    project.zone("data", "ro")
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: data}]}')
    done = orchestrator("plan", "w", "--format", "k8s", "--project", project.root)
    assert done.returncode == 0, done.stderr
    documents = list(yaml.safe_load_all(done.stdout))
    assert [d["kind"] for d in documents] == ["NetworkPolicy", "PersistentVolumeClaim", "Job"]
    for document in documents:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    # A usage error is the orchestrator's own: 125 like every other (cli.main.main).
    bad = orchestrator("plan", "w", "--format", "helm", "--project", project.root)
    assert bad.returncode == 125
    assert "Invalid value for '--format'" in bad.stderr
    assert bad.stdout == ""
    both = orchestrator("plan", "w", "--json", "--format", "k8s", "--project", project.root)
    assert both.returncode == 125
    assert "--json and --format k8s" in both.stdout + both.stderr
    alone = orchestrator("plan", "w", "--k8s-volumes", "hostpath", "--project", project.root)
    assert alone.returncode == 125
    assert "--k8s-volumes goes with --format k8s" in alone.stderr
    # --format json is --json, failures included: one JSON object on stdout.
    missing = orchestrator("plan", "nobody", "--format", "json", "--project", project.root)
    assert missing.returncode == 125
    assert json.loads(missing.stdout)["exit_code"] == 125
    assert json.loads(
        orchestrator("plan", "w", "--format", "json", "--project", project.root).stdout
    )["image"]
