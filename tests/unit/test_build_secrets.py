"""Build secrets without an engine: the declaration a secret mount needs, the file a step
is given (in memory, its mode and owner, gone after), the cache key's part, and the
doctor's verdict on the build runtimes."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from orchestrator.build.bases import BaseImages
from orchestrator.build.builder import Builder
from orchestrator.build.context import Context
from orchestrator.build.dockerfile import BuildRefused, SecretMount, parse
from orchestrator.build.engine import StepLimits
from orchestrator.build.secrets import SHM, BuildSecrets, delivered, key_part
from orchestrator.docker.runtimes import BUILD_RUNTIMES, GVISOR_ARGS
from orchestrator.doctor import checks
from tests.unit.test_doctor import facts

VALUE = "s3cr3t-build-value-0123456789"


class _Engine:
    """Only what a build does before its first step: look its images up."""

    def image(self, ref: str) -> tuple[str, dict[str, Any]]:
        return "sha256:" + hashlib.sha256(ref.encode()).hexdigest(), {}

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused build called the engine's {name}")


class _Audit:
    def __init__(self) -> None:
        self.entries: list[tuple[str, dict[str, Any]]] = []

    def record(self, event: str, **fields: Any) -> None:
        self.entries.append((event, fields))


def _builder(tmp_path: Path, text: str, secrets: BuildSecrets) -> tuple[Builder, _Audit]:
    (tmp_path / "Dockerfile").write_text(text)
    audit = _Audit()
    limits = StepLimits(memory=1 << 30, cpus=1.0, pids=100, timeout_s=60.0, disk=1 << 30)
    parsed = parse(tmp_path / "Dockerfile", text)
    builder = Builder(_Engine(), audit, Context.open(tmp_path), parsed, limits, secrets=secrets,  # type: ignore[arg-type]
                      images=BaseImages(("base",)), cache_key=b"k" * 32)  # fmt: skip
    return builder, audit


def test_a_secret_the_project_does_not_declare_is_refused_before_any_step(tmp_path):
    read: list[str] = []

    def reader() -> str:
        read.append("token")
        return VALUE

    secrets = BuildSecrets({"token": reader}, "/p/orchestrator.yaml")
    text = "FROM base\nRUN --mount=type=secret,id=token true\nRUN --mount=type=secret,id=npm true\n"
    builder, audit = _builder(tmp_path, text, secrets)
    with pytest.raises(BuildRefused) as refused:
        builder.build(None, None)
    assert str(refused.value) == (
        f"{tmp_path}/Dockerfile:3: RUN: --mount=type=secret,id=npm: the project does not "
        "declare 'npm' for builds; add it to build.secrets in /p/orchestrator.yaml (one of "
        "its credentials)"
    )
    assert read == []  # no value is read for a build that never starts
    ended = [fields for event, fields in audit.entries if event == "build.ended"]
    assert ended and ended[0]["allowed"] is False


def test_a_delivered_secret_is_a_private_file_in_memory_gone_after_the_step():
    mount = SecretMount(id="token", target="/run/secrets/token", required=True, uid=1000, gid=100)
    other = SecretMount(id="key", target="/k", required=False, mode=0o440)
    with delivered("unit" + os.urandom(4).hex(), [(mount, "/run/secrets/token", VALUE),
                                                 (other, "/k", VALUE)]) as files:  # fmt: skip
        first, second = files
        assert (first.target, second.target) == ("/run/secrets/token", "/k")
        path = Path(first.source)
        assert path.parent.parent == SHM and path.read_text() == VALUE
        info = path.lstat()
        owner = (1000, 100) if os.getuid() == 0 else (os.getuid(), os.getgid())
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o400, *owner)
        folder = path.parent.lstat()  # the orchestrator's: nobody else may swap the file
        assert (stat.S_IMODE(folder.st_mode), folder.st_uid) == (0o700, os.getuid())
        assert stat.S_IMODE(Path(second.source).lstat().st_mode) == 0o440
        assert "token" not in first.source  # the name stays off the host's paths
    assert not path.parent.exists() and not Path(second.source).parent.exists()


def test_the_cache_key_holds_a_digest_of_the_name_never_the_value():
    mount = SecretMount(id="token", target="/run/secrets/token", required=False)
    part = key_part(mount, "/run/secrets/token")
    assert hashlib.sha256(b"token").hexdigest() in part
    assert "token:" not in part.replace("/run/secrets/token", "")


WANTED = {name: GVISOR_ARGS[name] for name in BUILD_RUNTIMES}


def test_the_doctor_checks_the_build_runtimes_and_their_flags():
    registered = facts(
        runtimes={"runc": "runc", **{name: "/usr/bin/runsc" for name in BUILD_RUNTIMES}},
        runtime_args={name: list(args) for name, args in WANTED.items()},
    )
    check = checks.build_runtimes_check(registered, wanted=WANTED, needed=True, setup="FIX")
    assert check.status == "pass" and "--overlay2=none" in check.detail

    missing = facts(runtimes={"runc": "runc", "orchestrator-runsc-build": "/usr/bin/runsc"},
                    runtime_args={"orchestrator-runsc-build": ["--network=none"]})  # fmt: skip
    check = checks.build_runtimes_check(missing, wanted=WANTED, needed=True, setup="FIX")
    assert check.status == "fail" and check.fix == "FIX"
    assert check.detail.startswith(
        "orchestrator-runsc-build runs without --oci-seccomp --overlay2=none; "
        "orchestrator-runsc-build-net not registered: `orchestrator build`"
    )
    assert checks.build_runtimes_check(missing, wanted=WANTED, needed=False,
                                       setup="FIX").status == "warn"  # fmt: skip
