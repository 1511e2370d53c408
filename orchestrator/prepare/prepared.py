"""Getting a run ready: trust, session, grant and plan, checked and compiled.

:func:`prepare` is pure (no engine, no zone I/O beyond looking for ``.git``), so ``plan``
shows exactly what ``run`` will do. The host folders a run mounts are made later, just
before its container is created (:func:`orchestrator.runtime.host_folders.make_host_folders`).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.config import Project, Worker, load_worker
from orchestrator.config.models import Trust
from orchestrator.errors import ConfigError
from orchestrator.plan import ContainerSpec, compile_plan
from orchestrator.policy import Grant, RunPaths, effective_trust, grant_for, worker_identity
from orchestrator.prepare.inputs import InputSpec, check_inputs
from orchestrator.timeouts import MAX_TIMEOUT_S, seconds_problem

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Prepared:
    """A run ready to start: its grant, compiled spec and identities."""

    project: Project
    worker: Worker
    grant: Grant
    spec: ContainerSpec
    paths: RunPaths
    uid: int
    gid: int
    fresh_session: bool = False
    """The session was made for this run (no ``--session``): its folder goes if left empty."""
    inputs: tuple[InputSpec, ...] = ()
    """Checked inputs, placed in the run's ``/inputs`` folder when it opens."""

    @property
    def session_id(self) -> str:
        return self.spec.session_id


def _argument_problems(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Arguments and environment values reach the engine as JSON text: a NUL cannot, and
    bytes that are not UTF-8 (decoded with surrogates from the command line) would arrive
    changed, so both are refused rather than altered."""
    problems: list[str] = []
    for where, value in [(f"argument {i}", a) for i, a in enumerate(args, 1)] + [
        (f"--env {name}", v) for name, v in env.items()
    ]:
        if "\0" in value:
            problems.append(f"{where} holds a NUL character")
        elif not _is_utf8(value):
            problems.append(
                f"{where} is not valid UTF-8 (the engine passes text only); "
                "give such bytes in an input file"
            )
    return problems


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_name(kind: str, value: str) -> str:
    if not NAME.match(value):
        raise ConfigError(
            [f"--{kind} '{value}' is invalid; use letters, digits, '.', '_' or '-' (max 64)"]
        )
    return value


def prepare(
    project: Project,
    worker: Worker,
    *,
    run_id: str | None = None,
    timeout: float | None = None,
    trust: Trust | None = None,
    promote: bool = False,
    session_id: str | None = None,
    workspace: str = "default",
    inputs: Sequence[str | os.PathLike[str]] = (),
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    input_slot: bool = False,
) -> Prepared:
    """Check the declarations and compile the plan, without touching Docker.

    ``inputs`` (host files or folders, checked now: see :mod:`orchestrator.prepare.inputs`)
    are placed at ``/inputs/<name>`` when the run opens; ``input_slot`` gives the run an
    ``/inputs`` folder without inputs yet (filled later by ``place_inputs``, e.g. for a run
    opened ahead of need). ``env`` is added to the worker's environment and ``args`` to its
    command; both are part of the plan, so a container created from it gets them.
    """
    problems = _argument_problems(args, env or {})
    if timeout is not None and (problem := seconds_problem(timeout, MAX_TIMEOUT_S)):
        problems.append(f"timeout: {problem}; give at most {MAX_TIMEOUT_S} (a week)")
    if problems:
        raise ConfigError(problems)
    checked = check_inputs(project, worker, inputs) if inputs else ()
    run_id = run_id or new_id()
    fresh = not session_id
    session_id = check_name("session", session_id) if session_id else new_id()
    paths = RunPaths.of(
        project, session_id=session_id, workspace=check_name("workspace", workspace), run_id=run_id
    )
    level = effective_trust(worker.config.trust, trust, promote=promote)
    grant = grant_for(project, worker, paths, trust=level, timeout=timeout)
    prepared = compile_prepared(
        project,
        worker,
        grant,
        paths,
        run_id=run_id,
        session_id=session_id,
        inputs=bool(checked) or input_slot,
        env=env,
        args=args,
    )
    return replace(prepared, fresh_session=fresh, inputs=checked)


def load_and_prepare(project: Project, worker: str, **options: Any) -> Prepared:
    """Load a worker file (by name or path) and :func:`prepare` it.

    A file with invalid fields is still checked as far as it can be: its grant is computed
    without those fields, and every problem is reported at once.
    """
    try:
        loaded = load_worker(project, worker)
    except ConfigError as exc:
        if not isinstance(exc.partial, Worker):
            raise
        try:
            prepare(project, exc.partial, **options)
        except ConfigError as more:
            problems = exc.problems + [p for p in more.problems if p not in exc.problems]
            raise ConfigError(problems) from None
        raise
    return prepare(project, loaded, **options)


def compile_prepared(
    project: Project,
    worker: Worker,
    grant: Grant,
    paths: RunPaths,
    *,
    run_id: str,
    session_id: str,
    inputs: bool = False,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> Prepared:
    """Compile an already checked grant (a top-level run's, or a child's restricted one)."""
    uid, gid = worker_identity(project.root)
    spec = compile_plan(
        project,
        worker,
        grant,
        run_id=run_id,
        session_id=session_id,
        uid=uid,
        gid=gid,
        inputs=inputs,
        env=env,
        args=args,
    )
    return Prepared(project, worker, grant, spec, paths, uid, gid)
