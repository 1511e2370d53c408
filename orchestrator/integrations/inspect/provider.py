"""The ``orchestrator`` sandbox environment for Inspect AI (the only module importing it).

Loaded by Inspect through the ``inspect_ai`` entry point; see docs/inspect.md. Each sample
gets one session per environment of its config (:mod:`.sandboxes`): the same hardened
container a run of the worker gets, idling. Commands run by exec as the worker's uid;
files move by exec too (:mod:`orchestrator.integrations.transfer`), so the model's tools
and the harness see the same container. Inspect's contract, as its conformance checks state it:

- output over ``INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE`` (10 MiB) on a stream of a command,
  or a file over ``INSPECT_SANDBOX_MAX_READ_FILE_SIZE`` (100 MiB) read, raises
  ``OutputLimitExceededError``; the command is killed at that point;
- a timeout kills the command's whole process group and raises ``TimeoutError``;
- relative paths and ``cwd`` resolve against the worker's working folder;
- ``user`` other than the worker's own raises ``SandboxUserUnsupportedError``: a worker
  never runs as root, and no capability to switch users exists in its container; a
  sandbox with ``image_user`` (gVisor only) runs commands as the image's user, or as
  the ``user`` given (root included);
- the orchestrator's refusals (an environment variable it owns, say) raise
  ``PermissionError``, which Inspect's tools show the model.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any, Literal, overload

import anyio
import anyio.to_thread
from inspect_ai._util.error import PrerequisiteError
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel

from orchestrator import labels
from orchestrator.errors import ConfigError, ContainerStopped, OrchestratorError, PolicyError
from orchestrator.integrations import transfer
from orchestrator.integrations.inspect import sandboxes
from orchestrator.integrations.inspect.config import (
    PROVIDER,
    SETTINGS_FILE,
    OrchestratorSandboxConfig,
    Settings,
    resolve,
)
from orchestrator.integrations.transfer import Capture, TooMuch
from orchestrator.runtime.session import SessionClosed

log = logging.getLogger(__name__)

__all__ = ["OrchestratorSandboxEnvironment"]

#: How long one file transfer may take (seconds), as Inspect's own Docker provider allows.
FILE_TIMEOUT = 600
#: The largest file ``write_file`` takes (its bytes are held in memory on both sides).
MAX_WRITE = 1 << 30
#: Bytes of a transfer's stderr kept (its messages, never its content).
STDERR_CAP = 64 << 10
#: Seconds between polls of Inspect's tool helper (Inspect's default is 2, Docker's 0.2).
POLL_S = 0.5
#: Exit status of the exec wrapper when the command cannot be executed.
CANNOT_EXECUTE = 126

_settings: dict[Any, dict[str, Settings]] = {}


def _settings_of(config: SandboxEnvironmentConfigType | None, *, start: bool = False) -> Settings:
    """The resolved settings of ``config``. Inspect starts each task in the task's folder,
    where relative paths in its config belong, but runs samples wherever it was started:
    a sample reuses what its task's start resolved."""
    if config is not None and not isinstance(config, str | OrchestratorSandboxConfig):
        raise TypeError(
            f"the '{PROVIDER}' sandbox's config must be an OrchestratorSandboxConfig or a "
            f"path, not {type(config).__name__}"
        )
    cwd = os.getcwd()
    known = _settings.setdefault(config, {})
    if cwd in known:
        return known[cwd]
    if len(known) == 1 and not start:
        return next(iter(known.values()))
    if known and not start:
        raise ConfigError(
            [
                f"the '{PROVIDER}' sandbox config {config!r} means different things in the "
                f"folders of different tasks ({', '.join(sorted(known))}); give it with "
                "absolute paths"
            ]
        )
    known[cwd] = resolve(config, Path(cwd))
    return known[cwd]


@sandboxenv(name=PROVIDER)
class OrchestratorSandboxEnvironment(SandboxEnvironment):
    """One live session of the orchestrator, as an Inspect sandbox."""

    def __init__(self, opened: sandboxes.Opened) -> None:
        super().__init__()
        self.opened = opened
        self.session = opened.session
        self._own_names: set[str] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def default_polling_interval(self) -> float:
        """How often Inspect's tools poll their helper (seconds); every poll is an exec
        (and an audit entry), so not as often as Docker's provider does."""
        return POLL_S

    @classmethod
    def config_files(cls) -> list[str]:
        return [SETTINGS_FILE]

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        # A mapping comes from data (a dataset's sample, an eval log): held to the rules
        # of a config file, only files inside the task's folder.
        return OrchestratorSandboxConfig.from_data(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        try:
            settings = _settings_of(config, start=True)
            await anyio.to_thread.run_sync(sandboxes.start_pools, settings)
        except ConfigError as exc:  # a declaration's problems: said in lines, no traceback
            raise PrerequisiteError(f"orchestrator: {exc}") from None

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        settings = _settings_of(config)
        opened = await anyio.to_thread.run_sync(sandboxes.open_sample, settings)
        return {item.name: cls(item) for item in opened}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            if isinstance(environment, OrchestratorSandboxEnvironment):
                await anyio.to_thread.run_sync(sandboxes.close, environment.opened)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        settings = _settings_of(config)
        kept = await anyio.to_thread.run_sync(
            partial(sandboxes.close_task, settings, cleanup=cleanup)
        )
        if kept:
            root = settings.project.root
            print(f"orchestrator: kept {len(kept)} sandbox(es) (no sandbox cleanup):")
            for item in kept:
                print(
                    f"  {item.name}: session {item.session.id}, run {item.session.run_id}, "
                    f"worker {item.session.worker}"
                )
            print(
                "  look into one: docker exec -it $(docker ps -q --filter "
                f"label={labels.SESSION}=SESSION) sh"
            )
            print(
                "  they stay until this process has ended and then "
                f"`inspect sandbox cleanup {PROVIDER} {root}` (or `orchestrator gc --project "
                f"{root}`) removes them"
            )

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup orchestrator [PROJECT]``: the project's own gc (what
        processes that have ended left: containers, networks, run folders); ``id`` is the
        project folder (default: the current one)."""
        project = id or "."
        command = [sys.executable, "-m", "orchestrator", "gc", "--project", project]
        done = await anyio.to_thread.run_sync(
            partial(subprocess.run, command, check=False, text=True, capture_output=True)
        )
        for line in (done.stdout + done.stderr).splitlines():
            print(line)
        if done.returncode != 0:
            raise RuntimeError(f"orchestrator gc --project {project} exited {done.returncode}")

    # -- commands ---------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        await self._check_user(user)
        capture = Capture(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
                           SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)  # fmt: skip
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR
        who = user if self.opened.image_user else None  # as the image's user: whom it names
        code = await self._run(cmd, capture, input=input, cwd=cwd, env=env, timeout=timeout,
                               limit=limit, user=who)  # fmt: skip
        stderr = capture.text("stderr")
        if code == CANNOT_EXECUTE and stderr.startswith(f"sh: 1: exec: {cmd[0]}: Permission"):
            raise PermissionError(errno.EACCES, "Permission denied (not executable)", cmd[0])
        return ExecResult(
            success=code == 0, returncode=code, stdout=capture.text("stdout"), stderr=stderr
        )

    async def _run(
        self,
        argv: list[str],
        capture: Capture,
        *,
        limit: str,
        partial_output: bool = True,
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        user: str | None = None,
    ) -> int:
        """Run ``argv`` in the session, its output into ``capture``; its exit code."""
        workdir = self.opened.workdir if cwd is None else posixpath.join(self.opened.workdir, cwd)
        call = partial(
            self.session.exec,
            list(argv),
            cwd=workdir,
            env=env,
            timeout=timeout,
            stdin=input,
            on_output=capture.add,
            user=user,
        )
        try:
            result = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except TooMuch as exc:
            shown = capture.text(exc.stream) if partial_output else None
            raise OutputLimitExceededError(limit, truncated_output=shown) from None
        except PolicyError as exc:
            raise PermissionError(errno.EACCES, str(exc)) from None
        except (SessionClosed, ContainerStopped) as exc:
            raise SandboxUnavailableError(str(exc)) from None
        except OrchestratorError as exc:
            raise RuntimeError(str(exc)) from None
        if result.timed_out:
            error = TimeoutError(f"Command timed out after {result.duration_s:g} seconds")
            error.truncated_output = capture.text("stdout") + capture.text("stderr")  # type: ignore[attr-defined]
            raise error
        return result.exit_code

    async def _check_user(self, user: str | None) -> None:
        opened = self.opened
        if user is None or opened.image_user:  # the image's users, root among them
            return
        if user in (str(opened.uid), f"{opened.uid}:{opened.gid}"):
            return
        if self._own_names is None:
            capture = Capture(4096, 4096)
            code = await self._run(["id", "-un"], capture, limit="4 KiB", timeout=30)
            name = capture.text("stdout").strip() if code == 0 else ""
            self._own_names = {name} if name else set()
        if user not in self._own_names:
            raise SandboxUserUnsupportedError(
                f"the sandbox runs commands only as its worker's own user (uid {opened.uid}); "
                f"'{user}' is refused: workers never run as root or switch users"
            )

    # -- files ------------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        if len(data) > MAX_WRITE:
            raise OSError(errno.EFBIG, f"larger than the {MAX_WRITE >> 20} MiB a write takes", file)
        capture = Capture(STDERR_CAP, STDERR_CAP)
        code = await self._run(
            ["/bin/sh", "-c", transfer.WRITE, "write_file", file],
            capture,
            input=data,
            timeout=FILE_TIMEOUT,
            limit="64 KiB",
        )
        if code != 0:
            raise transfer.failure(file, capture.text("stderr"), "write_file")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        capture = Capture(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE, STDERR_CAP)
        code = await self._run(
            ["/bin/sh", "-c", transfer.READ, "read_file", file],
            capture,
            timeout=FILE_TIMEOUT,
            limit=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
            partial_output=False,  # possibly large, possibly binary
        )
        if code != 0:
            raise transfer.failure(file, capture.text("stderr"), "read_file")
        data = bytes(capture.data["stdout"])
        return data.decode("utf-8") if text else data
