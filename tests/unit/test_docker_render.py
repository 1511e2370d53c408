"""The Docker adapter renders the engine-neutral plan: a spec in, Docker's exact config out.

Also: Docker's words for a command that cannot start become a typed ``StartFailure`` in the
adapter, so the runtime never reads engine messages.
"""

from __future__ import annotations

import pytest
import requests
from docker import errors as docker_errors
from docker.types import HostConfig

from orchestrator import labels
from orchestrator.docker import hostconfig, runtimes
from orchestrator.docker.engine import DockerEngine, DockerExec
from orchestrator.docker.netnames import full_network, network_name, run_network
from orchestrator.docker.seccomp import profile_text
from orchestrator.errors import EngineError, EngineUnreachable, StartFailure
from orchestrator.plan import (
    SECCOMP_PROFILE,
    WORKER_ULIMITS,
    ContainerSpec,
    Limits,
    Mount,
    Network,
    Tmpfs,
)

API_VERSION = "1.41"


def spec(**changes: object) -> ContainerSpec:
    fields: dict[str, object] = dict(
        image="orchestrator/worker",
        command=["python3", "-c", "print(1)"],
        uid=1000,
        gid=1001,
        workdir="/session",
        env={"A": "1"},
        mounts=[Mount("/host/data", "/data", read_only=True), Mount("/host/s", "/session", False)],
        tmpfs=[
            Tmpfs("/tmp", size=64 << 20),
            Tmpfs.masking("/repo/.sandbox"),
            Tmpfs("/staged", size=1 << 20, mode=0o700, uid=1000, gid=1001, noexec=True),
        ],
        limits=Limits(memory=512 << 20, cpus=1.5, pids=256, timeout_s=60.0),
        ulimits=list(WORKER_ULIMITS),
        labels={labels.RUN_ID: "r1"},
        run_id="r1",
        worker="w",
    )
    fields.update(changes)
    return ContainerSpec(**fields)  # type: ignore[arg-type]


def test_a_hardened_spec_renders_to_docker_s_exact_host_config():
    config = hostconfig.host_config(spec(), runtimes.RUNC)
    rendered = dict(HostConfig(version=API_VERSION, **config))
    assert rendered == {
        "Mounts": [
            {"Target": "/data", "Source": "/host/data", "Type": "bind", "ReadOnly": True},
            {"Target": "/session", "Source": "/host/s", "Type": "bind", "ReadOnly": False},
        ],
        "NetworkMode": "none",
        "Dns": ["0.0.0.0"],  # no resolver: no name lookup leaves the worker
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "SecurityOpt": [
            "no-new-privileges:true",
            f"seccomp={profile_text(SECCOMP_PROFILE)}",
        ],
        "Ulimits": [
            {"Name": "core", "Soft": 0, "Hard": 0},
            {"Name": "nofile", "Soft": 1024, "Hard": 4096},
        ],
        "PidsLimit": 256,
        "Memory": 512 << 20,
        "MemorySwap": 512 << 20,  # the memory limit again: no swap beyond it
        "NanoCpus": 1_500_000_000,
        "Tmpfs": {
            "/tmp": "rw,nosuid,nodev,exec,size=67108864,mode=1777",
            "/repo/.sandbox": "ro,nosuid,nodev,noexec,size=4096,mode=0555",
            "/staged": "rw,nosuid,nodev,noexec,size=1048576,mode=0700,uid=1000,gid=1001",
        },
        "Init": True,  # (Privileged false is the SDK's default: it sends nothing)
        "IpcMode": "private",
        "Runtime": "runc",
    }  # fmt: skip


def test_the_container_options_run_the_worker_or_a_keep_alive_process():
    assert hostconfig.container_config(spec()) == {
        "image": "orchestrator/worker",
        "entrypoint": None,
        "command": ["python3", "-c", "print(1)"],
        "user": "1000:1001",
        "environment": {"A": "1"},
        "working_dir": "/session",
        "network_disabled": True,
    }
    supervised = hostconfig.container_config(spec(supervisor_user="65533:65533"))
    assert (supervised["entrypoint"], supervised["command"]) == (["sleep"], ["infinity"])
    assert supervised["user"] == "65533:65533"


def test_network_modes_become_docker_network_names():
    allow = Network("allowlist", allow=["example.org:443"], services=["svc"])
    assert network_name(spec(network=allow)) == run_network("r1") == "orchestrator-run-r1"
    full = Network("full", project="0123456789ab")
    assert network_name(spec(network=full)) == full_network("0123456789ab")
    assert full_network("0123456789ab") == "orchestrator-full-0123456789ab"
    for network, disabled in [(allow, False), (full, False), (Network(), True)]:
        config = hostconfig.host_config(spec(network=network), runtimes.RUNC)
        assert config["network_mode"] == network_name(spec(network=network))
        assert hostconfig.container_config(spec(network=network))["network_disabled"] is disabled


def test_hardening_intent_maps_to_security_options_and_capabilities():
    assert hostconfig.security_options(spec()) == [
        "no-new-privileges:true",
        f"seccomp={SECCOMP_PROFILE}",
    ]
    loose = spec(no_new_privileges=False, seccomp=None, capabilities=["NET_BIND_SERVICE"])
    config = hostconfig.host_config(loose, runtimes.RUNC)
    assert config["security_opt"] == []  # the engine's own default profile
    assert (config["cap_drop"], config["cap_add"]) == (["ALL"], ["NET_BIND_SERVICE"])
    assert hostconfig.host_config(spec(), runtimes.RUNC)["cap_add"] is None


def test_under_gvisor_the_process_limit_moves_inside_and_the_runsc_profile_is_used():
    config = hostconfig.host_config(spec(isolation="gvisor"), runtimes.GVISOR_NONE)
    assert config["runtime"] == runtimes.GVISOR_NONE
    assert config["pids_limit"] == runtimes.host_pids_limit(runtimes.GVISOR_NONE, 256)
    assert (config["ulimits"][-1]["Name"], config["ulimits"][-1]["Soft"]) == ("nproc", 256)
    assert config["security_opt"][1] == f"seccomp={profile_text(SECCOMP_PROFILE, gvisor=True)}"


def api_error(status: int, explanation: str) -> docker_errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker_errors.APIError("boom", response=response, explanation=explanation)


class StartingAPI:
    """Just enough of docker.APIClient for ``start`` and ``exec_inspect``."""

    base_url = "http+docker://fake"

    def __init__(self, error: Exception | None = None, exit_code: int = 0) -> None:
        self.error = error
        self.exit_code = exit_code

    def version(self):
        return {"Version": "20.10.24", "Components": [{"Name": "Engine"}]}

    def start(self, container_id):
        if self.error is not None:
            raise self.error

    def exec_inspect(self, exec_id):
        return {"ExitCode": self.exit_code}


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ('OCI runtime create failed: exec: "nope": executable file not found in $PATH', 127),
        ("OCI runtime create failed: exec: /x: no such file or directory", 127),
        ("OCI runtime create failed: exec: /x: permission denied", 126),
        ("OCI runtime create failed: exec format error", 126),
    ],
)
def test_docker_s_words_for_a_command_that_cannot_start_become_a_start_failure(message, code):
    engine = DockerEngine(client=StartingAPI(api_error(400, message)))
    with pytest.raises(StartFailure) as failed:
        engine.start("c1")
    assert failed.value.code == code and message in str(failed.value)


def test_other_start_errors_stay_engine_errors():
    engine = DockerEngine(client=StartingAPI(api_error(400, "invalid mount config")))
    with pytest.raises(EngineError) as failed:
        engine.start("c1")
    assert not isinstance(failed.value, StartFailure)
    gone = requests.exceptions.ConnectionError(FileNotFoundError(2, "No such file or directory"))
    with pytest.raises(EngineUnreachable):  # "no such file" of the socket, not the command
        DockerEngine(client=StartingAPI(gone)).start("c1")


@pytest.mark.parametrize(
    ("first", "exit_code", "failure"),
    [
        (b'OCI runtime exec failed: exec: "nope": executable file not found in $PATH', 126, 127),
        (b"OCI runtime exec failed: exec: /w: permission denied: unknown", 126, 126),
        (b"OCI runtime exec failed: something else", 126, 126),
        (b"OCI runtime exec failed: printed by the worker itself", 0, None),
        (b"hello\n", 126, None),  # the worker's own exit code 126
        # Reported by the wrapper that sets an exec's nofile limit (docker/execlimits.py).
        (b'orchestrator exec failed: "nope": executable file not found in $PATH', 127, 127),
        (b'orchestrator exec failed: "/etc": permission denied', 126, 126),
    ],
)
def test_an_exec_that_could_not_start_raises_a_start_failure(first, exit_code, failure):
    engine = DockerEngine(client=StartingAPI(exit_code=exit_code))
    handle = DockerExec(engine, "e1", iter([("stdout", first), ("stderr", b"more\n")]))
    assert list(handle.frames) == [("stdout", first), ("stderr", b"more\n")]  # unchanged
    if failure is None:
        assert handle.exit_code() == exit_code
        return
    with pytest.raises(StartFailure) as failed:
        handle.exit_code()
    assert failed.value.code == failure
    assert str(failed.value) == first.decode()
