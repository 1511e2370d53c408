"""A run's egress decisions are its own, even when its network is gone when they are read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from docker import errors as docker_errors

from orchestrator.docker import networks
from orchestrator.docker.client import DockerClient
from orchestrator.docker.egress import Egress
from orchestrator.egress import Decision
from orchestrator.plan import ContainerSpec, Limits, Network

RUN = "orchestrator-run-r1"
SINCE = datetime(2026, 1, 1, tzinfo=UTC)


class FakeApi:
    """The few engine calls setting up and reading a run's network make."""

    def __init__(self) -> None:
        self.networks: dict[str, dict[str, Any]] = {}

    def create_network(self, name: str, **_: Any) -> dict[str, str]:
        self.networks[name] = {
            "Id": f"id-{name}",
            "IPAM": {"Config": [{"Subnet": "10.9.0.0/24"}]},
            "Containers": {},
        }
        return {"Id": f"id-{name}"}

    def inspect_network(self, name: str) -> dict[str, Any]:
        for key, network in self.networks.items():
            if name in (key, network["Id"]):
                return network
        raise docker_errors.NotFound(f"network {name} not found")

    def remove_network(self, network_id: str) -> None:
        self.networks = {k: v for k, v in self.networks.items() if v["Id"] != network_id}

    def version(self) -> dict[str, Any]:
        return {"Version": "20.10.24", "Components": [{"Name": "Engine"}]}


def _decision(client: str, host: str) -> Decision:
    return Decision(host=host, port=80, allowed=True, time=SINCE, method="GET", client=client)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> DockerClient:
    egress = Egress("http://proxy:3128", "proxy-id", "0" * 16)
    monkeypatch.setattr(networks, "ensure_egress", lambda *_a, **_k: egress)
    monkeypatch.setattr(networks, "attach", lambda *_a: None)
    logged = [_decision("10.9.0.2", "mine.test"), _decision("10.8.0.2", "theirs.test")]
    monkeypatch.setattr(networks, "decisions", lambda *_a: logged)
    return DockerClient(FakeApi())  # type: ignore[arg-type]


def _spec() -> ContainerSpec:
    return ContainerSpec(
        image="x",
        command=None,
        uid=1,
        gid=1,
        limits=Limits(memory=1, cpus=1.0, pids=1, timeout_s=1.0),
        network=Network("allowlist", allow=["mine.test"]),
        run_id="r1",
        worker="w",
    )


def test_decisions_are_filtered_by_the_run_network(engine: DockerClient) -> None:
    networks.prepare_network(engine, _spec())
    hosts = [d.host for d in networks.network_decisions(engine, _spec(), SINCE)]
    assert hosts == ["mine.test"]
    assert networks.release_network(engine, RUN)


def test_a_network_gone_before_decisions_are_read_keeps_them_the_runs_own(
    engine: DockerClient,
) -> None:
    networks.prepare_network(engine, _spec())
    engine.api.remove_network(f"id-{RUN}")  # removed under the run (gc, a user)
    hosts = [d.host for d in networks.network_decisions(engine, _spec(), SINCE)]
    assert hosts == ["mine.test"]  # the subnet remembered at set-up, not everyone's
    assert networks.release_network(engine, RUN)


def test_an_unknown_subnet_gives_no_decisions_rather_than_everyones(engine: DockerClient) -> None:
    assert networks.network_decisions(engine, _spec(), SINCE) == []
