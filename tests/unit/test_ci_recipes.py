"""The CI recipes in compose/ run the project's real commands on paths that exist.

Each shell line of the GitHub workflow and the GitLab job is split into commands; every
``make`` target must be in the Makefile, every ``orchestrator`` command (direct, or through
``docker compose run``) must parse against the real click command tree, and the files and
folders they name must be in the repository. The structure that makes them do what
docs/ci.md promises (cache, artifacts, the worker's exit code failing the job) is checked
too. ``docker-compose config`` and a real run through compose are in
tests/integration/test_compose.py.
"""

from __future__ import annotations

import glob
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml

from orchestrator.cli.main import cli
from orchestrator.cli.options import JsonRequest
from orchestrator.docker.images import ORCHESTRATOR_IMAGE

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose" / "compose.yaml"
GITHUB = REPO / "compose" / "github-actions.yml"
GITLAB = REPO / "compose" / "gitlab-ci.yml"

CONTROL = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}
REDIRECT = re.compile(r"^\d*(>|>>|<|>&|<&)$")
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "time"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: ``docker compose run`` options that take a value.
RUN_VALUE_OPTIONS = {"-e", "--env", "-v", "--volume", "-w", "--workdir", "-u", "--user",
                     "--name", "-l", "--label", "-p", "--publish", "--entrypoint"}  # fmt: skip


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def github_scripts() -> list[str]:
    workflow = load(GITHUB)
    return [
        step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step
    ]


def gitlab_jobs() -> dict[str, dict]:
    return {
        name: job for name, job in load(GITLAB).items() if isinstance(job, dict) and "script" in job
    }


def gitlab_scripts() -> list[str]:
    return [
        line
        for job in gitlab_jobs().values()
        for part in ("before_script", "script", "after_script")
        for line in job.get(part, [])
    ]


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script: operators, redirections, keywords and
    variable assignments taken off."""
    script = script.replace("\\\n", " ")
    found: list[list[str]] = []
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        skip_next = False
        for token in lexer:
            if skip_next:
                skip_next = False
                continue
            if token in CONTROL:
                found.append(current)
                current = []
            elif REDIRECT.match(token):
                skip_next = True
            elif not current and (token in KEYWORDS or ASSIGNMENT.match(token) or token == "["):
                if token == "[":  # a test: nothing in it is a command we check
                    current = ["["]
                continue
            else:
                current.append(token)
        found.append(current)
    return [command for command in found if command and command[0] != "["]


@dataclass
class Invocation:
    where: str
    args: list[str]


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE)}


def compose_services() -> dict:
    return load(COMPOSE)["services"]


def orchestrator_invocations(
    scripts: list[str], where: str, seen: dict[str, list[str]]
) -> list[Invocation]:
    """Every orchestrator command line the scripts run; make targets, compose files and
    services are checked on the way and recorded in ``seen``."""
    found = []
    for script in scripts:
        for argv in commands(script):
            if argv[0] == "sudo":
                argv = argv[1:]
            if argv[0] == "make":
                seen["make"] += [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
            elif Path(argv[0]).name == "orchestrator":
                assert argv[0] in {"orchestrator", ".venv/bin/orchestrator"}, argv
                found.append(Invocation(f"{where}: {shlex.join(argv)}", argv[1:]))
            elif argv[:2] == ["docker", "compose"] or argv[0] == "docker-compose":
                rest = argv[2:] if argv[0] == "docker" else argv[1:]
                invocation = compose_run(rest, f"{where}: {shlex.join(argv)}", seen)
                if invocation is not None:
                    found.append(invocation)
    return found


def compose_run(rest: list[str], where: str, seen: dict[str, list[str]]) -> Invocation | None:
    files = []
    while rest and rest[0].startswith("-"):
        option, rest = rest[0], rest[1:]
        if option in {"-f", "--file", "-p", "--project-name"}:
            if option in {"-f", "--file"}:
                files.append(rest[0])
            rest = rest[1:]
    assert files == ["compose/compose.yaml"], f"{where}: name the project's compose file"
    seen["paths"] += files
    assert rest[0] == "run", f"{where}: only `run` is expected here"
    rest = rest[1:]
    entrypoint = None
    while rest and rest[0].startswith("-"):
        option, rest = rest[0], rest[1:]
        if option in RUN_VALUE_OPTIONS:
            if option == "--entrypoint":
                entrypoint = rest[0]
            rest = rest[1:]
    service, args = rest[0], rest[1:]
    assert service in compose_services(), f"{where}: no service {service!r} in compose.yaml"
    return None if entrypoint else Invocation(where, args)


def check_orchestrator(invocation: Invocation) -> click.Context:
    """Parse the arguments the way the real command line does (nothing is run)."""
    args = list(invocation.args)
    command: click.Command = cli
    names = ["orchestrator"]
    while isinstance(command, click.Group) and args:
        found = command.get_command(click.Context(command), args[0])  # as the command line does
        if found is None:
            break
        command = found
        names.append(args[0])
        args = args[1:]
    assert names != ["orchestrator"], f"{invocation.where}: no such subcommand"
    try:
        return command.make_context(" ".join(names), args)
    except click.UsageError as exc:
        pytest.fail(f"{invocation.where}: {exc.format_message()}")
    finally:
        JsonRequest.asked = False


@pytest.fixture(params=["github", "gitlab"])
def recipe(request) -> tuple[str, list[str]]:
    return request.param, github_scripts() if request.param == "github" else gitlab_scripts()


def test_the_recipes_are_yaml_with_jobs():
    workflow = load(GITHUB)
    assert workflow["jobs"] and all(job["steps"] for job in workflow["jobs"].values())
    assert gitlab_jobs()


def test_every_command_is_a_real_orchestrator_command_and_make_target(recipe):
    name, scripts = recipe
    seen: dict[str, list[str]] = {"make": [], "paths": []}
    invocations = orchestrator_invocations(scripts, name, seen)
    subcommands = []
    for invocation in invocations:
        ctx = check_orchestrator(invocation)
        subcommands.append(ctx.info_name)
        project = ctx.params.get("project_dir")
        if project is not None:
            assert (REPO / project / "orchestrator.yaml").is_file(), invocation.where
            worker = ctx.params.get("worker")
            if worker is not None:
                assert (REPO / project / "workers" / f"{worker}.worker").is_file(), invocation.where
    assert "orchestrator run" in subcommands, f"{name}: no worker is run"
    assert seen["make"], f"{name}: the images are built with make"
    assert set(seen["make"]) <= makefile_targets(), seen["make"]
    for path in seen["paths"]:
        assert (REPO / path).is_file(), path


def test_the_command_checker_catches_what_it_should():
    seen: dict[str, list[str]] = {"make": [], "paths": []}
    bad = orchestrator_invocations(
        [".venv/bin/orchestrator run triage --projekt examples/triage > out.json"], "t", seen
    )
    with pytest.raises(pytest.fail.Exception, match="No such option '--projekt'"):
        check_orchestrator(bad[0])
    unknown = orchestrator_invocations(["orchestrator launch triage"], "t", seen)
    with pytest.raises(AssertionError, match="no such subcommand"):
        check_orchestrator(unknown[0])
    through_compose = orchestrator_invocations(
        [
            'x=$(docker compose -f compose/compose.yaml run --rm -T orchestrator staged show "$c" --json)'
        ],
        "t",
        seen,
    )
    assert check_orchestrator(through_compose[0]).info_name == "orchestrator staged show"
    assert commands('if [ -n "$c" ]; then make images; fi') == [["make", "images"]]


def test_github_caches_the_images_and_publishes_results_and_fails_on_the_exit_code():
    steps = load(GITHUB)["jobs"]["triage"]["steps"]
    uses = [step.get("uses", "").split("@")[0] for step in steps]
    assert uses[0] == "actions/checkout"
    restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore@"))
    key = restore["with"]["key"]
    patterns = re.findall(r"'([^']+)'", re.search(r"hashFiles\(([^)]*)\)", key).group(1))
    assert "images/**" in patterns
    for pattern in patterns:
        assert glob.glob(str(REPO / pattern), recursive=True), pattern
    saved = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
    assert saved["with"]["path"] == restore["with"]["path"]
    scripts = "\n".join(step.get("run", "") for step in steps)
    assert f"docker load --input {restore['with']['path']}" in scripts
    assert f"docker save --output {restore['with']['path']}" in scripts

    run = next(step for step in steps if step.get("id") == "run")
    assert not run.get("continue-on-error")
    lines = [line.strip() for line in run["run"].splitlines()]
    started = next(i for i, line in enumerate(lines) if " orchestrator run " in line)
    assert lines[started + 1] == "code=$?" and lines[-1] == "exit $code"

    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"].startswith("always()")
    assert upload["with"]["path"] == "results/"
    assert "results/run.json" in run["run"]


def test_gitlab_caches_the_images_and_publishes_results_and_fails_on_the_exit_code():
    (job,) = gitlab_jobs().values()
    assert not job.get("allow_failure")
    assert job["artifacts"]["when"] == "always" and "results/" in job["artifacts"]["paths"]
    # The zone the example's worker writes: the project file declares it.
    assert "examples/triage/output/" in job["artifacts"]["paths"]
    assert "path: output" in (REPO / "examples/triage/orchestrator.yaml").read_text()
    assert job["cache"]["paths"] == [".images/"]
    before = "\n".join(job["before_script"])
    assert "docker load --input .images/images.tar" in before
    assert "docker save --output .images/images.tar" in before
    (run,) = [line for line in job["script"] if "orchestrator run" in line]
    assert "||" not in run and run.endswith("> results/run.json")
    assert "results/run.json" in "\n".join(job["after_script"])


def test_compose_gives_the_socket_to_the_orchestrator_at_the_same_paths():
    services = compose_services()
    service = services["orchestrator"]
    assert service["image"] == ORCHESTRATOR_IMAGE
    assert service["pull_policy"] == "never"
    assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]
    assert "${PWD}:${PWD}" in service["volumes"] and service["working_dir"] == "${PWD}"
    others = [name for name, s in services.items() if name != "orchestrator"]
    assert not [n for n in others if "docker.sock" in str(services[n].get("volumes", ""))]
