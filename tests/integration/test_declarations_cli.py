"""Declarations that crash or lie, through the real console entry point (no Docker needed).

Each case runs ``python -m orchestrator plan`` in a subprocess and expects exit 125 with one
line per problem on stderr, never a traceback.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import cli


def plan(project, worker="w"):
    return cli("plan", worker, "--project", str(project.root))


def refused(result, count=1):
    assert result.returncode == 125, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == count, lines
    assert all(line.startswith("orchestrator: error: ") for line in lines)
    return lines


@pytest.mark.parametrize(
    "nested",
    ["[" * 1000 + "]" * 1000, "{a: " * 1000 + "1" + "}" * 1000],
    ids=["sequences", "mappings"],
)
def test_deeply_nested_worker_and_project_files(project, nested):
    project.worker("w", f'command: ["true"]\nenv: {nested}')
    (line,) = refused(plan(project))
    assert "w.worker:3: invalid YAML: nested deeper than 32 levels" in line
    (project.root / "orchestrator.yaml").write_text(f"zones: {nested}\n")
    (line,) = refused(plan(project))
    assert "orchestrator.yaml:1: invalid YAML: nested deeper than 32 levels" in line


def test_duplicate_zone_key_names_both_lines(project):
    project.zone("z")
    (project.root / "orchestrator.yaml").write_text(
        "zones:\n  z: {path: z, mode: ro}\n  z: {path: /etc, mode: ro}\n"
    )
    project.worker("w", 'command: ["true"]')
    (line,) = refused(plan(project))
    assert line.endswith(
        "orchestrator.yaml:3: zones: duplicate key 'z' (first at line 2); keep one"
    )


def test_every_problem_of_a_declaration_at_once(project):
    project.zone("data")
    project.worker(
        "w",
        'command: ["true"]\nenv: {A: [1], B: ok}\nresources: {memory: 1k, cpus: 0, timeout: 0}\n'
        "sandbox: {zones: [{name: data, mode: rw}, {name: nope}]}",
    )
    lines = refused(plan(project), count=6)
    joined = "\n".join(lines)
    # Field errors do not hide the grant's: both zone problems are named too.
    assert "w.worker:5: sandbox.zones[0]: asks rw on zone 'data'" in joined  # lines too
    assert "w.worker:5: sandbox.zones[1]: zone 'nope' is not declared" in joined
    assert "env.A: must be a string, number or boolean, not a list; quote it" in joined
    assert "resources.memory: 1 KiB is below the engine's minimum memory limit of 6 MiB" in joined
    assert "resources.cpus: 0 is below the engine's minimum of 0.01 CPUs" in joined
    assert "resources.timeout:" in joined


def test_tmp_larger_than_memory_is_refused(project):
    project.worker("w", 'command: ["true"]\nresources: {memory: 64m, tmp: 999t}')
    (line,) = refused(plan(project))
    assert (
        "w.worker:3: resources.tmp: a 999 TiB /tmp is more than the run's memory limit (64 MiB)"
        in line
    )


def test_zone_resolving_into_proc_is_refused(project):
    (project.root / "orchestrator.yaml").write_text("zones:\n  stats: {path: /proc/self}\n")
    project.worker("w", 'command: ["true"]')
    (line,) = refused(plan(project))
    assert "orchestrator.yaml:2: zones.stats.path: '/proc/self' resolves to /proc/self" in line
    assert "inside /proc" in line


def test_a_link_on_a_zone_path_is_refused_naming_it(project):
    (project.root / "stats").symlink_to("/proc/self")
    (project.root / "orchestrator.yaml").write_text("zones:\n  stats: {path: stats}\n")
    project.worker("w", 'command: ["true"]')
    (line,) = refused(plan(project))
    assert (
        f"orchestrator.yaml:2: zones.stats.path: 'stats' leads through a symbolic link: "
        f"{project.root / 'stats'} -> /proc/self; links are never followed" in line
    )


def test_plan_marks_a_zone_outside_the_project(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project.root / "orchestrator.yaml").write_text(f"zones:\n  ext: {{path: {elsewhere}}}\n")
    project.worker("w", 'command: ["true"]\nsandbox: {zones: [{name: ext}]}')
    result = plan(project)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("  /ext ")]
    assert line.split() == [
        "/ext",
        "ro",
        str(elsewhere.resolve()),
        "[outside",
        "the",
        "project",
        "folder]",
    ]
