"""The ``orchestrator`` environment for Harbor (the only module importing it).

``harbor run --env orchestrator.integrations.harbor.environment:OrchestratorEnvironment
--ek project=PROJECT``: each trial's environment is one session of the project (see
docs/harbor.md), a worker described from the task (:mod:`.mapping`): its image, network
policy, mounts as zones, CPUs and memory. Commands run by exec as the worker's uid; files
and folders move by exec too (:mod:`orchestrator.integrations.transfer`), so Harbor sees
the container as its commands do. What Harbor asks of a provider, as this one meets it:

- the network policy is enforced exactly as far as it goes, or the task is refused before
  start; it cannot change after start (``dynamic_network_policy`` is false);
- ``/logs``, ``/tests`` and ``/solution`` are writable tmpfs folders of the run, owned by
  the worker (the root filesystem is read-only), as is the task's working folder when it
  is not ``/tmp``;
- uploads never follow a link in the task's folder (:mod:`orchestrator.integrations.upload`):
  a link on the way, or as the file uploaded, is refused naming it; one inside an uploaded
  folder arrives as the link itself;
- under gVisor the task runs as it was written (``image_user``, the default there; the
  option ``image_user=false`` turns it off): the image's user (root, usually) on a
  writable root filesystem of the run's own, and Harbor's ``user`` (root, the task's
  agent or verifier user) is whom each command runs as;
- otherwise (runc, or ``image_user=false``) there is no root in the container:
  ``user="root"`` (Harbor's own steps: making and emptying its folders, ``chmod +x`` of
  scripts, packing logs) runs as the worker, who owns those folders; any user other than
  root or the worker is refused.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import logging
import os
import posixpath
import tarfile
from functools import partial
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from pydantic import ValidationError

from orchestrator.config import Resources, load_project
from orchestrator.config.models import Isolation, Trust
from orchestrator.errors import ImageMissing, OrchestratorError
from orchestrator.hostfs.owners import others_can_write
from orchestrator.integrations import transfer, upload
from orchestrator.integrations.harbor import mapping
from orchestrator.integrations.inspect.config import Environment
from orchestrator.integrations.projects import one_line, orchestrator_for
from orchestrator.integrations.tmpfs import with_tmpfs, writable
from orchestrator.integrations.transfer import Capture, TooMuch
from orchestrator.prepare import Prepared
from orchestrator.runtime.session import Session
from orchestrator.vocabulary import did_you_mean

log = logging.getLogger(__name__)

__all__ = ["OrchestratorEnvironment"]

#: Size of each of Harbor's folders (``/logs``, ``/tests``, ``/solution``), and of the
#: working folder when it needs one: at most the memory limit, counted in it.
FOLDER_TMP = 256 << 20
#: The folders of ``/logs`` Harbor expects at start (agent, verifier, artifacts).
LOG_FOLDERS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
#: The most output kept of one stream of a command (bytes); more fails the command.
MAX_OUTPUT = 64 << 20
#: The largest file or folder (as a tar stream) moved in or out (bytes).
MAX_TRANSFER = 1 << 30
#: How long one transfer may take (seconds).
TRANSFER_TIMEOUT = 600
#: What a command given no timeout may take (seconds): Harbor's own phases time out.
DEFAULT_TIMEOUT = 24 * 3600.0
#: This environment's own options (``--ek NAME=VALUE``).
OPTIONS = ("project", "isolation", "trust", "allow_ports", "max_lifetime", "image_user")
#: What Harbor's own base class takes by name (everything else it passes is an ``--ek``).
_HARBOR_PARAMETERS = set(inspect.signature(BaseEnvironment.__init__).parameters)


class OrchestratorEnvironment(BaseEnvironment):  # type: ignore[misc]
    """One trial's environment: a session of this project's orchestrator."""

    def __init__(
        self,
        *args: Any,
        project: str = ".",
        isolation: Isolation | None = None,
        trust: Trust | None = None,
        allow_ports: object = None,
        max_lifetime: object = None,
        image_user: object = None,
        **kwargs: Any,
    ) -> None:
        # Options (``--ek``), checked when the trial starts (see _validate_definition).
        self._project_dir = Path(str(project)).expanduser().resolve()
        self._isolation = isolation
        self._trust = trust
        self._allow_ports = allow_ports
        self._max_lifetime_option = max_lifetime
        self._max_lifetime: float | None = None
        # Harbor hands every ``--ek`` to the constructor and its base class swallows the
        # ones it does not know: a misspelt option would silently be its default.
        self._unknown = sorted(set(kwargs) - _HARBOR_PARAMETERS)
        self._image_user_option = image_user
        self._image_user = False
        self._force_build = False
        self._prepared: Prepared | None = None
        self._session: Session | None = None
        self._not_started = ""  # why start failed: what any later call answers
        self._workdir = "/tmp"
        self._uid = -1
        self._gid = -1
        super().__init__(*args, **kwargs)

    # -- what it is ---------------------------------------------------------------------

    @staticmethod
    def type() -> str:
        return "orchestrator"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            # Not enforceable by the egress proxy: refused by Harbor before start.
            network_allowlist_ipv6_addresses=False,
            network_allowlist_ipv4_cidrs=False,
            network_allowlist_ipv6_cidrs=False,
            dynamic_network_policy=False,
            mounted=False,  # nothing of the host's is mounted for Harbor's logs
            docker_compose=False,
            gpus=False,
            tpus=False,
            windows=False,
            stream=False,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities | None:
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    def _validate_definition(self) -> None:
        """Nothing here: the task is checked at :meth:`start`, before anything exists, so
        that Harbor records a refusal as that trial's exception (one line) instead of
        ending the whole job (a constructor's exception does)."""

    def _checked(self) -> Prepared:
        """The task as this project's declarations; a task this environment cannot run
        exactly is refused (one line)."""
        try:
            return self._prepare()
        except OrchestratorError as exc:
            line = one_line(exc)
            prefix = "orchestrator environment: "
            raise ValueError(line if line.startswith(prefix) else prefix + line) from None
        except ValidationError as exc:  # an option of the wrong kind (--ek isolation=x)
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"orchestrator environment: {where}: {first['msg']}") from None

    def _prepare(self) -> Prepared:
        for name in self._unknown:
            hint = did_you_mean(name, OPTIONS)
            raise mapping.refuse(
                f"--ek {name}: not an option of this environment; "
                f"{hint + ' ' if hint else ''}(options: {', '.join(OPTIONS)})"
            )
        self._max_lifetime = _seconds(self._max_lifetime_option)
        project = load_project(self._project_dir)
        if why := others_can_write(Path(os.path.realpath(project.file))):
            raise mapping.refuse(f"{project.file}: {why}; it says what a task's container gets")
        config = self.task_env_config
        image = mapping.image_of(self.environment_dir, config.docker_image)
        if image.dockerfile is not None:
            image = self._build(project.root, image.dockerfile)
        elif orchestrator_for(project.root).image(image.name) is not None:  # else: missing
            mapping.check_image(image, project.config.build.images, str(project.file))
        policy = self.network_policy
        network = mapping.network_of(
            policy.network_mode.value,
            list(policy.allowed_hosts),
            mapping.allowlist_ports(self._allow_ports),
        )
        memory = self._effective_memory_mb
        resources = Resources(
            memory=None if memory is None else int(memory) << 20,
            cpus=self._effective_cpus,
            timeout=DEFAULT_TIMEOUT,
        )
        workdir = config.workdir or image.workdir or "/tmp"
        env = Environment(
            image=image.name,
            zones=mapping.zones_of(project, list(self._host_mounts)),
            network=network,
            resources=resources,
            isolation=self._isolation,
            workdir=workdir,
            env=dict(image.env) or None,
            trust=self._trust,
        )
        name = f"harbor-{_safe(self.environment_name)}"
        self._project_dir = project.root  # the project's own folder, as loaded
        orch = orchestrator_for(project.root)
        wanted = _flag(self._image_user_option, "image_user")
        if wanted is None:  # by default, as the task was written wherever gVisor runs it
            plain = orch.prepare(env.inline_worker(name, project.file))
            wanted = plain.spec.isolation == "gvisor"
        env = env.model_copy(update={"image_user": wanted})
        prepared = orch.prepare(env.inline_worker(name, project.file))
        folders = [(folder, FOLDER_TMP) for folder in mapping.HARBOR_FOLDERS]
        if not writable(prepared.spec, workdir):
            folders.append((workdir, FOLDER_TMP))
        # As the image's user, Harbor's folders are open to every user of the image.
        prepared = with_tmpfs(prepared, folders, owned=not wanted)
        spec = prepared.spec
        self._workdir, self._uid, self._gid = spec.workdir, spec.uid, spec.gid
        self._image_user = spec.image_user
        return prepared

    def _build(self, project: Path, dockerfile: Path) -> mapping.Image:
        """The task's Dockerfile built by the project's builder (each ``RUN`` a hardened
        run under gVisor, its layers cached by content; audited in the project's log)."""
        from orchestrator.build import build_image

        built = build_image(
            dockerfile.parent,
            dockerfile=dockerfile,
            project=project,
            no_cache=self._force_build,
            say=lambda line: log.info("trial %s: build: %s", self.session_id, line),
        )
        defaults = orchestrator_for(project).image(built.image_id)
        if defaults is None:  # removed since it was built
            raise ImageMissing(built.image_id)
        return mapping.Image(built.image_id, workdir=defaults.workdir)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        self._force_build = force_build
        try:
            await asyncio.to_thread(self._open)
        except (ValueError, RuntimeError) as exc:  # one line, said before Harbor's traceback
            self._not_started = str(exc)
            self.logger.error(self._not_started)
            raise
        # The folders Harbor's own Docker environment mounts from the host exist here too.
        made = await self.exec(f"mkdir -p {' '.join(LOG_FOLDERS)}")
        if made.return_code != 0:
            raise RuntimeError(f"orchestrator environment: {made.stderr or made.stdout}")
        await self._upload_environment_dir_after_start()

    def _open(self) -> None:
        prepared = self._prepared = self._checked()
        orch = orchestrator_for(self._project_dir)
        try:
            if orch.image(prepared.spec.image) is None:
                raise ImageMissing(prepared.spec.image)
            self._session = orch.open_session(
                prepared, idle_timeout=None, max_lifetime=self._max_lifetime
            )
        except OrchestratorError as exc:
            raise RuntimeError(f"orchestrator environment: {one_line(exc)}") from None
        log.info("trial %s: session %s, run %s", self.session_id, self._session.id,
                 self._session.run_id)  # fmt: skip

    async def stop(self, delete: bool) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        try:
            await asyncio.to_thread(session.close)
        except (OrchestratorError, OSError) as exc:
            self.logger.warning(
                f"closing session {session.id} failed: {exc} (orchestrator gc removes what is left)"
            )

    # -- commands -----------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        who = self._resolve_user(user)
        self._check_user(who)
        capture = Capture(MAX_OUTPUT, MAX_OUTPUT)
        code = await self._run(
            ["bash", "-c", command],
            capture,
            cwd=cwd,
            env=self._merge_env(env),
            timeout=timeout_sec,
            user=str(who) if self._image_user and who is not None else None,
        )
        return ExecResult(
            stdout=capture.text("stdout"), stderr=capture.text("stderr"), return_code=code
        )

    def _check_user(self, user: str | int | None) -> None:
        if self._image_user:  # the image's users, root among them (under gVisor)
            return
        if user is None or str(user) in ("root", "0", str(self._uid), f"{self._uid}:{self._gid}"):
            return
        raise RuntimeError(
            f"orchestrator environment: user {user!r} is not supported: commands run as the "
            f"worker (uid {self._uid}); no other user exists to switch to"
        )

    async def _run(
        self,
        argv: list[str],
        capture: Capture,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        user: str | None = None,
    ) -> int:
        session = self._session
        if session is None:
            raise RuntimeError(
                self._not_started or "orchestrator environment: not started (or already stopped)"
            )
        workdir = self._workdir if cwd is None else posixpath.join(self._workdir, cwd)
        call = partial(
            session.exec,
            argv,
            cwd=workdir,
            env=env,
            timeout=None if timeout is None else float(timeout),
            stdin=stdin,
            on_output=capture.add,
            user=user,
        )
        try:
            result = await asyncio.to_thread(call)
        except TooMuch as exc:
            raise RuntimeError(
                f"orchestrator environment: the command's {exc.stream} went over "
                f"{capture.caps[exc.stream] >> 20} MiB; it was stopped"
            ) from None
        except OrchestratorError as exc:
            raise RuntimeError(f"orchestrator environment: {one_line(exc)}") from None
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout} seconds")
        return result.exit_code

    # -- files --------------------------------------------------------------------------

    async def _transfer(self, script: str, path: str, capture: Capture, stdin: bytes | None,
                        doing: str) -> None:  # fmt: skip
        code = await self._run(
            ["/bin/sh", "-c", script, doing, path],
            capture,
            timeout=TRANSFER_TIMEOUT,
            stdin=stdin,
        )
        if code != 0:
            raise transfer.failure(path, capture.text("stderr"), doing)

    @property
    def _task_dir(self) -> Path:
        """The task's folder (``environment/`` is in it): uploads never follow a link there."""
        return Path(self.environment_dir).parent

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        read = partial(upload.read_file, Path(source_path), self._task_dir, MAX_TRANSFER)
        data = await asyncio.to_thread(read)
        await self._transfer(transfer.WRITE, target_path, Capture(0, 64 << 10), data,
                             "upload_file")  # fmt: skip

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        pack = partial(upload.pack_folder, Path(source_dir), self._task_dir, MAX_TRANSFER)
        data = await asyncio.to_thread(pack)
        await self._transfer(transfer.UNTAR, target_dir, Capture(64 << 10, 64 << 10), data,
                             "upload_dir")  # fmt: skip

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        capture = Capture(MAX_TRANSFER, 64 << 10)
        await self._transfer(transfer.READ, source_path, capture, None, "download_file")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, bytes(capture.data["stdout"]))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        capture = Capture(MAX_TRANSFER, 64 << 10)
        await self._transfer(transfer.TAR, source_dir, capture, None, "download_dir")
        await asyncio.to_thread(_unpack, bytes(capture.data["stdout"]), Path(target_dir))


def _seconds(value: object) -> float | None:
    """The ``max_lifetime`` option: seconds, or None."""
    if value is None:
        return None
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise mapping.refuse(f"max_lifetime={value!r}: give a number of seconds above 0")
    return seconds


def _flag(value: object, name: str) -> bool | None:
    """A yes/no option (``--ek image_user=false``), or None when not given."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise mapping.refuse(f"{name}={value!r}: give true or false")


def _safe(name: str) -> str:
    kept = "".join(c if c.isalnum() or c in "-_." else "-" for c in name.lower())
    return kept.strip("-.")[:40] or "task"


def _unpack(data: bytes, target: Path) -> None:
    """A tar stream from the sandbox into ``target`` (Harbor's own filter: no links out,
    no devices, no absolute paths)."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(path=target, filter=transfer_tar_filter)  # noqa: S202 - filtered
