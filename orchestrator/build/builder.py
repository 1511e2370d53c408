"""``orchestrator build``: a Dockerfile built step by step, each step a hardened run.

The Dockerfile is parsed and checked first (:mod:`.dockerfile`), its context walked
(:mod:`.context`), and every base image it names looked up: nothing is pulled, and a
missing image is refused before any step runs. Then each stage the target needs is built
in order. Instructions that only change the image's configuration (``ENV``, ``WORKDIR``,
``USER``...) are applied to it as data; each ``RUN``, ``COPY`` and ``ADD`` is a container
made from the parent image (see :mod:`orchestrator.docker.build`): ``RUN`` runs in it under
gVisor, ``COPY``/``ADD`` put a tar into it; then its layer is committed with the image's
whole configuration, and the container removed on every path. ``ADD <url>`` fetches its
file first, in a container of its own through the build allowlist's egress proxy
(:mod:`.fetch`), and reads it back to take its digest.

The cache: a step's key is an HMAC-SHA256, under the project's own cache key (32 random
bytes in its sandbox root, :mod:`.scope`), of (the builder's version, the parent image's
id, the configuration instructions since the last layer, the instruction as expanded, the
digests of the context files it reads; for a ``RUN`` with network, the build's allowlist
and service networks). Each committed image carries its key as a label, so a step whose
key is found is not run again; another project, which has another cache key, never finds
it. ``--no-cache`` runs every step.

Labels: a Dockerfile's ``LABEL io.orchestrator.*`` is refused, and so is a base image
(``FROM``, ``COPY --from``) carrying such a label other than the builder's own: the engine
would carry it into the image and into every container made from it (``gc`` reads them).
Images a build may name at all are the project's ``build.images`` (:mod:`.bases`).

The audit log gets ``build.started``, one ``build.step`` per instruction (its key, its
outcome, whether it came from the cache), the egress proxy's decisions on each step's
requests (``build.egress``, and ``build.egress.flood`` for what went past the budget) and
``build.ended`` (the image's id, or why not).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import posixpath
import shlex
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import IO, Any

from orchestrator.audit import AuditLog
from orchestrator.build.bases import BaseImages
from orchestrator.build.context import (
    Context,
    Item,
    Placed,
    is_archive,
    planned,
    tar_members,
    unpack_members,
)
from orchestrator.build.dockerfile import (
    LAYERS,
    BuildRefused,
    Dockerfile,
    Instruction,
    SecretMount,
    Stage,
    is_url,
    mount_options,
    secret_mounts,
)
from orchestrator.build.engine import ENTRY_BYTES, StepEngine, StepLimits, StepSpec
from orchestrator.build.fetch import (
    CA_FILE,
    DOWNLOAD,
    FETCH_USER,
    FOLDER,
    SCRIPT,
    URL_MODE,
    Answer,
    answer_of,
    check_url,
    file_name,
    next_url,
    parse_checksum,
)
from orchestrator.build.secrets import BuildSecrets, Delivered, delivered, key_part
from orchestrator.build.tarstream import Member, chunks_of, count, stream
from orchestrator.build.words import WordError, expand
from orchestrator.config.allowlist import validate_allowlist
from orchestrator.credproxy import CA_VARIABLES, CREDPROXY_IMAGE, WORKER_BUNDLE
from orchestrator.egress import PROXY_IMAGE, PROXY_URL, network_env
from orchestrator.errors import OrchestratorError
from orchestrator.labels import PREFIX, is_orchestrator_label

log = logging.getLogger(__name__)

#: Part of every cache key: a builder that builds differently never reuses older layers.
BUILDER_VERSION = "3"
CACHE_LABEL = f"{PREFIX}.build.key"
PROVENANCE = {
    "dockerfile": f"{PREFIX}.build.dockerfile-digest",
    "context": f"{PREFIX}.build.context-digest",
    "builder": f"{PREFIX}.build.builder-version",
    "runtime": f"{PREFIX}.build.runtime",
}
#: The orchestrator's labels a base image may carry: the builder's own (set again, with
#: its own values, on every image a build commits) and what ``orchestrator images build``
#: puts on the images it ships. ``gc`` reads none of them.
INHERITABLE = frozenset({CACHE_LABEL, *PROVENANCE.values(), f"{PREFIX}.image",
                         f"{PREFIX}.suite"})  # fmt: skip
#: Images no build may read, whatever ``build.images`` says (compared by image id).
PROTECTED = {PROXY_IMAGE: "the egress proxy's", CREDPROXY_IMAGE: "the credential proxy's"}
DEFAULT_SHELL = ["/bin/sh", "-c"]
#: The image configuration fields a build sets (Docker's names).
CONFIG_FIELDS = ("Env", "Cmd", "Entrypoint", "WorkingDir", "User", "Labels", "ExposedPorts",
                 "Volumes", "Shell", "StopSignal", "Healthcheck")  # fmt: skip
#: Bytes of an ``ADD <url>`` download kept in memory; past it, in an unnamed temporary file
#: (removed as it is made), never more than the step may add.
_SPOOL = 32 << 20
#: The host's trusted certificates, for an https ``ADD <url>`` (the first one found).
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
              "/etc/ssl/cert.pem")  # fmt: skip
#: Bytes of a fetch container's output kept (its answer is the last line).
_FETCH_OUTPUT = 64 << 10
#: Said once per build whose steps get the build's network while the host's firewall rule
#: is missing (as ``run`` says it for an allowlisted worker).
HOST_RULE_WARNING = (
    "warning: allowlisted build steps can reach services on this host through the build "
    "network's gateway: the firewall rule is missing; apply it with `orchestrator doctor "
    "--fix` (docs/build.md, docs/network.md)"
)
#: A file put into an empty /tmp before a ``RUN`` step starts (see ``_step_container``).
TMP_MARKER = ".orchestrator-build-keeps-tmp"

Say = Callable[[str], None]


class StepFailed(BuildRefused):
    """A ``RUN`` step failed: its exit code is the command's (125 when it had none)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code if 0 < code < 256 else 125


@dataclass(frozen=True)
class StepRecord:
    line: int
    instruction: str
    key: str
    outcome: str
    """``built``, ``cached``, ``config`` (no layer) or ``failed``."""
    duration_s: float


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    tag: str | None
    build_id: str
    steps: tuple[StepRecord, ...]
    duration_s: float
    labels: dict[str, str]

    @property
    def cached_steps(self) -> int:
        return sum(1 for s in self.steps if s.outcome == "cached")

    @property
    def built_steps(self) -> int:
        return sum(1 for s in self.steps if s.outcome == "built")

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image_id,
            "tag": self.tag,
            "build_id": self.build_id,
            "duration_s": round(self.duration_s, 3),
            "cached_steps": self.cached_steps,
            "built_steps": self.built_steps,
            "labels": self.labels,
            "steps": [s.__dict__ for s in self.steps],
        }


@dataclass
class _State:
    """A stage being built: its image so far and the configuration on top of it."""

    image: str
    config: dict[str, Any]
    args: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    """Configuration instructions (expanded) since the last commit."""
    cmd_set: bool = False

    def variables(self) -> dict[str, str]:
        env = dict(e.partition("=")[::2] for e in self.config.get("Env") or [])
        return {**self.args, **env}


class _OutputLines:
    """A step's output as whole lines. The engine hands it over in the chunks the step
    wrote (an unbuffered ``print("a", 1)`` is four writes); a line is given once its end
    came, or once it is ``limit`` bytes long, or at the end of the output."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self.pending = bytearray()

    def feed(self, chunk: bytes, *, end: bool = False) -> list[str]:
        self.pending += chunk
        cut = self.pending.rfind(b"\n") + 1
        if end or len(self.pending) - cut >= self.limit:
            cut = len(self.pending)
        whole = bytes(self.pending[:cut])
        del self.pending[:cut]
        return whole.decode("utf-8", errors="replace").splitlines()


class Builder:
    """One build: the Dockerfile, its context, the engine and the audit log."""

    def __init__(
        self,
        engine: StepEngine,
        audit: AuditLog,
        context: Context,
        dockerfile: Dockerfile,
        limits: StepLimits,
        *,
        cache_key: bytes,
        build_args: Mapping[str, str] | None = None,
        no_cache: bool = False,
        allow: list[str] | None = None,
        services: list[str] | None = None,
        secrets: BuildSecrets | None = None,
        say: Say | None = None,
        images: BaseImages | None = None,
        labels: Mapping[str, str] | None = None,
        warn: Say | None = None,
        host_rule_missing: Callable[[], bool] | None = None,
        ca: bytes = b"",
    ) -> None:
        self.engine, self.audit, self.context, self.file = engine, audit, context, dockerfile
        self.limits, self.no_cache = limits, no_cache
        self.build_args = dict(build_args or {})
        self.say: Say = say or (lambda line: None)
        self.warn: Say = warn or self.say
        """Where a warning about the build goes (``orchestrator: warning: ...``)."""
        self.host_rule_missing = host_rule_missing or (lambda: False)
        """Whether the host's firewall rule for the egress bridges is known to be missing."""
        self.build_id = uuid.uuid4().hex[:12]
        self.steps: list[StepRecord] = []
        self.committed: list[str] = []
        self.disk_used = 0
        """What the steps this build ran added to their layers so far."""
        self.deadline = 0.0
        self.global_args: dict[str, str] = {}
        self.results: dict[int, _State] = {}
        self.allow = list(allow or [])
        """The project's build allowlist: ``RUN`` steps reach these through the egress
        proxy (empty: no network)."""
        self.services = list(services or [])
        """The project's local service networks the egress proxy joins."""
        self.network: str | None = None
        self.downloads = contextlib.ExitStack()
        """The files ``ADD <url>`` fetched, closed at the end of the build."""
        self.secrets = secrets or BuildSecrets({}, "the project file")
        """What ``RUN --mount=type=secret`` may mount (the project's ``build.secrets``)."""
        self.cache_key = cache_key
        """The project's cache key: every step's key is an HMAC under it, so a build finds
        only what a build of the same project committed (:mod:`.scope`)."""
        self.images = images or BaseImages()
        """The images ``FROM`` and ``COPY --from`` may name (``build.images``)."""
        self.own_labels = dict(labels or {})
        """Labels the caller (never a Dockerfile) puts on the image: the agent image's."""
        self._protected: dict[str, str] | None = None
        self.ca = ca
        """CA certificates (PEM) a networked ``RUN`` step trusts besides its image's own
        (``build.ca``): the step's bundle is both, mounted over the image's for the step."""
        self._bundles: dict[str, bytes] = {}

    # -- the whole build -----------------------------------------------------------------

    def build(self, target: str | None, tag: str | None) -> BuildResult:
        started = time.monotonic()
        self.deadline = started + self.limits.timeout_s
        dockerfile_digest = hashlib.sha256(self.file.text.encode()).hexdigest()
        self.audit.record(
            "build.started",
            run_id=self.build_id,
            worker="build",
            path=str(self.file.path),
            metadata={"context": str(self.context.root), "dockerfile_digest": dockerfile_digest,
                      "target": target, "tag": tag, "no_cache": self.no_cache,
                      "allow": self.allow},
        )  # fmt: skip
        try:
            self.global_args = self._args(self.file.global_args, {})
            stages = self.file.needed(self.file.target(target), self.global_args)
            self._check_images(stages)
            self._check_secrets(stages)
            state = _State("", {})
            for stage in stages:
                state = self._stage(stage)
                self.results[stage.index] = state
            provenance = {
                **self.own_labels,
                PROVENANCE["dockerfile"]: f"sha256:{dockerfile_digest}",
                PROVENANCE["context"]: f"sha256:{self._context_digest()}",
                PROVENANCE["builder"]: BUILDER_VERSION,
                PROVENANCE["runtime"]: self.engine.runtime(),
            }
            image = self._finish(state, provenance)
            if tag:
                self.engine.tag(image, tag)
        except BaseException as exc:
            self.downloads.close()
            self._close_network()
            self._ended(None, started, exc)
            if self.no_cache:
                for made in reversed(self.committed):
                    with contextlib.suppress(OrchestratorError):
                        self.engine.remove_image(made)
            raise
        self.downloads.close()
        self._close_network()
        self._ended(image, started, None)
        labels = {k: v for k, v in (state.config.get("Labels") or {}).items()}
        labels.update(provenance)
        return BuildResult(image, tag, self.build_id, tuple(self.steps),
                           time.monotonic() - started, labels)  # fmt: skip

    def _close_network(self) -> None:
        if self.network is not None:
            network, self.network = self.network, None
            self.engine.close_network(network)

    def _ended(self, image: str | None, started: float, exc: BaseException | None) -> None:
        with contextlib.suppress(OrchestratorError):
            self.audit.record(
                "build.ended",
                run_id=self.build_id,
                worker="build",
                allowed=exc is None,
                reason=None if exc is None else (str(exc) or type(exc).__name__)[:500],
                metadata={"image": image, "duration_s": round(time.monotonic() - started, 3),
                          "cached_steps": sum(s.outcome == "cached" for s in self.steps),
                          "steps": len(self.steps)},
            )  # fmt: skip

    def _check_images(self, stages: list[Stage]) -> None:
        """Every image the stages name is on this machine, before any step runs."""
        names = {s.name for s in self.file.stages if s.name}
        for stage in stages:
            base = self.file.base_of(stage, self.global_args)
            earlier = self.file.stage_named(base)
            if base.lower() != "scratch" and not (earlier and earlier.index < stage.index):
                self._local_image(base, stage.line, "FROM")
            for instruction in stage.instructions:
                if instruction.keyword == "LABEL":  # names as written: checked before any step
                    self._check_labels(instruction, [w for w in instruction.words[::2]
                                                     if "$" not in w], {})  # fmt: skip
                if instruction.keyword == "ADD":  # a URL as written: checked before any step
                    where = f"{self.file.where(instruction.line)}: ADD"
                    for word in instruction.words[:-1]:
                        if is_url(word) and "$" not in word:
                            check_url(word, self.allow, where)
                source = instruction.flag("from")
                if instruction.keyword == "COPY" and source is not None:
                    source = self._expand(source, self.global_args, instruction)
                    found = self.file.stage_named(source)
                    if found is None or found.index >= stage.index:
                        if source.lower() in names:
                            raise self.file.refuse(instruction, f"--from={source}: a later stage")
                        self._local_image(source, instruction.line, "COPY")

    def _check_secrets(self, stages: list[Stage]) -> None:
        """Every secret a step mounts is declared for builds, before any step runs."""
        for stage in stages:
            for instruction in stage.instructions:
                if instruction.keyword != "RUN":
                    continue
                for mount in secret_mounts(self.file, instruction):
                    if mount.id not in self.secrets.names:
                        raise self.file.refuse(
                            instruction,
                            f"--mount=type=secret,id={mount.id}: the project does not declare "
                            f"'{mount.id}' for builds; add it to build.secrets in "
                            f"{self.secrets.declared_in} (one of its credentials)",
                        )

    def _check_labels(
        self, instruction: Instruction, names: list[str], variables: Mapping[str, str]
    ) -> None:
        """A Dockerfile never sets the orchestrator's labels (``gc`` and the cache read
        them): refused, naming the label."""
        for name in names:
            label = self._expand(name, variables, instruction)
            if is_orchestrator_label(label):
                raise self.file.refuse(
                    instruction,
                    f"{label}: the {PREFIX}.* labels are the orchestrator's own; a "
                    "Dockerfile may not set them (name yours otherwise)",
                )

    def _local_image(self, ref: str, line: int, keyword: str) -> tuple[str, dict[str, Any]]:
        """A local image the project's builds may name: on this machine, on the project's
        list, none of the proxies', carrying none of the orchestrator's labels but the
        builder's own."""
        where = f"{self.file.where(line)}: {keyword}"
        found = self.engine.image(ref)
        if found is None:
            raise BuildRefused(
                f"{where}: image '{ref}' is not on this machine and "
                "nothing is pulled: load it (`docker load -i FILE`), build it (`orchestrator "
                f"build`), or pull it where a registry answers (`docker pull {ref}`)"
            )
        if not self.images.allows(ref):
            raise BuildRefused(f"{where}: {self.images.refusal(ref)}")
        whose = self._protected_images().get(found[0])
        if whose is not None:
            raise BuildRefused(f"{where}: image '{ref}' is {whose} image: no build may read it")
        labels = found[1].get("Labels") or {}
        foreign = sorted(k for k in labels if is_orchestrator_label(k) and k not in INHERITABLE)
        if foreign:
            raise BuildRefused(
                f"{where}: image '{ref}' carries the label {foreign[0]}, which only the "
                "orchestrator sets (the engine would pass it into the image and every "
                "container made from it): rebuild that image without it"
            )
        return found

    def _protected_images(self) -> dict[str, str]:
        """The ids of the images no build may read (those on this machine)."""
        if self._protected is None:
            self._protected = {}
            for name, whose in PROTECTED.items():
                found = self.engine.image(name)
                if found is not None:
                    self._protected[found[0]] = whose
        return self._protected

    # -- one stage -----------------------------------------------------------------------

    def _stage(self, stage: Stage) -> _State:
        base = self.file.base_of(stage, self.global_args)
        earlier = self.file.stage_named(base)
        if earlier is not None and earlier.index in self.results:
            parent = self.results[earlier.index]
            image = self._finish(parent, {})
            state = _State(image, dict(parent.config))
        elif base.lower() == "scratch":
            state = _State(self.engine.empty_image(), {})
        else:
            image, config = self._local_image(base, stage.line, "FROM")
            state = _State(image, {k: config.get(k) for k in CONFIG_FIELDS})
        self.say(f"[{stage.line}] FROM {base}" + (f" AS {stage.name}" if stage.name else ""))
        for instruction in stage.instructions:
            begun = time.monotonic()
            if instruction.keyword in LAYERS:
                key, outcome = self._layer(state, instruction)
            else:
                key, outcome = "", "config"
                self._configure(state, instruction)
            self._step(instruction, key, outcome, begun)
        return state

    def _step(self, instruction: Instruction, key: str, outcome: str, begun: float) -> None:
        record = StepRecord(instruction.line, instruction.keyword, key, outcome,
                            time.monotonic() - begun)  # fmt: skip
        self.steps.append(record)
        self.audit.record(
            "build.step",
            run_id=self.build_id,
            worker="build",
            metadata={"line": instruction.line, "instruction": instruction.keyword,
                      "text": instruction.original[:200], "digest": key, "outcome": outcome,
                      "cached": outcome == "cached"},
        )  # fmt: skip

    # -- configuration instructions ----------------------------------------------------------

    def _args(self, instructions: list[Instruction], into: dict[str, str]) -> dict[str, str]:
        values = dict(into)
        for instruction in instructions:
            for word in instruction.words:
                name, eq, default = word.partition("=")
                if name in self.build_args:
                    values[name] = self.build_args[name]
                elif eq:
                    values[name] = self._expand(default, values, instruction)
                elif name in self.global_args:
                    values[name] = self.global_args[name]
        return values

    def _expand(self, word: str, variables: Mapping[str, str], instruction: Instruction) -> str:
        try:
            return expand(word, variables, escape=self.file.escape)
        except WordError as exc:
            raise self.file.refuse(instruction, str(exc)) from None

    def _configure(self, state: _State, instruction: Instruction) -> None:
        keyword, words, config = instruction.keyword, instruction.words, state.config
        if keyword == "ARG":
            state.args = self._args([instruction], state.args)
            state.pending.append(f"ARG {json.dumps(state.args, sort_keys=True)}")
            return
        variables = state.variables()

        def word(text: str) -> str:
            return self._expand(text, variables, instruction)

        if keyword in ("ENV", "LABEL"):
            pairs = [word(w) for w in words]
            if keyword == "ENV" and len(pairs) % 2:
                raise self.file.refuse(instruction, "expected NAME=VALUE pairs")
            values = dict(zip(pairs[::2], pairs[1::2], strict=True))
            if keyword == "LABEL":
                self._check_labels(instruction, list(words[::2]), variables)
            if keyword == "ENV":
                env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
                env.update(values)
                config["Env"] = [f"{k}={v}" for k, v in env.items()]
            else:
                config["Labels"] = {**(config.get("Labels") or {}), **values}
        elif keyword == "WORKDIR":
            path = word(words[0])
            config["WorkingDir"] = posixpath.normpath(
                posixpath.join(config.get("WorkingDir") or "/", path)
            )
        elif keyword == "USER":
            config["User"] = word(words[0])
        elif keyword in ("CMD", "ENTRYPOINT"):
            argv = self._argv(state, instruction)
            if keyword == "CMD":
                config["Cmd"], state.cmd_set = argv, True
            else:
                config["Entrypoint"] = argv
                if not state.cmd_set:
                    config["Cmd"] = None
        elif keyword == "SHELL":
            if not instruction.json:
                raise self.file.refuse(instruction, 'takes the JSON form: SHELL ["sh", "-c"]')
            config["Shell"] = list(words)
        elif keyword == "EXPOSE":
            ports = [word(w) for w in words]
            exposed = dict(config.get("ExposedPorts") or {})
            exposed.update({p if "/" in p else f"{p}/tcp": {} for p in ports})
            config["ExposedPorts"] = exposed
        elif keyword == "VOLUME":
            volumes = dict(config.get("Volumes") or {})
            volumes.update({word(w): {} for w in words})
            config["Volumes"] = volumes
        elif keyword == "STOPSIGNAL":
            config["StopSignal"] = word(words[0])
        elif keyword == "HEALTHCHECK":
            config["Healthcheck"] = self._healthcheck(state, instruction)
        state.pending.append(instruction.original)

    def _argv(self, state: _State, instruction: Instruction) -> list[str]:
        if instruction.json:
            return list(instruction.words)
        shell = state.config.get("Shell") or DEFAULT_SHELL
        return [*shell, " ".join(instruction.words)]

    def _healthcheck(self, state: _State, instruction: Instruction) -> dict[str, Any]:
        words = list(instruction.words)
        if words and words[0].upper() == "NONE":
            return {"Test": ["NONE"]}
        if not words or words[0].upper() != "CMD":
            raise self.file.refuse(instruction, "expected HEALTHCHECK [OPTIONS] CMD ... or NONE")
        test = ["CMD", *words[1:]] if instruction.json else ["CMD-SHELL", " ".join(words[1:])]
        check: dict[str, Any] = {"Test": test}
        names = {"interval": "Interval", "timeout": "Timeout", "start-period": "StartPeriod",
                 "start-interval": "StartInterval"}  # fmt: skip
        for flag in instruction.flags:
            name, _, value = flag.removeprefix("--").partition("=")
            if name == "retries":
                check["Retries"] = int(value)
            elif name in names:
                check[names[name]] = _nanoseconds(value, self.file, instruction)
        return check

    # -- layer instructions ----------------------------------------------------------------

    def _key(self, state: _State, instruction: Instruction, parts: list[str]) -> str:
        body = [BUILDER_VERSION, state.image, *state.pending, instruction.keyword, *parts]
        return self._mac(json.dumps(body))

    def _mac(self, body: str) -> str:
        """A cache key: the HMAC of ``body`` under the project's cache key."""
        return hmac.new(self.cache_key, body.encode(), hashlib.sha256).hexdigest()

    def _layer(self, state: _State, instruction: Instruction) -> tuple[str, str]:
        mounts: list[tuple[SecretMount, str]] = []
        if instruction.keyword == "RUN":
            spec, mounts = self._run_spec(state, instruction)
            parts = [json.dumps([spec.command, spec.scratch])]
            parts += [key_part(mount, target) for mount, target in mounts]
            if spec.network is not None:  # what the step could reach
                parts += [json.dumps([self._allowlist(), sorted(set(self.services))])]
            key = self._key(state, instruction, parts)
            apply: Callable[[str], int] = lambda c: self._run(c, instruction)  # noqa: E731
        else:
            key, apply, spec = self._copy_plan(state, instruction)
        self.say(f"[{instruction.line}] {instruction.original.splitlines()[0][:120]}")
        if not self.no_cache:
            cached = self.engine.cached(key, state.image)
            if cached is not None:
                self.say("  (cached)")
                state.image, state.pending = cached, []
                return key, "cached"
        where = f"{self.file.where(instruction.line)}: {instruction.keyword}"
        if self._room() <= 0:
            raise StepFailed(
                f"{where}: the build's disk budget ({_mib(self.limits.disk_total)}, "
                f"--disk-total) is used up by the steps before it: not run",
                125,
            )
        if spec.network is not None:
            spec = replace(spec, network=self._open_network())
        with (
            self._secret_files(instruction, mounts) as files,
            self._ca_file(spec, state.image) as bundle,
        ):
            spec = replace(
                spec, secrets=tuple((f.source, f.target) for f in files), ca_bundle=bundle
            )
            container = self._step_container(spec, instruction)
            try:
                self.disk_used += apply(container)
                image = self.engine.commit(container, self.commit_config(state.config, key))
            finally:
                self.engine.remove(container)
        self.committed.append(image)
        state.image, state.pending = image, []
        return key, "built"

    def _allowlist(self) -> list[str]:
        """The build's allowlist, normalised (the same hosts in any order or spelling)."""
        entries = validate_allowlist(self.allow)
        return sorted({f"{e.host}:{e.port}" for e in entries})

    def _open_network(self) -> str:
        if self.network is None:
            self.network = self.engine.open_network(self.build_id, self.allow, self.services)
            # Once per build, as ``run`` does: without the host's firewall rule a step on
            # the build's network reaches the host's services through its gateway.
            if self.host_rule_missing():
                self.warn(HOST_RULE_WARNING)
        return self.network

    def _room(self) -> int:
        """Bytes the next step may add: the step's limit, or what is left of the build's
        budget when that is less."""
        return min(self.limits.disk, self.limits.disk_total - self.disk_used)

    def _step_limits(self) -> StepLimits:
        return replace(self.limits, disk=max(self._room(), 0))

    def _over(self) -> str:
        """The limit a step went past, in words."""
        if self._room() < self.limits.disk:
            return (
                f"what is left of the build's disk budget ({_mib(self._room())} of "
                f"{_mib(self.limits.disk_total)}, --disk-total; the steps before it added "
                f"{_mib(self.disk_used)})"
            )
        return f"the step's disk limit ({_mib(self.limits.disk)}, --disk)"

    def commit_config(self, config: Mapping[str, Any], key: str) -> dict[str, Any]:
        """The whole image configuration for a commit. Docker fills fields a commit leaves
        empty from the container's own; a step's container has an empty ``Cmd`` and its
        command as the entrypoint, so an empty (not absent) ``Entrypoint`` keeps both."""
        labels = {**(config.get("Labels") or {}), CACHE_LABEL: key}
        out = {k: config.get(k) for k in CONFIG_FIELDS}
        out.update(Labels=labels, Cmd=config.get("Cmd") or [], Env=config.get("Env") or [],
                   Entrypoint=config.get("Entrypoint") or [])  # fmt: skip
        return out

    def _spec(self, state: _State, command: list[str], scratch: tuple[str, ...] = ()) -> StepSpec:
        config = state.config
        return StepSpec(image=state.image, command=command, user=config.get("User") or "",
                        env=list(config.get("Env") or []), workdir=config.get("WorkingDir") or "",
                        scratch=scratch, build_id=self.build_id)  # fmt: skip

    @contextlib.contextmanager
    def _secret_files(
        self, instruction: Instruction, mounts: list[tuple[SecretMount, str]]
    ) -> Iterator[list[Delivered]]:
        """The step's secret files, on the host for as long as its container exists."""
        if not mounts:
            yield []
            return
        where = f"{self.file.where(instruction.line)}: RUN"
        files = []
        for mount, target in mounts:
            try:
                value = self.secrets.value(mount.id)
            except OrchestratorError as exc:
                if mount.required:
                    raise BuildRefused(
                        f"{where}: --mount=type=secret,id={mount.id}: {exc}"
                    ) from None
                self.say(f"  (secret '{mount.id}' not mounted: {exc})")
                continue
            self.audit.record(
                "credential.used",
                run_id=self.build_id,
                worker="build",
                metadata={"credential": mount.id, "use": "build secret",
                          "line": instruction.line, "target": target},
            )  # fmt: skip
            files.append((mount, target, value))
        with delivered(self.build_id, files) as made:
            yield made

    def _step_bundle(self, image: str) -> bytes:
        """A networked step's CA bundle on ``image`` (``build.ca``): the image's own
        certificates, then the project's; empty without ``build.ca``, or when the image
        has no bundle of its own (said once per image: nothing is mounted there)."""
        if not self.ca:
            return b""
        if image not in self._bundles:
            own = self.engine.ca_bundle(image)
            if not own.strip():
                self.warn(
                    f"build.ca: image {image[:19]} has no CA bundle at {WORKER_BUNDLE}; its "
                    "steps get none (install ca-certificates in an earlier step)"
                )
                self._bundles[image] = b""
            else:
                self._bundles[image] = own.rstrip(b"\n") + b"\n" + self.ca
        return self._bundles[image]

    @contextlib.contextmanager
    def _ca_file(self, spec: StepSpec, image: str) -> Iterator[str]:
        """The step's CA bundle as a host file for as long as its container exists ("":
        none), readable by the engine; public certificates only, no secret."""
        bundle = self._step_bundle(image) if spec.network is not None else b""
        if not bundle:
            yield ""
            return
        folder = tempfile.mkdtemp(prefix=f"orchestrator-build-{self.build_id}-ca-")
        try:
            path = os.path.join(folder, "ca-certificates.crt")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(bundle)
            os.chmod(folder, 0o755)  # noqa: S103 (public certificates; the step reads them)
            yield path
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run_spec(
        self, state: _State, instruction: Instruction
    ) -> tuple[StepSpec, list[tuple[SecretMount, str]]]:
        env_names = {e.partition("=")[0] for e in state.config.get("Env") or []}
        args = {k: v for k, v in state.args.items() if k not in env_names}
        # ``RUN --network=none``: no network at all, not even the proxy.
        networked = bool(self.allow) and instruction.flag("network") != "none"
        if networked:  # the proxy, like a build argument: never in the image's environment
            args.update(network_env())
            if self._step_bundle(state.image):  # its clients told where the bundle is, too
                args.update(dict.fromkeys(CA_VARIABLES, WORKER_BUNDLE))
        if instruction.json:
            argv = list(instruction.words)
            if args:
                argv = ["env", *(f"{k}={v}" for k, v in sorted(args.items())), *argv]
        else:
            text = _shell_text(instruction)
            shell = list(state.config.get("Shell") or DEFAULT_SHELL)
            if text.startswith("#!"):
                first, _, rest = text.partition("\n")
                shell, text = [*shlex.split(first[2:]), "-c"], rest
            if args:
                assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(args.items()))
                text = f"export {assign}\n{text}"
            argv = [*shell, text]
        workdir = state.config.get("WorkingDir") or "/"
        scratch = []
        for mount in instruction.flag_values("mount"):
            options = mount_options(mount)
            if options.get("type") == "secret":
                continue
            target = options.get("target") or options.get("dst") or options.get("destination")
            scratch.append(posixpath.join(workdir, target or ""))
        secrets = []
        for found in secret_mounts(self.file, instruction):
            target = posixpath.normpath(posixpath.join(workdir, found.target))
            if target == "/":
                raise self.file.refuse(instruction, f"--mount=type=secret,id={found.id}: "
                                       "target=/: name a file")  # fmt: skip
            secrets.append((found, target))
        spec = self._spec(state, argv, tuple(scratch))
        return (replace(spec, network="allowlist") if networked else spec), secrets

    def _step_container(self, spec: StepSpec, instruction: Instruction) -> str:
        """A step's container; a ``RUN`` step's has its /tmp reach its layer, as in
        ``docker build``.

        gVisor mounts a tmpfs of its own on /tmp when nothing is mounted there and the
        image's /tmp is an empty folder; the tmpfs goes with the sandbox, and what the step
        wrote there with it. So an empty /tmp is given a file (:data:`TMP_MARKER`, owned
        by the step's user) before the step starts, and the step's command is run by a
        shell that removes it first: made and removed in the step's own layer, it leaves
        no trace in the commit. Where that cannot be done (/tmp not empty, or mounted,
        or not writable by the step's user; no ``/bin/sh`` or ``rm`` in the image) the
        step runs its command as it is."""
        mounted = "/tmp" in {posixpath.normpath(p) for p in spec.scratch}  # gVisor keeps off
        if instruction.keyword != "RUN" or mounted:
            return self.engine.create(spec, self._step_limits())
        marker = f"/tmp/{TMP_MARKER}"
        # What the shell itself exports is unset (unless the step's environment has it).
        given = {e.partition("=")[0] for e in spec.env}
        unset = "".join(f"unset {name}\n" for name in ("PWD", "SHLVL") if name not in given)
        script = (f"/bin/rm -f -- {marker} 2>/dev/null || /usr/bin/rm -f -- {marker} || "
                  f'exit 125\n{unset}exec "$@"')  # fmt: skip
        wrapped = replace(spec, command=["/bin/sh", "-c", script, "sh", *spec.command])
        container = self.engine.create(wrapped, self._step_limits())
        try:
            owner = self._tmp_owner(container, spec.user)
            if owner is not None:
                info = tarfile.TarInfo(marker.lstrip("/"))
                info.mode, info.uid, info.gid = 0o600, owner, 0
                self._put(container, [(info, [])], "/tmp")
                return container
        except BaseException:
            self.engine.remove(container)
            raise
        self.engine.remove(container)
        return self.engine.create(spec, self._step_limits())

    def _put(self, container: str, members: list[Member], where: str) -> None:
        """A few small members of the builder's own into the container."""
        limit = sum(ENTRY_BYTES + m.size for m, _ in members)
        self.engine.put_archive(
            container, stream(members, limit, lambda why: BuildRefused(f"{where}: {why}"))
        )

    def _tmp_owner(self, container: str, user: str) -> int | None:
        """The step's uid, when its /tmp is an empty folder it can remove a file from and
        the image has the shell and ``rm`` the step's wrapper needs; else None."""
        folder = self.engine.folder(container, "/tmp")
        if folder is None or not folder.empty or not self.engine.exists(container, "/bin/sh"):
            return None
        if not any(self.engine.exists(container, rm) for rm in ("/bin/rm", "/usr/bin/rm")):
            return None
        name = user.partition(":")[0]
        if not name or name.isdigit():
            uid = int(name or 0)
        else:
            try:
                uid = int(self._entry(container, "/etc/passwd", name, "USER")[2])
            except BuildRefused:  # the engine refuses to start it, in its own words
                return None
        return uid if uid == 0 or folder.mode & 0o002 else None

    def _run(self, container: str, instruction: Instruction) -> int:
        values = self.secrets.read()
        redactor = None
        if values:  # the output of any step after a secret was read: a step may keep it
            from orchestrator.runtime.secrets import StreamRedactor

            redactor = StreamRedactor(values)

        lines = _OutputLines()

        def say(chunk: bytes, *, end: bool = False) -> None:
            for line in lines.feed(chunk, end=end):
                self.say(f"  | {line}")

        def show(chunk: bytes) -> None:
            say(redactor.feed(chunk) if redactor else chunk)

        since = datetime.now(UTC)
        try:
            outcome = self.engine.run(container, self._step_limits(), self.deadline, show)
        finally:
            say(redactor.flush() if redactor else b"", end=True)
            if self.network is not None:
                self._record_egress(instruction.line, since)
        if redactor:
            outcome = replace(outcome, tail=redactor.tail(outcome.tail.encode(), truncated=True))
        if outcome.clipped:
            self.say(f"  (output clipped at {self.limits.output >> 10} KiB)")
        where = f"{self.file.where(instruction.line)}: RUN"
        if outcome.timed_out:
            raise StepFailed(
                f"{where}: still running at the build's time limit "
                f"({self.limits.timeout_s:g} s): stopped",
                125,
            )
        # (SIGXFSZ, 128 + 25: a file grew past the limit, the file-size limit stopped it)
        if outcome.disk_exceeded or outcome.exit_code == 128 + 25:
            raise StepFailed(
                f"{where}: added more than {self._over()} to its layer (files, folders and "
                "links all counted): stopped",
                125,
            )
        if outcome.exit_code != 0:
            memory = " (killed at the memory limit)" if outcome.oom else ""
            last = [ln for ln in outcome.tail.splitlines() if ln.strip()][-1:]
            said = f": {last[0][:200]}" if last else ""
            raise StepFailed(
                f"{where}: exited {outcome.exit_code}{memory}{said}", outcome.exit_code
            )
        return outcome.added

    def _record_egress(self, line: int, since: datetime) -> None:
        """The step's requests through the egress proxy: one ``build.egress`` each, up to
        the budget a run keeps; what went beyond (a flood) one ``build.egress.flood``."""
        found = self.engine.egress_decisions(self.build_id, self.allow, self.services, since)
        for decision in found.decisions:
            self.audit.record(
                "build.egress",
                run_id=self.build_id,
                worker="build",
                allowed=decision.allowed,
                reason=None if decision.allowed else "not on the project's build allowlist",
                metadata={"line": line, "host": decision.host,
                          "port": decision.port, "method": decision.method},
            )  # fmt: skip
        if not found.flooded:
            return
        kept = {True: 0, False: 0}
        for decision in found.decisions:
            kept[decision.allowed] += 1
        denied, allowed = found.unlisted_denied, found.unlisted_allowed
        self.audit.record(
            "build.egress.flood",
            run_id=self.build_id,
            worker="build",
            allowed=False,
            reason=f"{denied} denied and {allowed} allowed requests beyond the log budget "
            "were counted, not logged one by one",
            metadata={"line": line, "denied": denied, "allowed": allowed,
                      "bytes": found.unlisted_bytes, "logged_denied": kept[False],
                      "logged_allowed": kept[True]},
        )  # fmt: skip
        self.say(f"  egress FLOOD: {denied} denied and {allowed} allowed requests counted "
                 "(build.egress.flood)")  # fmt: skip

    # -- COPY and ADD --------------------------------------------------------------------

    def _copy_plan(
        self, state: _State, instruction: Instruction
    ) -> tuple[str, Callable[[str], int], StepSpec]:
        variables = state.variables()
        words = [self._expand(w, variables, instruction) for w in instruction.words]
        *sources, dest = words
        workdir = state.config.get("WorkingDir") or "/"
        into_folder = dest.endswith(("/", "/.")) or dest in (".", "..") or len(sources) > 1
        dest_path = posixpath.normpath(posixpath.join(workdir, dest))
        chown = instruction.flag("chown")
        chmod_text = instruction.flag("chmod")
        chmod = _mode(chmod_text, self.file, instruction) if chmod_text else None
        where = f"{self.file.where(instruction.line)}: {instruction.keyword}"
        source_stage = instruction.flag("from")
        heredocs = dict(instruction.heredocs)
        if source_stage is not None:
            source_image = self._source_image(
                self._expand(source_stage, self.global_args, instruction), instruction.line
            )
            parts = [source_image, *sources, dest, chown or "", chmod_text or ""]

            def apply_from(container: str) -> int:
                owner = self._owner(container, chown, where)
                into = into_folder or self.engine.is_folder(container, dest_path)
                return self._copy_from(container, source_image, sources, dest_path, into,
                                       owner, chmod, where)  # fmt: skip

            spec = self._spec(state, [])
            return self._key(state, instruction, parts), apply_from, spec
        placed: list[Placed] = []
        retarget: list[tuple[int, str]] = []
        """A file copied to ``dest``, and where it goes when ``dest`` is a folder."""
        archives: list[tuple[Item, str]] = []
        digests: list[str] = []
        urls: list[_UrlSource] = []
        checksum = instruction.flag("checksum")
        for source in sources:
            if instruction.keyword == "ADD" and is_url(source):
                url = self._url_source(source, checksum, dest_path, into_folder, instruction,
                                       where)  # fmt: skip
                urls.append(url)
                digests.append(f"url:{source}:sha256:{url.digest()}")
                continue
            if source.startswith("<<") and source.lstrip("<-").strip("\"'") in heredocs:
                content = heredocs[source.lstrip("<-").strip("\"'")]
                target = posixpath.join(dest_path, source) if into_folder else dest_path
                retarget.append((len(placed), posixpath.join(dest_path, source.lstrip("<-"))))
                placed.append(Placed(target, None, content.encode()))
                digests.append(hashlib.sha256(content.encode()).hexdigest())
                continue
            for item in self.context.select(source, where):
                self.context.check(item, where)
                name = posixpath.basename(item.path) if item.path else ""
                if item.is_dir:
                    for inner in self.context.under(item):
                        self.context.check(inner, where)
                        relative = inner.path[len(item.path) :].lstrip("/")
                        placed.append(Placed(posixpath.join(dest_path, relative), inner))
                        digests.append(f"{relative}:{inner.mode:o}:{self.context.digest(inner)}")
                    continue
                target = posixpath.join(dest_path, name) if into_folder else dest_path
                if instruction.keyword == "ADD" and item.link is None:
                    with self.context.reader(item) as handle:
                        if is_archive(handle):
                            archives.append((item, dest_path))
                            digests.append(f"archive:{self.context.digest(item)}")
                            continue
                if not into_folder:
                    retarget.append((len(placed), posixpath.join(dest_path, name)))
                placed.append(Placed(target, item))
                digests.append(f"{target}:{item.mode:o}:{self.context.digest(item)}")
        parts = [dest_path, chown or "", chmod_text or "", *digests]

        def apply(container: str) -> int:
            owner = self._owner(container, chown, where)
            chosen = list(placed)
            folder = bool(retarget or (urls and not into_folder)) and self.engine.is_folder(
                container, dest_path
            )
            if retarget and folder:  # as Docker does
                for index, target in retarget:
                    chosen[index] = replace(chosen[index], target=target)
            # Everything counted before a byte is written: the files' sizes as walked, an
            # archive's members as it would unpack, each download's size.
            room = self._room()
            files = count(planned(chosen), room)
            total = files
            unpacked = []
            for item, target in archives:
                found = self._unpacked(item, target, room - total, where)
                unpacked.append(found)
                total += found
                if total > room:
                    raise self._too_much(where, f"{self.context.root / item.path} unpacks to",
                                         found)  # fmt: skip
            downloads = []
            for url in urls:
                member = self._download_member(url, instruction, folder, owner, chmod, where)
                downloads.append(member)
                total += ENTRY_BYTES + member[0].size
            if total > room:
                raise self._too_much(where, "adds", total)

            def refused(why: str) -> BuildRefused:
                return BuildRefused(f"{where}: {why}")

            if chosen:
                members = tar_members(self.context, chosen, owner=owner, chmod=chmod)
                self.engine.put_archive(container, stream(members, files, refused))
            for (item, target), size in zip(archives, unpacked, strict=True):
                with self.context.reader(item) as handle:
                    members = _owned(unpack_members(handle, target, where),
                                     owner if chown else None)  # fmt: skip
                    self.engine.put_archive(container, stream(members, size, refused))
            if downloads:
                self.engine.put_archive(container, stream(downloads, total, refused))
            return total

        return self._key(state, instruction, parts), apply, self._spec(state, [])

    # -- ADD <url> -------------------------------------------------------------------------

    def _url_source(
        self, url: str, checksum: str | None, dest: str, into_folder: bool,
        instruction: Instruction, where: str,
    ) -> _UrlSource:  # fmt: skip
        """An ``ADD`` URL: checked against the allowlist, and fetched now unless
        ``--checksum`` names its content (then the cache key needs no download)."""
        check_url(url, self.allow, where)
        if into_folder:
            file_name(url, where)  # refused now, before anything is fetched
        source = _UrlSource(url=url, dest=dest, into_folder=into_folder)
        if checksum is not None:
            source.expected = parse_checksum(checksum, where)
        else:
            source.download = self._download(url, instruction.line, where)
        return source

    def _download_member(
        self, source: _UrlSource, instruction: Instruction, folder: bool,
        owner: tuple[int, int], chmod: int | None, where: str,
    ) -> Member:  # fmt: skip
        """The file a URL gave, as a member for the step's layer: mode 0600 (``--chmod``),
        never unpacked; into ``dest`` when that is a folder (``dest/``, or one in the
        image)."""
        download = source.download or self._download(source.url, instruction.line, where)
        source.download = download
        if source.expected is not None and download.digest != source.expected:
            raise BuildRefused(
                f"{where}: {source.url}: checksum mismatch: --checksum=sha256:{source.expected}"
                f", the download is sha256:{download.digest}"
            )
        target = source.dest
        if source.into_folder or folder:  # as Docker does
            target = posixpath.join(source.dest, file_name(source.url, where))
        info = tarfile.TarInfo(target.lstrip("/"))
        info.size, info.mtime = download.size, download.mtime
        info.mode = chmod if chmod is not None else URL_MODE
        info.uid, info.gid = owner
        download.data.seek(0)
        return info, chunks_of(download.data, download.size)

    def _download(self, url: str, line: int, where: str) -> _Download:
        """``url`` fetched through the egress proxy, redirects checked against the
        allowlist one by one; the body read back and its digest taken here."""
        current, hops = url, 0
        while True:
            answer, download = self._fetch_once(current, line, where)
            if download is not None:
                return download
            if answer.status in (301, 302, 303, 307, 308):
                current = next_url(current, answer, self.allow, where, hops)
                hops += 1
                continue
            said = " by the egress proxy" if answer.proxy else ""
            raise BuildRefused(
                f"{where}: {current}: answered {answer.status} {answer.reason}{said}".rstrip()
            )

    def _fetch_once(self, url: str, line: int, where: str) -> tuple[Answer, _Download | None]:
        self.say(f"  fetching {url}")
        spec = StepSpec(image=PROXY_IMAGE, command=["python3", "-c", SCRIPT, url, PROXY_URL],
                        user=f"{FETCH_USER}:{FETCH_USER}", workdir=FOLDER,
                        build_id=self.build_id, network=self._open_network())  # fmt: skip
        limits = self._step_limits()
        container = self.engine.create(spec, limits)
        try:
            folder = tarfile.TarInfo(FOLDER.lstrip("/"))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o700
            folder.uid = folder.gid = FETCH_USER
            members: list[Member] = [(folder, None)]
            bundle = _ca_bundle() if url.lower().startswith("https:") else None
            if bundle is not None:
                info = tarfile.TarInfo(CA_FILE.lstrip("/"))
                info.size, info.mode = len(bundle), 0o644
                members.append((info, [bundle]))
            self._put(container, members, where)
            said = bytearray()

            def keep(chunk: bytes) -> None:
                said.extend(chunk)
                del said[:-_FETCH_OUTPUT]

            since = datetime.now(UTC)
            try:
                outcome = self.engine.run(container, limits, self.deadline, keep)
            finally:
                self._record_egress(line, since)
            if outcome.timed_out:
                raise StepFailed(
                    f"{where}: {url}: still downloading at the build's time limit "
                    f"({self.limits.timeout_s:g} s): stopped",
                    125,
                )
            answer = answer_of(said.decode("utf-8", errors="replace"))
            too_big = answer is not None and answer.too_big
            if outcome.disk_exceeded or too_big or outcome.exit_code == 128 + 25:  # SIGXFSZ
                raise BuildRefused(f"{where}: {url}: larger than {self._over()}: stopped")
            if answer is None:
                memory = " (killed at the memory limit)" if outcome.oom else ""
                raise BuildRefused(
                    f"{where}: {url}: the download failed (exit {outcome.exit_code}){memory}"
                )
            if answer.error:
                raise BuildRefused(f"{where}: {url}: {answer.error}")
            if answer.status != 200:
                return answer, None
            return answer, self._read_download(container, answer, url, where)
        finally:
            self.engine.remove(container)

    def _read_download(self, container: str, answer: Answer, url: str, where: str) -> _Download:
        data = self.downloads.enter_context(tempfile.SpooledTemporaryFile(_SPOOL))  # noqa: SIM115 (closed with the build)
        digest, size = hashlib.sha256(), 0
        stream = _ChunkReader(self.engine.get_archive(container, DOWNLOAD))
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                body = tar.extractfile(member) if member.isreg() else None
                if body is None or posixpath.basename(member.name) != "download":
                    continue
                while chunk := body.read(1 << 20):
                    size += len(chunk)
                    if size > self._room():
                        raise BuildRefused(f"{where}: {url}: larger than {self._over()}")
                    digest.update(chunk)
                    data.write(chunk)
        if size != answer.size:
            raise BuildRefused(f"{where}: {url}: the download was cut short")
        return _Download(data, digest.hexdigest(), size, _mtime(answer.modified))

    def _source_image(self, source: str, line: int) -> str:
        stage = self.file.stage_named(source)
        if stage is not None and stage.index in self.results:
            return self.results[stage.index].image
        return self._local_image(source, line, "COPY")[0]

    def _copy_from(
        self, container: str, image: str, sources: list[str], dest: str, into_folder: bool,
        owner: tuple[int, int], chmod: int | None, where: str,
    ) -> int:  # fmt: skip
        """``COPY --from``: the sources' archives read from the image twice, once to count
        what they add (before anything is written), then streamed into the step."""
        for source in sources:
            if any(c in source for c in "*?["):
                raise BuildRefused(f"{where}: --from: wildcards are not supported")
        source_container = self.engine.create(StepSpec(image=image, command=[]), self.limits)
        try:

            def members(content: bool) -> Iterator[Member]:
                for source in sources:
                    try:
                        chunks = self.engine.get_archive(source_container, source)
                    except FileNotFoundError:
                        raise BuildRefused(f"{where}: {source}: not found in {image}") from None
                    yield from _rebased(_ChunkReader(chunks), dest, into_folder, owner, chmod,
                                        where, content=content)  # fmt: skip

            room = self._room()
            total = count((m for m, _ in members(False)), room)
            if total > room:
                raise self._too_much(where, "adds", total)

            def refused(why: str) -> BuildRefused:
                return BuildRefused(f"{where}: {why}")

            self.engine.put_archive(container, stream(members(True), total, refused))
            return total
        finally:
            self.engine.remove(source_container)

    def _too_much(self, where: str, what: str, size: int) -> BuildRefused:
        return BuildRefused(
            f"{where}: {what} at least {_mib(size)} (apparent sizes, a block per entry): "
            f"more than {self._over()} to its layer: nothing was written"
        )

    def _unpacked(self, item: Item, target: str, room: int, where: str) -> int:
        """What ``ADD`` of the archive ``item`` would add, from its members' headers (the
        count stops once past ``room``: a bomb is never unpacked, here or anywhere)."""
        with self.context.reader(item) as handle:
            headers = (m for m, _ in unpack_members(handle, target, where, content=False))
            return count(headers, room)

    def _owner(self, container: str, chown: str | None, where: str) -> tuple[int, int]:
        """``--chown=user[:group]`` as numbers, names read from the image's own files."""
        if not chown:
            return 0, 0
        user, _, group = chown.partition(":")
        uid = self._id(container, "/etc/passwd", user, where) if user else 0
        if group:
            gid = self._id(container, "/etc/group", group, where)
        elif user.isdigit():
            gid = uid
        else:
            gid = int(self._entry(container, "/etc/passwd", user, where)[3])
        return uid, gid

    def _id(self, container: str, table: str, name: str, where: str) -> int:
        return int(name) if name.isdigit() else int(self._entry(container, table, name, where)[2])

    def _entry(self, container: str, table: str, name: str, where: str) -> list[str]:
        try:
            stream = self.engine.get_archive(container, table)
        except FileNotFoundError:
            raise BuildRefused(f"{where}: --chown={name}: the image has no {table}") from None
        with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                data = tar.extractfile(member)
                text = data.read(1 << 20).decode("utf-8", "replace") if data else ""
                for line in text.splitlines():
                    fields = line.split(":")
                    if fields[0] == name and len(fields) > 3 and fields[2].isdigit():
                        return fields
        raise BuildRefused(f"{where}: --chown: no '{name}' in the image's {table}")

    # -- the end of a stage ----------------------------------------------------------------

    def _finish(self, state: _State, extra_labels: Mapping[str, str]) -> str:
        """The stage's image with its configuration committed (and ``extra_labels``)."""
        if not state.pending and not extra_labels:
            return state.image
        config = dict(state.config)
        config["Labels"] = {**(config.get("Labels") or {}), **extra_labels}
        key = self._mac(
            json.dumps(
                [BUILDER_VERSION, state.image, *state.pending, config], sort_keys=True, default=str
            )
        )
        image = None if self.no_cache else self.engine.cached(key, state.image)
        if image is None:
            container = self.engine.create(self._spec(state, []), self.limits)
            try:
                image = self.engine.commit(container, self.commit_config(config, key))
            finally:
                self.engine.remove(container)
            self.committed.append(image)
        state.image, state.pending, state.config = image, [], config
        return image

    def _context_digest(self) -> str:
        hasher = hashlib.sha256()
        for path, item in sorted(self.context.items.items()):
            if not path:
                continue
            kind = item.mode & 0o170000
            content = (
                self.context.digest(item)
                if item.is_dir or item.link is not None or kind == 0o100000
                else "special"
            )
            hasher.update(f"{path}\0{item.mode:o}\0{content}\n".encode())
        return hasher.hexdigest()


def _shell_text(instruction: Instruction) -> str:
    text = " ".join(instruction.words)
    if not instruction.heredocs:
        return text
    markers = text.split()
    if all(m.startswith("<<") for m in markers) and len(instruction.heredocs) == 1:
        return instruction.heredocs[0][1]
    bodies = "".join(f"{content}{name}\n" for name, content in instruction.heredocs)
    return f"{text}\n{bodies}"


def _mode(text: str, file: Dockerfile, instruction: Instruction) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise file.refuse(instruction, f"--chmod={text}: expected an octal mode") from None
    if not 0 <= mode <= 0o7777:
        raise file.refuse(instruction, f"--chmod={text}: out of range")
    return mode


def _nanoseconds(text: str, file: Dockerfile, instruction: Instruction) -> int:
    units = {"ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(text[: -len(unit)]) * units[unit])
    raise file.refuse(instruction, f"{text}: expected a duration such as 30s")


class _ChunkReader:
    """A file-like view of a stream of chunks (for ``tarfile`` in stream mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.buffer = chunks, b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.buffer) < size:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.buffer += chunk
        if size < 0:
            data, self.buffer = self.buffer, b""
        else:
            data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data


def _rebased(
    source: _ChunkReader, dest: str, into_folder: bool, owner: tuple[int, int],
    chmod: int | None, where: str, *, content: bool = True,
) -> Iterator[Member]:  # fmt: skip
    """Members of an image's archive (``COPY --from``) renamed under ``dest``: a folder's
    content into it, a file to it (or into it, for ``dest/``); hard links between them
    kept, renamed the same way. Without ``content``, the headers only (data skipped)."""
    with tarfile.open(fileobj=source, mode="r|") as archive:  # type: ignore[call-overload]
        top: str | None = None
        folder = False

        def renamed(name: str) -> str | None:
            parts = name.strip("/").split("/")
            if ".." in parts or parts[0] != top:
                raise BuildRefused(f"{where}: --from: unexpected member {name}")
            rest = "/".join(parts[1:])
            if folder:
                return posixpath.join(dest, rest).lstrip("/") if rest else None
            return (posixpath.join(dest, parts[0]) if into_folder else dest).lstrip("/")

        while (member := archive.next()) is not None:
            archive.members.clear()  # never kept: a stream of millions of headers
            if top is None:
                top, folder = member.name.strip("/").split("/")[0], member.isdir()
            if member.isdev() or member.isfifo():
                raise BuildRefused(f"{where}: --from: {member.name} is a device or FIFO")
            name = renamed(member.name)
            if name is None:
                continue
            copy = member.replace(name=name, uid=owner[0], gid=owner[1], uname="", gname="")
            if chmod is not None and not copy.issym():
                copy.mode = chmod
            if copy.islnk():
                copy.linkname = renamed(member.linkname) or ""
            data = archive.extractfile(member) if content and member.isreg() else None
            yield copy, chunks_of(data, member.size) if data is not None else None


def _owned(members: Iterator[Member], owner: tuple[int, int] | None) -> Iterator[Member]:
    """An archive's members owned by ``owner`` (``--chown``; None: as the archive says),
    without the archive's user and group names."""
    for member, data in members:
        if owner is not None:
            member.uid, member.gid = owner
        member.uname = member.gname = ""
        yield member, data


def _mib(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


@dataclass
class _Download:
    """A body ``ADD <url>`` fetched: spooled on the host, its digest taken here."""

    data: IO[bytes]
    digest: str
    size: int
    mtime: int


@dataclass
class _UrlSource:
    """One URL source of an ``ADD``: its destination, what ``--checksum`` expects, and its
    download (fetched when the cache key is made, or when the step runs)."""

    url: str
    dest: str
    into_folder: bool
    expected: str | None = None
    download: _Download | None = None

    def digest(self) -> str:
        if self.expected is not None:
            return self.expected
        assert self.download is not None
        return self.download.digest


def _mtime(modified: str) -> int:
    """The server's ``Last-Modified`` (Docker keeps it as the file's time), else now."""
    try:
        return int(parsedate_to_datetime(modified).timestamp()) if modified else int(time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return int(time.time())


def _ca_bundle() -> bytes | None:
    """The host's trusted certificates (read here, never a worker's path), or None."""
    for path in CA_BUNDLES:
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            return handle.read(4 << 20)
    return None
