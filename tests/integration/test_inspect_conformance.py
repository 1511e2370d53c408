"""Inspect AI's own conformance checks for sandbox providers, over this project's provider,
under gVisor and runc.

The checks are Inspect's (``inspect_ai.util._sandbox.self_check``), imported as they are;
this module only gives them a ``sandbox_env``: one sandbox per runtime, opened through the
provider's ``sample_init`` and shared by the checks (each cleans up after itself), closed
through ``sample_cleanup`` and ``task_cleanup``. What it cannot pass is marked below, each
with its reason.
"""

from __future__ import annotations

import types

import anyio
import pytest
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from orchestrator.integrations.inspect import OrchestratorSandboxConfig
from orchestrator.integrations.inspect.provider import OrchestratorSandboxEnvironment
from tests.conftest import ProjectDir
from tests.integration.conftest import require_gvisor

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

#: Checks this provider fails on purpose, and why.
EXPECTED_FAILURES = {
    # Adds a user with adduser as root, then runs commands as root and as that user. A
    # worker never runs as root: its container has no capabilities, no-new-privileges and
    # a read-only /etc, so user="root" (or any user but the worker's own) raises
    # SandboxUserUnsupportedError instead (test_exec_as_nonexistent_user checks that).
    "test_exec_as_user": "workers never run as root or as another user",
}

#: The container has no `ps`; the timeout checks look for left-over processes with
#: `ps aux | grep MARKER`, which without `ps` would pass whatever is left. This one lists
#: every process's command line from /proc, so they check for real.
PS = """#!/bin/sh
for p in /proc/[0-9]*; do
  line=$(tr '\\0' ' ' < "$p/cmdline" 2>/dev/null) && [ -n "$line" ] && echo "${p#/proc/} $line"
done
"""
PATH = "/tmp/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module", params=["gvisor", "runc"])
def opened(request, engine, tmp_path_factory):
    """One sandbox under each runtime, through the provider's own lifecycle."""
    if request.param == "gvisor":
        require_gvisor(engine)
    project = ProjectDir(tmp_path_factory.mktemp("inspect") / "project")
    project.isolation = request.param
    project.write_project()
    config = OrchestratorSandboxConfig.model_validate(
        {
            "project": str(project.root),
            "env": {"PATH": PATH},
            # /tmp holds the 50 MiB files of the large-transfer checks
            "resources": {"memory": "768m", "tmp": "256m", "timeout": 120},
        }
    )
    provider = OrchestratorSandboxEnvironment

    async def start():
        await provider.task_init("startup", config)
        envs = await provider.sample_init("conformance", config, {})
        sandbox = envs["default"]
        await sandbox.write_file("/tmp/bin/ps", PS)
        assert (await sandbox.exec(["chmod", "+x", "/tmp/bin/ps"])).success
        return envs

    envs = anyio.run(start)
    try:
        yield envs["default"]
    finally:

        async def stop():
            await provider.sample_cleanup("conformance", config, envs, False)
            await provider.task_cleanup("shutdown", config, True)

        anyio.run(stop)


async def _brief_sleep(seconds: float) -> None:
    await anyio.sleep(min(seconds, GRACE_S))


#: The timeout checks wait 5 s for a provider's kill to land before they look for what is
#: left; this provider's timeout kills the group before exec returns (a second exec sends
#: the kill and is waited for), so they look after 1 s: 16 s less per run of the suite.
GRACE_S = 1.0


@pytest.fixture
def sandbox_env(request, opened, monkeypatch):
    reason = EXPECTED_FAILURES.get(request.node.originalname)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    monkeypatch.setattr(self_check, "anyio", types.SimpleNamespace(sleep=_brief_sleep))
    return opened


# -- this provider's own promises, beside Inspect's checks ---------------------------------


async def test_output_over_the_limit_raises_and_stops_the_command(opened):
    from inspect_ai.util import OutputLimitExceededError
    from inspect_ai.util._sandbox.limits import override_max_exec_output_size

    with override_max_exec_output_size(64 << 10), pytest.raises(OutputLimitExceededError) as info:
        await opened.exec(["sh", "-c", "echo started > /tmp/yes.pid; exec yes"], timeout=60)
    assert "64 KiB" in str(info.value)
    assert info.value.truncated_output.startswith("y\ny\n")
    left = await opened.exec(["sh", "-c", "ps aux | grep -w yes | grep -v grep"])
    assert left.stdout == ""


async def test_users_env_and_files_outside_what_the_worker_may_are_refused(opened):
    from inspect_ai.util import SandboxUserUnsupportedError

    own = (await opened.exec(["id", "-u"])).stdout.strip()
    assert (await opened.exec(["id", "-u"], user=own)).stdout.strip() == own
    with pytest.raises(SandboxUserUnsupportedError, match="never run as root"):
        await opened.exec(["id"], user="root")
    with pytest.raises(PermissionError, match="HOME is owned by the sandbox"):
        await opened.exec(["true"], env={"HOME": "/root"})
    with pytest.raises(PermissionError) as info:
        await opened.write_file("/etc/planted", "x")  # the root file system is read-only
    assert "/etc/planted" in str(info.value)
    # /var/tmp (Inspect's tools' place) is writable, and a command may run from there
    await opened.write_file("/var/tmp/hello.sh", "#!/bin/sh\necho from var tmp\n")
    done = await opened.exec(["sh", "-c", "chmod +x /var/tmp/hello.sh && /var/tmp/hello.sh"])
    assert done.stdout == "from var tmp\n"
    await opened.exec(["rm", "/var/tmp/hello.sh", "/tmp/yes.pid"])
