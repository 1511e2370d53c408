"""What the engine says about itself: versions, runtimes, security options, limits.

``orchestrator doctor`` judges these facts (:mod:`orchestrator.doctor.checks`); this module
only reads them, with two requests (``/version`` and ``/info``), and names them in our
terms so that nothing outside the adapter parses Docker's field names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from orchestrator.docker.client import DockerClient, api_version, engine_errors

#: Substrings of a runtime's name or path that mark it as gVisor.
_GVISOR_MARKS = ("runsc", "gvisor")


@dataclass(frozen=True)
class EngineFacts:
    """The engine's own account of itself, as read by :func:`engine_facts`."""

    version: str
    api_version: str
    """The newest API the engine speaks."""
    min_api_version: str
    client_api_version: str
    """The API version the orchestrator asks for (``DOCKER_API_VERSION``, default 1.41)."""
    os: str
    kernel: str
    runtimes: dict[str, str]
    """Runtime name -> the binary it runs (``runc``, ``runsc``, ...)."""
    default_runtime: str
    seccomp_profile: str | None
    """The engine's seccomp profile (``default``, ``builtin``, a path), None without seccomp."""
    rootless: bool
    userns_remap: bool
    cgroup_version: str
    cgroup_driver: str
    limits: dict[str, bool]
    """Which limits the kernel lets the engine enforce: memory, swap, cpu, pids."""
    docker_root: str
    storage_driver: str
    warnings: list[str] = field(default_factory=list)
    local: bool = True
    """The engine runs on this machine (a unix socket), so host facts are about it."""
    runtime_args: dict[str, list[str]] = field(default_factory=dict)
    """Runtime name -> the arguments the engine passes it (``runtimeArgs``)."""

    @property
    def gvisor_runtimes(self) -> list[str]:
        """Names of the runtimes that run containers under gVisor."""
        return sorted(
            name
            for name, path in self.runtimes.items()
            if any(mark in f"{name} {path}".lower() for mark in _GVISOR_MARKS)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "api_version": self.api_version,
            "min_api_version": self.min_api_version,
            "client_api_version": self.client_api_version,
            "os": self.os,
            "kernel": self.kernel,
            "runtimes": dict(self.runtimes),
            "default_runtime": self.default_runtime,
            "gvisor_runtimes": self.gvisor_runtimes,
            "seccomp_profile": self.seccomp_profile,
            "rootless": self.rootless,
            "userns_remap": self.userns_remap,
            "cgroup_version": self.cgroup_version,
            "cgroup_driver": self.cgroup_driver,
            "limits": dict(self.limits),
            "docker_root": self.docker_root,
            "storage_driver": self.storage_driver,
            "warnings": list(self.warnings),
            "local": self.local,
            "runtime_args": {name: list(args) for name, args in self.runtime_args.items()},
        }


def engine_facts(engine: DockerClient) -> EngineFacts:
    """Read the engine's facts (raises EngineUnreachable when no engine answers)."""
    with engine_errors("reading the engine's version"):
        version: dict[str, Any] = engine.api.version()
    with engine_errors("reading the engine's configuration"):
        info: dict[str, Any] = engine.api.info()
    options = _security_options(info.get("SecurityOptions") or [])
    runtimes = {
        str(name): str((spec or {}).get("path") or name)
        for name, spec in (info.get("Runtimes") or {}).items()
    }
    return EngineFacts(
        version=str(version.get("Version") or info.get("ServerVersion") or "?"),
        api_version=str(version.get("ApiVersion") or "?"),
        min_api_version=str(version.get("MinAPIVersion") or "?"),
        client_api_version=api_version(),
        os=str(info.get("OperatingSystem") or version.get("Os") or "?"),
        kernel=str(info.get("KernelVersion") or version.get("KernelVersion") or "?"),
        runtimes=runtimes,
        default_runtime=str(info.get("DefaultRuntime") or "runc"),
        seccomp_profile=options.get("seccomp", {}).get("profile", "default")
        if "seccomp" in options
        else None,
        rootless="rootless" in options,
        userns_remap="userns" in options,
        # Engines before API 1.40 do not report it; they only knew cgroup v1.
        cgroup_version=str(info.get("CgroupVersion") or "1"),
        cgroup_driver=str(info.get("CgroupDriver") or "?"),
        limits={
            "memory": bool(info.get("MemoryLimit")),
            "swap": bool(info.get("SwapLimit")),
            "cpu": bool(info.get("CpuCfsQuota")) and bool(info.get("CpuCfsPeriod")),
            "pids": bool(info.get("PidsLimit")),
        },
        docker_root=str(info.get("DockerRootDir") or ""),
        storage_driver=str(info.get("Driver") or ""),
        warnings=[str(w) for w in info.get("Warnings") or []],
        local=_engine_is_local(engine),
        runtime_args={
            str(name): [str(arg) for arg in (spec or {}).get("runtimeArgs") or []]
            for name, spec in (info.get("Runtimes") or {}).items()
            if isinstance(spec, dict)
        },
    )


def _security_options(entries: list[str]) -> dict[str, dict[str, str]]:
    """``["name=seccomp,profile=default", "name=rootless"]`` -> {seccomp: {profile: ...}}."""
    parsed: dict[str, dict[str, str]] = {}
    for entry in entries:
        pairs = dict(part.partition("=")[::2] for part in str(entry).split(","))
        name = pairs.pop("name", "")
        if name:
            parsed[name] = pairs
    return parsed


def _engine_is_local(engine: DockerClient) -> bool:
    """True for a unix socket (the SDK names it ``http+docker://localhost``)."""
    base = str(getattr(engine.api, "base_url", "") or "")
    host = os.environ.get("DOCKER_HOST", "")
    return base.startswith("http+docker://") and (not host or host.startswith("unix://"))


def images_present(engine: DockerClient, images: list[str]) -> dict[str, bool]:
    """Whether each image exists locally (one inspect each)."""
    return {image: engine.image_exists(image) for image in images}
