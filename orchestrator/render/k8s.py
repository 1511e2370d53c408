"""A plan as Kubernetes objects: a Job, its NetworkPolicy and its outbox claim.

Pure data (plain dicts, no client, no cluster). The Job carries what the plan's hardening
can carry (non-root, read-only root, no privilege escalation, no capabilities, seccomp,
limits, the gVisor RuntimeClass), and says in the ``io.orchestrator/not-carried-over``
annotation what it cannot, so that a reader of the YAML never assumes a protection the
cluster does not give (docs/scale-out.md).
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from orchestrator.egress import PROXY_PORT
from orchestrator.plan import BROKER_DIR, INPUTS_DIR, SECRETS_DIR, ContainerSpec, Tmpfs

VolumeMode = Literal["pvc", "hostpath"]
VOLUME_MODES: tuple[VolumeMode, ...] = ("pvc", "hostpath")

ANNOTATION = "io.orchestrator"
#: The RuntimeClass the cluster must define for gVisor (handler ``runsc``).
GVISOR_RUNTIME_CLASS = "gvisor"
#: The label an egress proxy's pods must carry to be reachable from an allowlisted run.
PROXY_LABEL = ("io.orchestrator.role", "egress-proxy")
#: A finished Job (and its pod) is deleted after an hour; the outbox claim stays.
TTL_AFTER_FINISHED = 3600
ZONE_CLAIM_PREFIX = "orchestrator-zone-"
#: Standard zones with one folder per session or workspace: one claim each, named after
#: that folder, so that sessions (and workspaces) never share a claim.
PER_FOLDER_ZONES = frozenset({"session", "workspace"})
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as an RFC 1123 label (lower case, ``-``, at most ``limit``); a changed or cut
    name ends in a short hash of the original, so two names never collapse into one."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"
    if name == text and len(name) <= limit:
        return name
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 characters, alphanumeric at both ends)."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{cleaned[:54].rstrip('-_.')}-{digest}".lstrip("-")


def _labels(spec: ContainerSpec) -> dict[str, str]:
    labels = {"app.kubernetes.io/managed-by": "orchestrator"}
    for key, value in spec.labels.items():
        if len(key) <= 63 and _LABEL_NAME.match(key):
            labels[key] = label_value(value)
    return labels


def literal(text: str) -> str:
    """``text`` as Kubernetes passes it on: it expands ``$(NAME)`` in env values, command
    and args, and reads ``$$`` as ``$``; doubling every ``$`` keeps the plan's bytes."""
    return text.replace("$", "$$")


class _Volumes:
    """The pod's volumes and the container's mounts, built mount by mount."""

    def __init__(self, mode: VolumeMode, zones: Mapping[str, str]) -> None:
        self.mode = mode
        self.zones = zones
        self.volumes: list[dict[str, Any]] = []
        self.mounts: list[dict[str, Any]] = []
        self._roots: dict[str, tuple[str, str]] = {}  # zone -> (volume, host root)

    def add(self, volume: dict[str, Any], target: str, read_only: bool, sub: str = "") -> None:
        if all(v["name"] != volume["name"] for v in self.volumes):
            self.volumes.append(volume)
        mount: dict[str, Any] = {"name": volume["name"], "mountPath": target}
        if read_only:
            mount["readOnly"] = True
        if sub:
            mount["subPath"] = sub
        self.mounts.append(mount)

    def zone(self, name: str, source: str, target: str, read_only: bool) -> None:
        index = len(self.mounts)
        if self.mode == "hostpath":
            volume = {
                "name": dns_label(f"zone-{name}-{index}"),
                "hostPath": {"path": source},
            }
            self.add(volume, target, read_only)
            return
        root = self._roots.get(name)
        if root is not None and (source + "/").startswith(root[1].rstrip("/") + "/"):
            # The zone's own folder again (its .git, a policy file): the same claim, a subPath.
            sub = posixpath.relpath(source, root[1])
            self.add({"name": root[0]}, target, read_only, "" if sub == "." else sub)
            return
        if root is not None:
            claim = dns_label(f"{ZONE_CLAIM_PREFIX}{name}-{target}", 253)
        elif name in PER_FOLDER_ZONES:
            claim = dns_label(f"orchestrator-{name}-{posixpath.basename(source)}", 253)
        else:
            claim = dns_label(ZONE_CLAIM_PREFIX + name, 253)
        volume_name = dns_label(f"zone-{name}" if root is None else f"zone-{name}-{index}")
        if root is None:
            self._roots[name] = (volume_name, source)
        volume = {
            "name": volume_name,
            # The claim itself is read-write; each mount says readOnly per the zone's mode.
            "persistentVolumeClaim": {"claimName": claim},
        }
        self.add(volume, target, read_only)

    def tmpfs(self, tmpfs: Tmpfs) -> None:
        name = dns_label(f"tmp{tmpfs.target.replace('/', '-')}")
        volume = {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": str(tmpfs.size)}}
        self.add(volume, tmpfs.target, tmpfs.mask)


def render(
    spec: ContainerSpec,
    *,
    zones: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
    volumes: VolumeMode = "pvc",
) -> list[dict[str, Any]]:
    """The plan as Kubernetes documents: a NetworkPolicy (``none`` and allowlists), the
    outbox's PersistentVolumeClaim (when the worker has one), then the Job.

    ``zones`` maps each zone mount's container path to its zone's name (the plan's mounts
    name only host folders); ``secrets``: the credential names the run gets, as keys of a
    Secret the cluster user creates (values never appear here); ``volumes``: zones as
    claims named ``orchestrator-zone-NAME`` (``pvc``) or as the plan's own host folders
    (``hostpath``, for a one-node cluster on this machine).
    """
    zones = zones or {}
    name = dns_label(f"orchestrator-{spec.worker}-{spec.run_id}")
    labels = _labels(spec)
    run_selector = {k: v for k, v in labels.items() if k.endswith(".run-id")}
    notes = _not_carried_over(spec, volumes)
    built = _Volumes(volumes, zones)
    documents: list[dict[str, Any]] = []

    for mount in spec.mounts:
        if mount.target == BROKER_DIR:
            continue  # children are not supported on a cluster (in the notes)
        if mount.target == SECRETS_DIR:
            secret = {
                "name": "secrets",
                "secret": {
                    "secretName": dns_label(f"orchestrator-secrets-{spec.worker}", 253),
                    "items": [{"key": key, "path": key} for key in secrets],
                    "defaultMode": 0o440,
                },
            }
            built.add(secret, SECRETS_DIR, True)
        elif mount.target == INPUTS_DIR:
            claim = dns_label(f"orchestrator-inputs-{spec.run_id}", 253)
            built.add(
                {"name": "inputs", "persistentVolumeClaim": {"claimName": claim}}, INPUTS_DIR, True
            )
        else:
            zone = zones.get(mount.target, mount.target.strip("/").split("/")[0] or "root")
            built.zone(zone, mount.source, mount.target, mount.read_only)
    for tmpfs in spec.tmpfs:
        if tmpfs.target == spec.outbox:
            claim = dns_label(f"orchestrator-staged-{spec.run_id}", 253)
            documents.append(_outbox_claim(claim, labels, tmpfs.size))
            built.add(
                {"name": "staged", "persistentVolumeClaim": {"claimName": claim}},
                tmpfs.target,
                False,
            )
        else:
            built.tmpfs(tmpfs)

    policy = _network_policy(name, spec, labels, run_selector)
    if policy is not None:
        documents.insert(0, policy)
    documents.append(_job(name, spec, labels, notes, built))
    return documents


def _job(
    name: str, spec: ContainerSpec, labels: dict[str, str], notes: list[str], built: _Volumes
) -> dict[str, Any]:
    uid, gid = spec.uid, spec.gid
    env = {k: v for k, v in spec.env.items() if k != "ORCHESTRATOR_BROKER"}
    memory = str(spec.limits.memory)
    cpu = f"{max(1, round(spec.limits.cpus * 1000))}m"
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": spec.workdir,
        "env": [{"name": key, "value": literal(value)} for key, value in sorted(env.items())],
        "resources": {
            "limits": {"memory": memory, "cpu": cpu},
            "requests": {"memory": memory, "cpu": cpu},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "readOnlyRootFilesystem": spec.read_only_rootfs,
            "allowPrivilegeEscalation": not spec.no_new_privileges,
            "privileged": False,
            "capabilities": _capabilities(spec),
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": built.mounts,
    }
    if spec.command:
        container["command"] = [literal(word) for word in spec.command]
    if spec.args:
        container["args"] = [literal(word) for word in spec.args]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # No API token and no service variables: the worker gets nothing of the cluster's.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            # Claims the worker writes (the outbox, rw zones) must be its group's; only
            # when their root is not already, so a zone's files are not all re-owned.
            "fsGroup": gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": built.volumes,
    }
    if spec.isolation == "gvisor":
        pod["runtimeClassName"] = GVISOR_RUNTIME_CLASS
    annotations = {
        f"{ANNOTATION}/isolation": spec.isolation,
        f"{ANNOTATION}/network": _network_note(spec),
        f"{ANNOTATION}/not-carried-over": "\n".join(notes),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": dict(labels), "annotations": annotations},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, math.ceil(spec.limits.timeout_s)),
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def _outbox_claim(claim: str, labels: dict[str, str], size: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim,
            "labels": dict(labels),
            "annotations": {
                f"{ANNOTATION}/note": "the run's outbox (/staged): its size is a request, "
                "enforced only as far as the storage class enforces it; collect it and "
                "delete the claim (docs/scale-out.md)"
            },
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": str(max(size, 1 << 20))}},
        },
    }


def _capabilities(spec: ContainerSpec) -> dict[str, list[str]]:
    kept = {"drop": ["ALL"]}
    if spec.capabilities:
        kept["add"] = list(spec.capabilities)
    return kept


def _network_note(spec: ContainerSpec) -> str:
    if spec.network.mode == "allowlist":
        return (
            "allowlist: egress only to pods labelled "
            f"{PROXY_LABEL[0]}={PROXY_LABEL[1]} on TCP {PROXY_PORT}, and DNS; the proxy must "
            f"enforce: {', '.join(spec.network.allow) or '(nothing)'}"
        )
    if spec.network.mode == "none":
        return "none: a NetworkPolicy denies all ingress and egress"
    return "full: no NetworkPolicy; the pod has the cluster's default network access"


def _network_policy(
    name: str, spec: ContainerSpec, labels: dict[str, str], selector: dict[str, str]
) -> dict[str, Any] | None:
    if spec.network.mode == "full":
        return None
    policy_spec: dict[str, Any] = {
        "podSelector": {"matchLabels": selector},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }
    if spec.network.mode == "allowlist":
        policy_spec["egress"] = [
            {
                "to": [{"podSelector": {"matchLabels": dict([PROXY_LABEL])}}],
                "ports": [{"protocol": "TCP", "port": PROXY_PORT}],
            },
            {
                # The worker finds its proxy by the name "proxy": a Service in the namespace.
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                        },
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            },
        ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "labels": dict(labels),
            "annotations": {f"{ANNOTATION}/network": _network_note(spec)},
        },
        "spec": policy_spec,
    }


def _not_carried_over(spec: ContainerSpec, volumes: VolumeMode) -> list[str]:
    """What the plan has and this Job does not, one line each (also in docs/scale-out.md)."""
    notes = [
        f"pids limit {spec.limits.pids}: no per-pod field; only the kubelet's podPidsLimit "
        "(node-wide) applies",
        f"ulimits ({', '.join(f'{u.name} {u.soft}/{u.hard}' for u in spec.ulimits) or 'none'}):"
        " no Kubernetes field; the runtime's defaults apply",
        "swap: the pod's memory limit does not cover swap; nodes must run without swap "
        "(or LimitedSwap off for this pod's QoS)",
        "outbox and results: not collected; copy the outbox claim out and review it before "
        "anything reaches the repo",
        "NetworkPolicy: enforced only by a network plugin that implements it",
    ]
    if spec.seccomp is not None:
        notes.insert(
            1,
            f"seccomp: RuntimeDefault, not the plan's profile {spec.seccomp} (io_uring "
            "blocked); that needs a Localhost profile installed on every node",
        )
    if spec.init:
        notes.append("init: no init process; the worker is PID 1 and must reap its own children")
    if spec.network.mode == "allowlist":
        notes.append(
            "allowlist: the egress proxy and its Service 'proxy' are not rendered; DNS to "
            "the cluster resolver is open (a channel out by query names)"
        )
    if volumes == "hostpath":
        notes.append("hostPath zones: the node's folders; most clusters refuse hostPath")
    else:
        notes.append(
            f"zones: claims named {ZONE_CLAIM_PREFIX}NAME (orchestrator-session-ID, "
            "orchestrator-workspace-NAME) must exist and hold the zone's files"
        )
    if any(m.target == BROKER_DIR for m in spec.mounts):
        notes.append("children (orchestrator-call): no broker on a cluster; not rendered")
    if spec.inputs:
        notes.append(f"inputs: the claim orchestrator-inputs-{spec.run_id} must hold them")
    if spec.args and not spec.command:
        notes.append(
            "args without a command replace the image's CMD (Kubernetes), not append to it"
        )
    if spec.supervisor_user:
        notes.append("the worker runs as the pod's process, not by exec under a supervisor")
    return notes
