"""Which paths a swarm run's nodes must have, and what the probe's tasks say: pure."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.docker.swarm import nodes
from orchestrator.docker.swarm.nodes import BindCheck, Node
from orchestrator.errors import EngineError
from orchestrator.plan import SECRETS_DIR, Mount


def _node(ident: str, host: str, state: str = "ready", availability: str = "active") -> dict:
    return {
        "ID": ident,
        "Description": {"Hostname": host},
        "Status": {"State": state},
        "Spec": {"Availability": availability},
    }


def test_candidates_are_the_ready_active_nodes():
    found = nodes.candidates(
        [
            _node("b" * 25, "two"),
            _node("a" * 25, "one"),
            _node("c" * 25, "down", state="down"),
            _node("d" * 25, "drained", availability="drain"),
            _node("e" * 25, "paused", availability="pause"),
        ]
    )
    assert [n.hostname for n in found] == ["one", "two"]
    assert found[0].name == "one (aaaaaaaaaa)"


def _spec(mounts: list[Mount], inputs: str | None = None):
    class Spec:
        pass

    s = Spec()
    s.mounts = mounts  # type: ignore[attr-defined]
    s.inputs = inputs  # type: ignore[attr-defined]
    return s


def test_bind_checks_name_each_source_once_and_the_sandbox_root_with_a_marker(tmp_path):
    zone = tmp_path / "zone"
    zone.mkdir()
    policy = tmp_path / "orchestrator.yaml"
    policy.write_text("")
    sandbox = tmp_path / ".sandbox"
    sandbox.mkdir()
    later = tmp_path / "out" / "made-when-the-run-opens"  # an output zone, missing here
    (tmp_path / "out").mkdir()
    spec = _spec(
        [
            Mount(str(zone), "/zone", True),
            Mount(str(zone), "/again", True),
            Mount(str(policy), "/zone/orchestrator.yaml", True),
            Mount(str(sandbox / "sessions" / "s1"), "/session", False),
            Mount("/dev/shm/orchestrator-secrets-1", SECRETS_DIR, True),
            Mount(str(later), "/out", False),
        ],
        inputs="/inputs",
    )
    checks = nodes.bind_checks(
        spec, sandbox, results=True, kind_of=nodes._kind, marker=".node-check-x"
    )
    assert checks == sorted(
        [
            BindCheck(str(zone), "folder"),
            BindCheck(str(policy), "file"),
            BindCheck(str(sandbox), "folder", ".node-check-x"),
            BindCheck(str(tmp_path / "out"), "folder"),  # its nearest existing parent
        ],
        key=lambda c: c.path,
    )


def test_a_path_whose_only_existing_parent_is_the_root_is_not_checked():
    spec = _spec([Mount("/no-such-top-folder/x", "/x", False)])
    checks = nodes.bind_checks(spec, Path("/sb"), results=False, kind_of=nodes._kind, marker="m")
    assert checks == []


def test_the_probe_command_exits_with_the_number_of_the_first_failed_check(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "1").write_text("")
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "m").write_text("")
    checks = [
        BindCheck("/a", "folder"),
        BindCheck("/b", "file"),
        BindCheck("/c", "folder", "m"),
    ]

    def run(cmd: list[str]) -> int:
        script = cmd[2].replace(nodes.PROBE_ROOT, str(tmp_path))
        return subprocess.run(["sh", "-c", script], check=False).returncode

    assert run(nodes.probe_command(checks)) == 0
    (tmp_path / "2" / "m").unlink()  # the folder is there, not the marker: not shared
    assert run(nodes.probe_command(checks)) == nodes.FIRST_CODE + 2
    (tmp_path / "1").unlink()
    (tmp_path / "1").mkdir()  # a folder where a file was
    assert run(nodes.probe_command(checks)) == nodes.FIRST_CODE + 1
    template = nodes.probe_template("img", checks, 1000, 1000)
    container = template["ContainerSpec"]
    assert container["User"] == "1000:1000" and container["ReadOnly"] is True
    assert all(m["ReadOnly"] and m["Type"] == "bind" for m in container["Mounts"])
    assert [m["Source"] for m in container["Mounts"]] == ["/a", "/b", "/c"]
    assert template["RestartPolicy"]["Condition"] == "none"


ONE, TWO = Node("1" * 25, "one"), Node("2" * 25, "two")
CHECKS = [BindCheck("/srv/zone", "folder"), BindCheck("/srv/.sandbox", "folder", "m")]


def _task(node: Node, state: str, err: str = "", code: int | None = None, at: str = "1"):
    status = {"State": state, "Err": err}
    if code is not None:
        status["ContainerStatus"] = {"ExitCode": code}
    return {"NodeID": node.id, "Status": status, "CreatedAt": at}


def test_problems_read_from_the_tasks():
    missing = 'invalid mount config for type "bind": bind source path does not exist: /srv/zone'
    tasks = [
        _task(ONE, "complete", code=0),
        _task(TWO, "rejected", missing),
    ]
    found = nodes.problems([ONE, TWO], tasks, CHECKS, "img")
    assert found == [nodes.NodeProblem(TWO, "does not exist", path="/srv/zone")]

    no_image = "No such image: orchestrator/worker:latest"
    found = nodes.problems([ONE, TWO], [_task(ONE, "rejected", no_image)], CHECKS, "img")
    assert found[0] == nodes.NodeProblem(ONE, "image missing", image="img")
    assert "did not finish" in found[1].what  # no task on node two

    found = nodes.problems([ONE], [_task(ONE, "failed", "exit 11", code=11)], CHECKS, "img")
    assert found[0].path == "/srv/.sandbox" and "not shared" in found[0].what
    found = nodes.problems([ONE], [_task(ONE, "failed", "exit 10", code=10)], CHECKS, "img")
    assert found[0].path == "/srv/zone" and found[0].what == "is not a folder"

    # A node's latest task counts.
    tasks = [_task(ONE, "rejected", missing, at="1"), _task(ONE, "complete", code=0, at="2")]
    assert nodes.problems([ONE], tasks, CHECKS, "img") == []


def test_the_refusal_names_the_nodes_paths_and_fixes_in_one_line():
    line = nodes.refusal(
        "w",
        [
            nodes.NodeProblem(TWO, "does not exist", path="/srv/zone"),
            nodes.NodeProblem(ONE, "image missing", image="orchestrator/worker:latest"),
        ],
    )
    assert "\n" not in line
    assert "worker 'w'" in line
    assert f"on node {TWO.name}, /srv/zone does not exist" in line
    assert f"node {ONE.name} lacks image orchestrator/worker:latest" in line
    assert "NFS" in line and "docker save orchestrator/worker:latest | docker -H" in line
    assert "docker node update --availability drain" in line


class FakeSwarm:
    """The requests :func:`nodes.check_nodes` makes, answered from ``tasks`` per node."""

    def __init__(self, node_list, local, answer):
        self.node_list, self.local, self.answer = node_list, local, answer
        self.made: dict[str, dict] = {}
        self.removed: list[str] = []

    def all_nodes(self):
        return self.node_list

    def local_node_id(self):
        return self.local

    def create_probe(self, name, template):
        self.made[name] = template
        return name

    def service_tasks(self, service):
        return self.answer(service, self.made[service])

    def remove(self, kind, ident):
        self.removed.append(ident)

    def remove_containers(self, ident):
        pass


def test_a_swarm_whose_only_node_is_this_one_is_not_probed():
    swarm = FakeSwarm([_node(ONE.id, "one")], ONE.id, None)
    found = nodes.check_nodes(swarm, _spec([]), Path("/sb"), results=False, images=["i"])
    assert found == [ONE] and not swarm.made


def test_no_candidate_node_is_refused():
    swarm = FakeSwarm([_node(ONE.id, "one", availability="drain")], ONE.id, None)
    with pytest.raises(EngineError, match="no ready node"):
        nodes.check_nodes(swarm, _spec([]), Path("/sb"), results=False, images=["i"])


def test_every_image_is_probed_and_a_problem_refuses_after_removing_the_probes(tmp_path):
    sandbox = tmp_path / ".sandbox"
    seen_marker: list[bool] = []

    def answer(service, template):
        container = template["ContainerSpec"]
        if container["Image"] == "proxy":
            return [_task(ONE, "complete", code=0), _task(TWO, "rejected", "No such image: proxy")]
        marker = next(m for m in container["Command"][2].split() if ".node-check-" in m)
        seen_marker.append((sandbox / Path(marker.rstrip(";")).name).is_file())
        return [_task(ONE, "complete", code=0), _task(TWO, "complete", code=0)]

    swarm = FakeSwarm([_node(ONE.id, "one"), _node(TWO.id, "two")], ONE.id, answer)
    spec = _spec([Mount(str(sandbox / "sessions" / "s"), "/session", False)])
    spec.worker = "w"  # type: ignore[attr-defined]
    with pytest.raises(EngineError) as caught:
        nodes.check_nodes(swarm, spec, sandbox, results=True, images=["worker", "proxy"])
    assert f"node {TWO.name} lacks image proxy" in str(caught.value)
    assert seen_marker == [True]  # written while the probe ran
    assert sorted(swarm.removed) == sorted(swarm.made)  # both probes removed
    assert not list(sandbox.iterdir())  # and the marker
