"""A run's egress decisions are its own, even when its network is gone when they are read."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from docker import errors as docker_errors

from orchestrator.docker import networks
from orchestrator.docker.client import DockerClient
from orchestrator.docker.egress import Egress
from orchestrator.egress import FLOOD_MARK, RUN_DENIED
from orchestrator.plan import ContainerSpec, Limits, Network
from orchestrator.runtime.engine import EgressLog

RUN = "orchestrator-run-r1"
SINCE = datetime(2026, 1, 1, tzinfo=UTC)


def _line(moment: datetime, client: str, host: str, verdict: str = "allow") -> bytes:
    """A proxy decision line as the engine returns it with timestamps."""
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    return (
        f"{stamp} EGRESS {moment.timestamp():.3f} GET {host} 80 {verdict} 200 TCP_MISS {client}\n"
    ).encode()


class FakeStream:
    """A log stream: the lines there are, then (following) nothing until closed."""

    def __init__(self, lines: list[bytes], follow: bool) -> None:
        self.lines = lines
        self.follow = follow
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        yield from self.lines
        if self.follow:
            self.closed.wait(10)

    def close(self) -> None:
        self.closed.set()


class FakeApi:
    """The few engine calls setting up and reading a run's network make; ``log`` is the
    proxy's log (lines with the engine's timestamps)."""

    def __init__(self) -> None:
        self.networks: dict[str, dict[str, Any]] = {}
        self.log: list[bytes] = []
        self.reads = 0
        self.now = datetime.now(UTC)  # when the proxy logged the test's first lines

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

    def inspect_container(self, name: str) -> dict[str, Any]:
        return {"Id": "proxy-id"}

    def logs(self, container: str, *, since: float, follow: bool, **_: Any) -> FakeStream:
        self.reads += 1
        start = datetime.fromtimestamp(since, UTC)
        kept = [line for line in self.log if _stamp(line) >= start]
        return FakeStream(kept, follow)

    def remove_network(self, network_id: str) -> None:
        self.networks = {k: v for k, v in self.networks.items() if v["Id"] != network_id}

    def version(self) -> dict[str, Any]:
        return {"Version": "20.10.24", "Components": [{"Name": "Engine"}]}


def _stamp(line: bytes) -> datetime:
    return datetime.fromisoformat(line.split()[0].decode()[:26]).replace(tzinfo=UTC)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> DockerClient:
    egress = Egress("http://proxy:3128", "proxy-id", "0" * 16)
    monkeypatch.setattr(networks, "ensure_egress", lambda *_a, **_k: egress)
    monkeypatch.setattr(networks, "attach", lambda *_a: None)
    api = FakeApi()
    api.log = [
        _line(api.now, "10.9.0.2", "mine.test"),
        _line(api.now, "10.8.0.2", "theirs.test"),
    ]
    return DockerClient(api)  # type: ignore[arg-type]


def _wait_for(condition: Any) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


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
    networks.set_up_network(engine, _spec())
    hosts = [d.host for d in networks.network_decisions(engine, _spec(), SINCE).decisions]
    assert hosts == ["mine.test"]
    assert networks.release_network(engine, RUN)


def test_a_network_gone_before_decisions_are_read_keeps_them_the_runs_own(
    engine: DockerClient,
) -> None:
    networks.set_up_network(engine, _spec())
    engine.api.remove_network(f"id-{RUN}")  # removed under the run (gc, a user)
    hosts = [d.host for d in networks.network_decisions(engine, _spec(), SINCE).decisions]
    assert hosts == ["mine.test"]  # the subnet remembered at set-up, not everyone's
    assert networks.release_network(engine, RUN)


def test_an_unknown_subnet_gives_no_decisions_rather_than_everyones(engine: DockerClient) -> None:
    assert networks.network_decisions(engine, _spec(), SINCE) == EgressLog()


def test_decisions_followed_during_the_run_survive_the_log_being_rotated(
    engine: DockerClient,
) -> None:
    """The proxy's log loses its first lines (rotated) before the run ends: the run keeps
    what it followed, and reads nothing twice."""
    api = engine.api
    networks.set_up_network(engine, _spec())
    _wait_for(lambda: api.reads >= 1)  # the follower read the log as it was
    later = api.now + timedelta(seconds=1)
    api.log = [_line(later, "10.9.0.2", "after.test", "-")]  # the first lines rotated away
    found = networks.network_decisions(engine, _spec(), SINCE)
    assert [(d.host, d.allowed) for d in found.decisions] == [
        ("mine.test", True),
        ("after.test", False),
    ]
    assert not found.flooded
    assert networks.release_network(engine, RUN)


def test_a_run_keeps_a_bounded_number_of_decisions_and_counts_the_rest(
    engine: DockerClient,
) -> None:
    api = engine.api
    many = [
        _line(api.now + timedelta(microseconds=n), "10.9.0.2", f"d{n}.test", "-")
        for n in range(RUN_DENIED + 50)
    ]
    last = api.now + timedelta(microseconds=RUN_DENIED + 60)  # the log is in time order
    flood = f"{last.strftime('%Y-%m-%dT%H:%M:%S.%f')}999Z {FLOOD_MARK} {api.now.timestamp():.3f} "
    api.log = [
        _line(api.now, "10.9.0.2", "mine.test"),
        *many,
        f"{flood}10.9.0.2 1000 2 30000\n".encode(),
        f"{flood}10.8.0.2 7 7 7\n".encode(),  # another run's flood
    ]
    ended = f"{(last + timedelta(seconds=1)).strftime('%Y-%m-%dT%H:%M:%S.%f')}000Z"
    end = f"{ended} {FLOOD_MARK} {api.now.timestamp() + 1:.3f} 10.9.0.2 0 0 0\n".encode()
    networks.set_up_network(engine, _spec())
    threading.Timer(1.0, lambda: api.log.append(end)).start()  # the proxy reports its end
    started = time.monotonic()
    found = networks.network_decisions(engine, _spec(), SINCE)
    assert 1.0 <= time.monotonic() - started < 10  # waited for the end of the flood
    assert len(found.decisions) == RUN_DENIED + 1
    assert found.decisions[0].host == "mine.test"
    assert (found.unlisted_denied, found.unlisted_allowed) == (50 + 1000, 2)
    assert found.unlisted_bytes > 30000
    assert networks.release_network(engine, RUN)
