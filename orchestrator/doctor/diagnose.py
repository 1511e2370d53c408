"""``orchestrator doctor``: read the facts, apply ``--fix``, judge, run the self-test.

The engine must answer (otherwise :class:`~orchestrator.errors.EngineUnreachable` is
raised: the doctor cannot run, exit 125); everything else becomes a row of the report,
including a project file that does not load, so one run shows every problem at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.doctor import checks, firewall, host
from orchestrator.doctor.checks import Check, Report
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.config import Project, ProjectConfig, WorkerConfig
    from orchestrator.docker import DockerEngine
    from orchestrator.docker.inspection import EngineFacts

Progress = Callable[[str], None]


@dataclass
class _ProjectView:
    """What the checks need from the project (or the defaults when there is none)."""

    folder: Path
    sandbox_root: Path
    images: list[str]
    isolations: list[str]
    check: Check
    loaded: Project | None = None
    builds: bool = False
    """The project file has a ``build:`` section: it builds Dockerfiles."""
    problems: list[str] = field(default_factory=list)


def diagnose(
    project_dir: Path,
    *,
    fix: bool = False,
    egress: bool = True,
    tools: bool = True,
    progress: Progress = lambda _: None,
    engine: DockerEngine | None = None,
) -> Report:
    """Check this machine for running ``project_dir``'s workers; see :class:`Report`."""
    from orchestrator.docker import DockerEngine
    from orchestrator.docker.images import WORKER_IMAGE
    from orchestrator.docker.inspection import engine_facts, images_present
    from orchestrator.docker.runtimes import BUILD_RUNTIMES, GVISOR_ARGS, setup_command
    from orchestrator.egress import PROXY_IMAGE

    engine = engine or DockerEngine()
    facts = engine_facts(engine)  # no engine: the doctor itself cannot run
    project = _project(project_dir)
    report = Report()
    if fix:
        report.checks += _apply_fixes(facts, report.fixed)
    state = firewall.firewall_state()
    cgroup = host.cgroup_version()
    max_userns = host.max_user_namespaces()
    disk = host.disk_free(project.sandbox_root)
    upstream = host.embedded_upstream()
    images = images_present(
        engine, list(dict.fromkeys([WORKER_IMAGE, PROXY_IMAGE, *project.images]))
    )

    report.checks += [
        checks.engine_check(facts),
        checks.runtimes_check(
            facts,
            gvisor=tuple(GVISOR_ARGS),
            needed="gvisor" in project.isolations,
            setup=setup_command(),
        ),
        checks.build_runtimes_check(
            facts,
            wanted={name: GVISOR_ARGS[name] for name in BUILD_RUNTIMES},
            needed=project.builds,
            setup=setup_command(),
        ),
        checks.seccomp_check(facts),
        checks.cgroups_check(facts, cgroup),
        checks.rootless_check(facts),
        checks.userns_check(facts, max_userns),
        checks.disk_check(disk),
        checks.images_check(images, {WORKER_IMAGE, PROXY_IMAGE}),
        *checks.firewall_checks(state, facts, podman=_podman(engine)),
        checks.dns_cve_check(facts, upstream, podman=_podman(engine)),
        project.check,
    ]
    report.facts = {
        "engine": facts.to_dict(),
        "host": {
            "cgroup_version": cgroup,
            "cgroup_controllers": host.cgroup_controllers(),
            "max_user_namespaces": max_userns,
            "root": host.is_root(),
            "embedded_dns_upstream": {
                "source": upstream.source,
                "servers": upstream.servers,
                "loopback": upstream.loopback,
            },
        },
        "disk": {
            "path": str(disk.path),
            "measured": str(disk.measured),
            "free": disk.free,
            "total": disk.total,
        },
        "images": images,
        "firewall": {
            "checked": state.checked,
            "reason": state.reason or None,
            "rule": state.rule,
            "plain_rule": state.plain_rule,
            "resolvers": state.resolvers,
            "dns_rules": state.dns_rules,
            "engine_dns": state.engine_dns,
            "command": firewall.command("-I", firewall.RULE),
        },
        "project": {
            "folder": str(project.folder),
            "loaded": project.loaded is not None,
            "sandbox_root": str(project.sandbox_root),
            "isolations": project.isolations,
        },
    }
    if tools:
        report.checks.append(_everyday(facts, WORKER_IMAGE, images, progress))
    if egress:
        from orchestrator.doctor.selftest import egress_selftest

        report.checks += egress_selftest(
            engine, image=WORKER_IMAGE, isolations=project.isolations, progress=progress
        )
    return report


def _everyday(facts: EngineFacts, image: str, images: dict[str, bool], progress: Progress) -> Check:
    """Everyday tools in one gVisor worker (:mod:`.tools`), when gVisor can run at all."""
    from orchestrator.docker import runsc
    from orchestrator.docker.runtimes import GVISOR_NONE
    from orchestrator.doctor.tools import NAME, everyday_check

    path = facts.runtimes.get(GVISOR_NONE)
    if path is None:
        return Check(NAME, "pass", "not checked: gVisor is not registered (see runtimes)")
    if not images.get(image, False):
        return Check(NAME, "pass", f"not checked: no {image} (see images)")
    version = runsc.version(str(path)) if facts.local else f"runsc at {path}"
    return everyday_check(image=image, runsc_version=version, progress=progress)


def _apply_fixes(facts: EngineFacts, done: list[str]) -> list[Check]:
    """``--fix``: the firewall rule (and its DNS exceptions); rows only for what went wrong."""
    if facts.rootless or not facts.local:
        why = "a rootless engine" if facts.rootless else "the engine runs on another machine"
        return [Check("firewall fix", "warn", f"not applied: {why}")]
    try:
        done += firewall.apply_fix()
    except firewall.FirewallError as exc:
        return [Check("firewall fix", "fail", f"not applied: {exc}")]
    return []


def _project(folder: Path) -> _ProjectView:
    """The project in ``folder``; its defaults (sandbox root, image, isolation) when there
    is no project file, and a failing row when there is one that does not load."""
    from orchestrator.config import PROJECT_FILE, ProjectConfig, load_project

    defaults = ProjectConfig()
    root = folder.expanduser().resolve()
    view = _ProjectView(
        folder=root,
        sandbox_root=root / defaults.sandbox.root,
        images=[defaults.defaults.image],
        isolations=_isolations(defaults, []),
        check=Check("project", "pass", f"no {PROJECT_FILE} in {root}: checked the defaults"),
    )
    if not (root / PROJECT_FILE).is_file():
        return view
    try:
        project = load_project(root)
    except ConfigError as exc:
        view.check = Check(
            "project", "fail", " | ".join(exc.problems), f"fix {root / PROJECT_FILE}"
        )
        return view
    workers = _workers(project)
    view.loaded = project
    view.sandbox_root = project.sandbox_root
    view.images = [project.config.defaults.image, *(w.image for w in workers if w.image)]
    view.isolations = _isolations(project.config, workers)
    view.builds = "build" in project.config.model_fields_set
    view.check = Check(
        "project",
        "pass",
        f"{project.file}: {len(workers)} worker{'s load' if len(workers) != 1 else ' loads'}; "
        "isolation used: "
        f"{', '.join(view.isolations)}",
    )
    return view


def _workers(project: Project) -> list[WorkerConfig]:
    """The configs of the project's worker files that load (the others are ``plan``'s to
    explain)."""
    from orchestrator.config import load_worker
    from orchestrator.config.loader import WORKER_SUFFIX

    if not project.workers_dir.is_dir():
        return []
    found: list[WorkerConfig] = []
    for file in sorted(project.workers_dir.glob(f"*{WORKER_SUFFIX}")):
        try:
            found.append(load_worker(project, str(file)).config)
        except ConfigError:
            continue
    return found


def _isolations(config: ProjectConfig, workers: list[WorkerConfig]) -> list[str]:
    """The isolations the project's runs would use: each trust level's, and any a worker
    asks for itself; weakest first."""
    from orchestrator.config.models import ISOLATION_ORDER

    used = set(config.isolation.model_dump().values())
    used |= {w.isolation for w in workers if w.isolation}
    return [isolation for isolation in ISOLATION_ORDER if isolation in used]


def _podman(engine: DockerEngine) -> bool:
    """Whether the engine is Podman (Docker Engine's CVEs are not its own)."""
    from orchestrator.docker.podman import engine_kind

    return engine_kind(engine).podman
