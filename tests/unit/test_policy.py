"""Trust profiles, restriction algebra, approvals and host-side path checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import load_project, load_worker
from orchestrator.errors import PolicyError
from orchestrator.policy import RunPaths, ZoneView, covers, effective_trust, grant_for, restrict
from orchestrator.policy.network import narrower_or_equal
from orchestrator.policy.trust import rank


def paths_of(loaded, run_id="r1"):
    return RunPaths.of(loaded, session_id="s1", workspace="default", run_id=run_id)


def grant(project, name, **kwargs):
    loaded = load_project(project.root)
    return grant_for(loaded, load_worker(loaded, name), paths_of(loaded), **kwargs)


def targets(g):
    return {z.target: z.mode for z in g.zones}


# -- trust ------------------------------------------------------------------------------


def test_trust_can_be_lowered_but_raising_needs_promote():
    assert effective_trust("session", None, promote=False) == "session"
    assert effective_trust("session", "untrusted", promote=False) == "untrusted"
    with pytest.raises(PolicyError, match="pass --promote"):
        effective_trust("session", "full", promote=False)
    assert effective_trust("session", "full", promote=True) == "full"


@pytest.mark.parametrize(
    ("trust", "expected"),
    [
        ("untrusted", {"/session": "rw", "/workers": "ro", "/staged": "rw"}),
        ("session", {"/session": "rw", "/workspace": "rw", "/workers": "ro", "/staged": "rw"}),
        ("workspace", {"/session": "rw", "/workspace": "rw", "/workers": "ro", "/staged": "rw",
                       "/repo": "ro", "/repo/.git": "ro"}),
        ("full", {"/session": "rw", "/workspace": "rw", "/workers": "ro", "/staged": "rw",
                  "/repo": "rw", "/repo/.git": "ro", "/repo/orchestrator.yaml": "ro",
                  "/repo/workers": "ro"}),
    ],
)  # fmt: skip
def test_profiles(project, trust, expected):
    (project.root / ".git").mkdir()
    project.worker("w", f"trust: {trust}\nsandbox: {{}}")
    g = grant(project, "w")
    assert targets(g) == expected
    staged = next(z for z in g.zones if z.target == "/staged")
    assert staged.outbox  # always a fresh, capped tmpfs of the run's own
    if "/repo" in expected:
        assert g.masks == ("/repo/.sandbox",)


def test_policy_files_are_read_only_inside_every_writable_zone(project):
    (project.root / ".git").mkdir()
    (project.root / "keys").mkdir()
    (project.root / "keys" / "token").write_text("t")
    project.extra = (
        "credentials: {push: {source: file, path: keys/token}}\nsandbox: {root: ../state}\n"
    )
    project.zone("src", "rw")
    project.zones["top"] = (".", "rw", "")
    project.write_project()
    project.worker(
        "w",
        "trust: full\nsandbox: {zones: [{name: top, mode: rw}, {name: src, mode: rw}]}",
    )
    g = grant(project, "w")
    guards = {z.target: z for z in g.zones if z.guard}
    for where in ("/repo", "/top"):
        # keys/token: its whole folder, which a worker could otherwise rename and replace
        for rel in ("orchestrator.yaml", "workers", "keys"):
            assert guards[f"{where}/{rel}"].read_only
    assert guards["/top/.git"].read_only  # /repo/.git is the standard zone's own
    assert targets(g)["/repo/.git"] == "ro"
    assert not any(t.startswith("/src/") for t in guards)  # nothing to guard there


def test_a_missing_credential_file_in_a_writable_zone_is_refused(project):
    (project.root / ".git").mkdir()
    project.extra = "credentials: {push: {source: file, path: token.txt}}\n"
    project.write_project()
    project.worker("w", "trust: full\nsandbox: {}")
    with pytest.raises(PolicyError, match=r"token.txt does not exist, and a worker could create"):
        grant(project, "w")
    project.worker("w", "trust: workspace\nsandbox: {}")  # /repo read-only: nothing to guard
    assert not any(z.guard for z in grant(project, "w").zones)


def test_a_writable_zone_inside_the_workers_folder_is_refused(project):
    (project.root / "workers" / "out").mkdir()
    project.zones["out"] = ("workers/out", "rw", "")
    project.write_project()
    project.worker("w", "trust: session\nsandbox: {zones: [{name: out, mode: rw}]}")
    with pytest.raises(PolicyError, match="reads its policy from"):
        grant(project, "w")


def test_untrusted_gets_project_zones_read_only_unless_marked_output(project):
    project.zone("notes", "rw")
    project.zone("out", "rw", extra="untrusted_output: true")
    project.worker("w", "sandbox: {zones: [{name: notes, mode: rw}]}")
    with pytest.raises(PolicyError, match="trust 'untrusted' gets project zones read-only"):
        grant(project, "w")
    project.worker("w", "sandbox: {zones: [{name: notes}, {name: out, mode: rw}]}")
    assert targets(grant(project, "w"))["/out"] == "rw"
    project.worker("w", "trust: session\nsandbox: {zones: [{name: notes, mode: rw}]}")
    assert targets(grant(project, "w"))["/notes"] == "rw"


def test_readonly_downgrades_every_zone(project):
    project.zone("out", "rw", extra="untrusted_output: true")
    project.worker("w", "sandbox: {readonly: true, zones: [{name: out, mode: rw}]}")
    assert set(targets(grant(project, "w")).values()) == {"ro"}


# -- approvals --------------------------------------------------------------------------


def test_blocked_write_mounts_read_only_and_ask_gets_a_private_copy(project):
    project.zone("out", "rw", extra="untrusted_output: true")
    project.worker("w", "sandbox: {zones: [{name: out, mode: rw, approval: {write: blocked}}]}")
    assert targets(grant(project, "w"))["/out"] == "ro"
    project.worker(
        "w",
        "sandbox: {zones: [{name: out, mode: rw, approval: {write: preApproved, delete: blocked}}]}",
    )
    with pytest.raises(PolicyError, match="approval.delete 'blocked' needs approval.write 'ask'"):
        grant(project, "w")
    project.worker(
        "w", "sandbox: {zones: [{name: out, mode: rw, restrict: a, approval: {write: ask}}]}"
    )
    with pytest.raises(PolicyError, match="'ask' with restrict is not supported"):
        grant(project, "w")
    project.worker("w", "sandbox: {zones: [{name: out, mode: rw, approval: {write: ask}}]}")
    asked = grant(project, "w").zone("out")
    assert asked.mode == "rw"
    assert asked.ask_base == (project.root / "out").resolve()  # the real zone...
    assert asked.host_path.parts[-3:] == ("r1", "ask", "out")  # ...and the private copy


# -- restriction --------------------------------------------------------------------------


@pytest.fixture
def family(project):
    project.zone("data", "rw", files={"sub/deep/x.txt": "x", "other/y.txt": "y"})
    project.zone("logs", "ro")
    project.worker(
        "main",
        "trust: session\nchildren: [kid]\nresources: {memory: 256m, timeout: 60}\n"
        "sandbox: {zones: [{name: data, mode: rw, restrict: sub}, {name: logs}]}",
    )
    return project


def restrict_kid(project, front):
    project.worker("kid", front)
    loaded = load_project(project.root)
    parent = grant_for(loaded, load_worker(loaded, "main"), paths_of(loaded))
    return restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))


@pytest.mark.parametrize(
    ("front", "message"),
    [
        (
            "trust: session\nsandbox: {zones: [{name: logs, mode: rw}]}",
            "asks rw on zone 'logs' but",
        ),
        ("trust: full\nsandbox: {}", "declares trust 'full' but parent 'main' runs at 'session'"),
        (
            "sandbox: {zones: [{name: data}]}",
            "asks for /data but parent 'main' only sees /data/sub",
        ),
        ("sandbox: {zones: [{name: data, restrict: other}]}", "only sees /data/sub"),
        ("resources: {memory: 1g}", "asks memory"),
        ("resources: {timeout: 600}", "asks timeout 600 s but parent 'main' has 60 s"),
        ("trust: session\nnetwork: full", "asks network 'full' but parent 'main' has 'none'"),
    ],
)
def test_child_asking_more_than_its_parent_is_refused(family, front, message):
    with pytest.raises(PolicyError, match=message):
        restrict_kid(family, front)


def test_child_problems_are_all_reported_at_once_with_human_sizes(family):
    front = (
        "trust: session\nresources: {memory: 2g, timeout: 600, cpus: 2, tmp: 4g}\n"
        "sandbox: {zones: [{name: logs, mode: rw}, {name: nope}, {name: data}]}"
    )
    with pytest.raises(PolicyError) as excinfo:
        restrict_kid(family, front)
    lines = excinfo.value.problems
    assert [line for line in lines if "kid.worker" in line] == [
        f"{family.root / 'workers' / 'kid.worker'}:4: sandbox.zones[0]: asks rw on zone 'logs' "
        f"but {family.root / 'orchestrator.yaml'} allows only ro; ask for ro or raise the "
        "zone's mode",
        f"{family.root / 'workers' / 'kid.worker'}:4: sandbox.zones[1]: zone 'nope' is not "
        f"declared in {family.root / 'orchestrator.yaml'} (zones: data, logs); add it there or "
        "remove it here",
        f"{family.root / 'workers' / 'kid.worker'}:3: resources.tmp: a 4 GiB /tmp is more than "
        "the run's memory limit (2 GiB), which its pages count against; lower tmp or raise "
        f"resources.memory in {family.root / 'workers' / 'kid.worker'}",
    ]
    joined = "\n".join(lines)
    assert "asks for /data but parent 'main' only sees /data/sub" in joined
    assert "asks memory 2 GiB but parent 'main' has 256 MiB" in joined
    assert "asks timeout 600 s but parent 'main' has 60 s" in joined
    assert "asks cpus 2 but parent 'main' has 1" in joined
    assert "e+0" not in joined


def test_grant_problems_are_all_reported_at_once(project):
    project.zone("logs", "ro")
    project.extra = "defaults: {resources: {memory: 64m, tmp: 128m}}\n"
    project.write_project()
    project.worker(
        "w",
        "trust: full\nsecrets: [token]\nsandbox: {zones: [{name: logs, mode: rw}, {name: x}]}",
    )
    with pytest.raises(PolicyError) as excinfo:
        grant(project, "w")
    lines = excinfo.value.problems
    assert len(lines) == 5, lines
    joined = "\n".join(lines)
    assert "has no .git" in joined  # trust full, repo rw without .git
    assert "asks rw on zone 'logs'" in joined
    assert "zone 'x' is not declared" in joined
    assert "secrets: 'token' is not in" in joined
    assert (
        f"{project.root / 'orchestrator.yaml'}: defaults.resources.tmp: a 128 MiB /tmp is more "
        "than the run's memory limit (64 MiB)" in joined
    )


def test_tmp_may_not_outgrow_the_memory_limit_but_may_equal_it(project):
    project.worker("w", 'command: ["true"]\nresources: {memory: 64m, tmp: 999t}')
    with pytest.raises(PolicyError, match=r"w\.worker:3: resources\.tmp: a 999 TiB /tmp is more"):
        grant(project, "w")
    project.worker("w", 'command: ["true"]\nresources: {memory: 64m, tmp: 64m}')
    assert grant(project, "w").limits.tmp == 64 << 20


def test_child_not_in_the_list_is_refused(family):
    loaded = load_project(family.root)
    family.worker("stranger", "{}")
    parent = grant_for(loaded, load_worker(loaded, "main"), paths_of(loaded))
    with pytest.raises(PolicyError, match="may not call 'stranger' .*children: kid"):
        restrict(parent, "main", loaded, load_worker(loaded, "stranger"), paths_of(loaded, "r2"))


def test_rw_on_ro_message_names_child_zone_and_parent(family):
    family.worker(
        "main", "trust: session\nchildren: [kid]\nsandbox: {zones: [{name: data, mode: ro}]}"
    )
    with pytest.raises(PolicyError, match="child 'kid' asks rw on 'data' but parent 'main' has ro"):
        restrict_kid(family, "trust: session\nsandbox: {zones: [{name: data, mode: rw}]}")


def test_child_narrows_and_inherits_capped_limits(family):
    child = restrict_kid(
        family, "sandbox: {readonly: true, zones: [{name: data, restrict: sub/deep}]}"
    )
    assert targets(child)["/data/sub/deep"] == "ro"
    assert child.limits.memory == 256 << 20  # capped to the parent's, not the built-in 512m
    assert child.limits.timeout == 60
    assert child.trust == "untrusted"
    assert child.network == "none"


def test_child_without_sandbox_gets_nothing(family):
    assert restrict_kid(family, 'command: ["true"]').zones == ()


# Property: whatever the declarations, a child's grant is never wider than its parent's.

MODES = st.sampled_from(["ro", "rw"])
SUBS = st.sampled_from([None, "a", "a/b", "c"])
TRUSTS = st.sampled_from(["untrusted", "session", "workspace", "full"])


@st.composite
def declaration(draw):
    zones = []
    for name in draw(st.lists(st.sampled_from(["z1", "z2", "z3"]), unique=True, max_size=3)):
        sub = draw(SUBS)
        zones.append(
            f"{{name: {name}, mode: {draw(MODES)}" + (f", restrict: {sub}" if sub else "") + "}"
        )
    network = draw(
        st.sampled_from(["none", "full", "{allow: [a.test]}", "{allow: [a.test, b.test:8080]}"])
    )
    lines = [f"trust: {draw(TRUSTS)}", f"network: {network}"]
    if draw(st.booleans()):
        lines.append(
            f"sandbox: {{readonly: {str(draw(st.booleans())).lower()}, zones: [{', '.join(zones)}]}}"
        )
    if draw(st.booleans()):
        lines.append(
            f"resources: {{memory: {draw(st.sampled_from(['64m', '512m', '2g']))}, pids: {draw(st.integers(8, 512))}}}"
        )
    return "\n".join(lines)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parent_decl=declaration(), child_decl=declaration())
def test_a_child_grant_is_never_wider_than_its_parent(project, parent_decl, child_decl):
    for name in ("z1", "z2", "z3"):
        if name not in project.zones:
            project.zone(name, "rw", files={"a/b/f": "x", "c/f": "y"})
    (project.root / ".git").mkdir(exist_ok=True)
    project.worker("main", parent_decl + "\nchildren: [kid]")
    project.worker("kid", child_decl)
    loaded = load_project(project.root)
    try:
        parent = grant_for(loaded, load_worker(loaded, "main"), paths_of(loaded))
        child = restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    except PolicyError:
        return
    for zone in child.zones:
        assert any(covers(p, zone) for p in parent.zones if p.name == zone.name), (
            zone,
            parent.zones,
        )
    assert rank(child.trust) <= rank(parent.trust)
    assert narrower_or_equal(child.network, parent.network)
    for field in ("memory", "cpus", "pids", "timeout", "tmp"):
        assert getattr(child.limits, field) <= getattr(parent.limits, field)
    assert set(parent.masks) <= set(child.masks)


# -- host-side path checks ----------------------------------------------------------------


@pytest.fixture
def view(project, tmp_path):
    project.zone("input", "ro", files={"a.txt": "a"})
    out = project.zone(
        "output",
        "rw",
        extra="untrusted_output: true, suffixes: ['.md', '.json'], max_file_size: 1k",
    )
    (out / "escape").symlink_to(tmp_path)
    (out / "inner").symlink_to(out / "..")
    project.worker("w", "sandbox: {zones: [{name: input}, {name: output, mode: rw}]}")
    return ZoneView(grant(project, "w"))


def test_view_reads_and_writes_inside_zones(view, project):
    assert view.check_read("/input/a.txt") == (project.root / "input" / "a.txt").resolve()
    assert view.can_write("/output/report.md", size=100)
    assert view.can_write("/session/notes.txt")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda v: v.check_write("/input/x"),
            "Cannot write '/input/x': /input is read-only. Writable: /output, /session, /staged",
        ),
        (lambda v: v.check_write("/output/run.sh"), "/output accepts only .md, .json files"),
        (
            lambda v: v.check_write("/output/big.md", size=4096),
            "exceeds /output's per-file cap of 1024",
        ),
        (lambda v: v.check_read("/output/../input/a.txt"), "'..' is not allowed"),
        (lambda v: v.check_read("/output/escape/x"), "leads outside /output through a symlink"),
        (lambda v: v.check_read("/output/inner/input/a.txt"), "through a symlink"),
        (lambda v: v.check_read("/etc/passwd"), "it is in no granted zone"),
        (lambda v: v.check_read("relative"), "use an absolute path"),
    ],
)
def test_view_refusals_say_what_is_allowed(view, call, message):
    with pytest.raises(PolicyError, match=message.replace(".", r"\.").replace("(", r"\(")):
        call(view)


def test_view_hides_masked_paths(project):
    (project.root / ".git").mkdir()
    project.worker("w", "trust: workspace\nsandbox: {}")
    v = ZoneView(grant(project, "w"))
    assert v.can_read("/repo/orchestrator.yaml")
    assert not v.can_read("/repo/.sandbox/audit.jsonl")
    assert not v.can_write("/repo/.git/config")


def test_symlinked_project_root_is_resolved(tmp_path):
    real = tmp_path / "real"
    (real / "workers").mkdir(parents=True)
    (real / "orchestrator.yaml").write_text("zones: {}\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert load_project(link).root == real
    assert Path(os.path.realpath(link)) == real


def test_child_secrets_can_only_shrink(project):
    project.extra = "credentials:\n  a: {source: env, env: A}\n  b: {source: env, env: B}\n"
    project.write_project()
    project.worker("main", "trust: session\nchildren: [kid]\nsecrets: [a]")
    project.worker("kid", "trust: session\nsecrets: [a, b]")
    loaded = load_project(project.root)
    parent = grant_for(loaded, load_worker(loaded, "main"), paths_of(loaded))
    with pytest.raises(PolicyError, match="asks secret 'b' but parent 'main' does not hold it"):
        restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    project.worker("kid", "trust: session\nsecrets: [a]")
    child = restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    assert child.secrets == ("a",)


def test_child_of_an_allowlisted_parent_cannot_widen_it(project):
    project.worker("main", "trust: session\nchildren: [kid]\nnetwork: {allow: [a.test]}")
    loaded = load_project(project.root)
    parent = grant_for(loaded, load_worker(loaded, "main"), paths_of(loaded))
    for wider in ("{allow: [a.test, b.test]}", "{allow: ['a.test:8080']}", "full"):
        project.worker("kid", f"trust: session\nnetwork: {wider}")
        with pytest.raises(PolicyError, match="a child's network can only be narrower"):
            restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    project.worker("kid", "trust: session\nnetwork: {allow: ['a.test:443']}")
    child = restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    assert [str(e) for e in child.network] == ["a.test:443"]
    project.worker("kid", "trust: session")  # undeclared: the project default, none
    child = restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    assert child.network == "none"


def test_invalid_allowlists_and_untrusted_caps_are_declaration_errors(project):
    from orchestrator.errors import ConfigError

    project.worker("w", "network: {allow: ['http://x.test/path', '*', 'bad host']}")
    with pytest.raises(ConfigError) as excinfo:
        load_worker(load_project(project.root), "w")
    assert "without scheme" in str(excinfo.value)
    project.extra = "untrusted_network: none\n"
    project.write_project()
    project.worker("w", "network: {allow: [a.test]}")
    with pytest.raises(PolicyError, match="untrusted_network: none"):
        grant(project, "w")


def test_child_cannot_bypass_its_parents_review(project):
    project.zone("data", "rw", extra="untrusted_output: true")
    ask = "approval: {write: ask, delete: blocked}"
    project.worker(
        "main",
        f"trust: session\nchildren: [kid]\nsandbox: {{zones: [{{name: data, mode: rw, {ask}}}]}}",
    )
    loaded = load_project(project.root)
    parent = grant_for(loaded, load_worker(loaded, "main"), paths_of(loaded))
    for front in (
        "sandbox: {zones: [{name: data, mode: rw}]}",  # direct writes
        "sandbox: {zones: [{name: data, mode: rw, approval: {write: ask}}]}",  # deletes
    ):
        project.worker("kid", "trust: session\n" + front)
        with pytest.raises(PolicyError, match="more freely than parent 'main'"):
            restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    project.worker("kid", f"trust: session\nsandbox: {{zones: [{{name: data, mode: rw, {ask}}}]}}")
    child = restrict(parent, "main", loaded, load_worker(loaded, "kid"), paths_of(loaded, "r2"))
    assert child.zone("data").ask_base is not None


def test_workers_folder_never_shows_the_sandbox(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    (root / "orchestrator.yaml").write_text("workers: .\nzones: {}\n")
    (root / "w.worker").write_text("---\nsandbox: {}\n---\n")
    loaded = load_project(root)
    g = grant_for(loaded, load_worker(loaded, "w"), paths_of(loaded))
    assert "/workers/.sandbox" in g.masks
    assert not ZoneView(g).can_read("/workers/.sandbox/audit.jsonl")


def test_private_copy_never_follows_links_or_opens_fifos(tmp_path):
    import os

    from orchestrator.runtime.host_folders import private_copy

    zone = tmp_path / "zone"
    (zone / "sub").mkdir(parents=True)
    (zone / "sub" / "a.txt").write_text("a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("HOST-SECRET")
    (zone / "link-dir").symlink_to(outside)
    (zone / "link-file").symlink_to(outside / "secret.txt")
    os.mkfifo(zone / "pipe")
    copy = tmp_path / "copy"
    uid, gid = (os.getuid(), os.getgid()) if os.getuid() else (65534, 65534)
    if os.getuid() == 0:
        (zone / "root-only.txt").write_text("ROOT-ONLY")
        os.chmod(zone / "root-only.txt", 0o600)
    private_copy(zone, copy, uid, gid)
    assert (copy / "sub" / "a.txt").read_text() == "a"
    assert (copy / "link-dir").is_symlink() and (copy / "link-file").is_symlink()
    assert not (copy / "pipe").exists()
    assert not (copy / "root-only.txt").exists()
    for path in copy.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"HOST-SECRET" not in path.read_bytes()
