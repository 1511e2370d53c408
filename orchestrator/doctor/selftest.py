"""The egress self-test: real workers, through the production path, try every way out.

The doctor writes a throw-away project in a temp folder whose ``network.services`` names
a network of its own with two test servers on it (:mod:`orchestrator.docker.testservers`),
and two workers running :mod:`.probe`: one with ``network: none``, one allowlisting only
``allowed.<network>:8080``. Both run through :class:`~orchestrator.Orchestrator` (plan,
audit, the run's own network, the allowlist's proxy), exactly as a user's workers do.

``none`` passes when the worker has only loopback, no route, and TCP, UDP and DNS fail.
The allowlist passes when the allowed server answers through the proxy, the other one is
refused with 403, a direct connection and the IP literal fail, no outside name resolves,
UDP (QUIC's port) gets no answer, a listener on the host is unreachable (the firewall
rule), and the proxy logged each decision (in the run's result and the audit log).

Everything it creates is removed at the end, on every path (Ctrl-C included); the servers
and their network carry the owner labels, so ``gc`` removes them if the doctor is killed.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.doctor import verdicts
from orchestrator.doctor.checks import Check
from orchestrator.doctor.verdicts import ALLOWED, OUTSIDE_NAME, REFUSED
from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.docker import DockerEngine
    from orchestrator.docker.testservers import TestServer
    from orchestrator.runner import Orchestrator
    from orchestrator.runtime import RunResult

RUN_TIMEOUT = 60
SERVER_START_TIMEOUT = 30.0

Progress = Callable[[str], None]


@dataclass
class _Setup:
    """What one self-test made, so that it can all be removed."""

    token: str
    network: str
    servers: dict[str, TestServer] = field(default_factory=dict)
    network_made: bool = False

    def targets(self) -> verdicts.Targets:
        return verdicts.Targets(self.network, self.servers[ALLOWED].address)


def egress_selftest(
    engine: DockerEngine,
    *,
    image: str,
    isolations: Sequence[str | None] = (None,),
    progress: Progress = lambda _: None,
) -> list[Check]:
    """Run the self-test (under each isolation given: None is the project's default) and
    return its rows; every object it made is gone when it returns or raises."""
    token = secrets.token_hex(4)
    setup = _Setup(token=token, network=f"doctor-{token}")
    checks: list[Check] = []
    folder = Path(tempfile.mkdtemp(prefix="orchestrator-doctor-"))
    try:
        with _host_listener() as listener:
            try:
                _start_servers(engine, setup, image, progress)
            except OrchestratorError as exc:
                return [Check("egress self-test", "fail", f"could not start: {exc}", _fix(exc))]
            checks.append(_control(engine, setup))
            project = _write_project(folder, setup, image, listener.getsockname()[1], isolations)
            for isolation in isolations:
                checks += _run_both(project, setup, listener, isolation, progress)
    finally:
        problems = _clean_up(engine, setup)
        shutil.rmtree(folder, ignore_errors=True)
    if problems:
        checks.append(
            Check(
                "egress cleanup",
                "fail",
                "; ".join(problems),
                "orchestrator gc (it removes what a dead doctor left)",
            )
        )
    return checks


# -- setting up ---------------------------------------------------------------------------


def _start_servers(engine: DockerEngine, setup: _Setup, image: str, progress: Progress) -> None:
    from orchestrator.docker import testservers

    progress(f"egress self-test: starting two test servers on network {setup.network}")
    testservers.create_network(engine, setup.network, setup.token)
    setup.network_made = True
    for alias in (ALLOWED, REFUSED):
        setup.servers[alias] = testservers.start_server(
            engine, image, setup.network, alias, setup.token
        )
    testservers.wait_listening(engine, list(setup.servers.values()), SERVER_START_TIMEOUT)


def _control(engine: DockerEngine, setup: _Setup) -> Check:
    """The servers answer HTTP and UDP from the host: so a worker's failure to reach them
    is the sandbox's doing, not a dead server's."""
    from orchestrator.docker.inspection import engine_facts
    from orchestrator.docker.testservers import HTTP_PORT, UDP_PORT

    name = "egress test servers"
    if not engine_facts(engine).local:
        return Check(name, "pass", "started (not probed from here: the engine is remote)")
    seen = []
    for server in setup.servers.values():
        try:
            with socket.create_connection((server.address, HTTP_PORT), timeout=5):
                pass
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.settimeout(3)
                sock.sendto(b"control", (server.address, UDP_PORT))
                sock.recvfrom(512)
        except OSError as exc:
            return Check(
                name,
                "fail",
                f"test server '{server.alias}' at {server.address} does not answer from the "
                f"host ({exc}): the self-test below proves nothing",
                "check the host's firewall for the Docker bridges",
            )
        seen.append(f"{server.alias} {server.address}")
    return Check(
        name,
        "pass",
        f"{', '.join(seen)} answer TCP {HTTP_PORT} and UDP {UDP_PORT} from the host",
    )


def _write_project(
    folder: Path, setup: _Setup, image: str, host_port: int, isolations: Sequence[str | None]
) -> Path:
    """The throw-away project: the servers' network as a local service, and per isolation
    a ``none`` and an allowlisted worker (``closed-ISOLATION``, ``listed-ISOLATION``). The
    project's own floor is runc, so that each worker's ``isolation:`` is the one it gets."""
    from orchestrator.docker.testservers import HTTP_PORT, UDP_PORT

    allowed = setup.servers[ALLOWED].address
    (folder / "workers").mkdir()
    floor = "isolation: {untrusted: runc}\n" if any(isolations) else ""
    (folder / "orchestrator.yaml").write_text(
        "# Written by orchestrator doctor for its egress self-test; removed afterwards.\n"
        "zones: {}\n"
        f"defaults: {{image: {json.dumps(image)}}}\n"
        f"network:\n  services:\n    - network: {setup.network}\n" + floor
    )
    closed: list[list[Any]] = [
        ["interfaces", "interfaces"],
        ["routes", "routes"],
        ["connect", "tcp", allowed, HTTP_PORT],
        ["udp", "udp", allowed, UDP_PORT],
        ["resolve", "dns", OUTSIDE_NAME],
    ]
    listed: list[list[Any]] = [
        ["fetch", "allowed", setup.targets().url(ALLOWED)],
        ["fetch", "refused", setup.targets().url(REFUSED)],
        ["connect", "direct", allowed, HTTP_PORT],
        ["fetch", "ip_literal", f"http://{allowed}:{HTTP_PORT}/"],
        ["resolve", "dns", OUTSIDE_NAME],
        ["udp", "udp", allowed, UDP_PORT],
        ["host_services", "host", host_port],
    ]
    allow = json.dumps({"allow": [_allow_entry(setup)]})
    for isolation in isolations:
        _write_worker(folder, _name("closed", isolation), closed, "none", isolation)
        _write_worker(folder, _name("listed", isolation), listed, allow, isolation)
    return folder


def _name(kind: str, isolation: str | None) -> str:
    return kind if isolation is None else f"{kind}-{isolation}"


def _allow_entry(setup: _Setup) -> str:
    from orchestrator.docker.testservers import HTTP_PORT

    return f"{ALLOWED}.{setup.network}:{HTTP_PORT}"


def _write_worker(
    folder: Path, name: str, jobs: list[list[Any]], network: str, isolation: str | None
) -> None:
    source = resources.files("orchestrator.doctor").joinpath("probe.py").read_text("utf-8")
    command = ["python3", "-c", source, json.dumps(jobs)]
    (folder / "workers" / f"{name}.worker").write_text(
        "---\n"
        f"name: {name}\n"
        "description: orchestrator doctor's egress probe\n"
        f"command: {json.dumps(command)}\n"
        f"network: {network}\n"
        # One try of one second per name: a lookup that must fail should not take long.
        'env: {RES_OPTIONS: "timeout:1 attempts:1"}\n'
        # Only a timeout: the default limits are what a user's worker gets (and gVisor's
        # own threads count against the pid limit).
        f"resources: {{timeout: {RUN_TIMEOUT}}}\n"
        + (f"isolation: {isolation}\n" if isolation else "")
        + "---\n"
    )


@contextmanager
def _host_listener() -> Iterator[socket.socket]:
    """A TCP listener on every host address: an allowlisted worker must not reach it.

    The kernel completes handshakes for the backlog, so nothing needs to accept; whoever
    got through is read from the backlog afterwards (:func:`_accepted`).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("0.0.0.0", 0))  # noqa: S104 -- the point is to be reachable from bridges
        sock.listen(16)
        sock.setblocking(False)
        yield sock
    finally:
        sock.close()


def _accepted(listener: socket.socket) -> list[str]:
    peers: list[str] = []
    while True:
        try:
            conn, peer = listener.accept()
        except OSError:
            return peers
        conn.close()
        peers.append(str(peer[0]))


# -- running and judging ------------------------------------------------------------------


def _run_both(
    project: Path,
    setup: _Setup,
    listener: socket.socket,
    isolation: str | None,
    progress: Progress,
) -> list[Check]:
    from orchestrator.runner import Orchestrator

    checks: list[Check] = []
    with Orchestrator(project) as orch:
        for kind in ("closed", "listed"):
            mode = "none" if kind == "closed" else "allowlist"
            prefix = f"egress {mode}" + ("" if isolation is None else f" ({isolation})")
            progress(f"egress self-test: a worker with network {mode}" + _under(isolation))
            try:
                result = orch.run(_name(kind, isolation))
            except OrchestratorError as exc:
                checks.append(Check(prefix, "fail", str(exc), _fix(exc)))
                continue
            seen = _probe_output(result)
            if seen is None:
                checks.append(
                    Check(
                        prefix,
                        "fail",
                        f"the probe did not report (run {result.run_id} {result.status}, "
                        f"code {result.exit_code}): {_tail(result)}",
                    )
                )
                continue
            if kind == "closed":
                rows = verdicts.judge_none(verdicts.Seen(seen), setup.targets())
            else:
                rows = verdicts.judge_allowlist(
                    verdicts.Seen(seen),
                    setup.targets(),
                    egress=result.egress,
                    audited=_audited(orch, result.run_id),
                    accepted=_accepted(listener),
                )
            checks += [replace(row, name=f"{prefix}: {row.name}") for row in rows]
    return checks


def _audited(orch: Orchestrator, run_id: str) -> list[tuple[str, Any, bool]]:
    """The run's egress decisions as the audit log has them: (host, port, allowed)."""
    from orchestrator.audit import AuditFilter

    entries = orch.audit.query(AuditFilter(operation="egress.decision", run=run_id))
    return [(str(e.metadata.get("host")), e.metadata.get("port"), bool(e.allowed)) for e in entries]


def _probe_output(result: RunResult) -> dict[str, Any] | None:
    for line in reversed(result.stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def _tail(result: RunResult) -> str:
    text = (result.error or result.stderr or result.stdout or "no output").strip()
    return text[-300:].replace("\n", " | ")


def _under(isolation: str | None) -> str:
    return "" if isolation is None else f" under {isolation}"


def _fix(exc: OrchestratorError) -> str | None:
    from orchestrator.errors import EngineUnreachable, ImageMissing, image_fix

    if isinstance(exc, ImageMissing):
        return image_fix(exc.image)
    if isinstance(exc, EngineUnreachable):
        return "start the Docker engine"
    return None


# -- cleaning up --------------------------------------------------------------------------


def _clean_up(engine: DockerEngine, setup: _Setup) -> list[str]:
    """Remove the proxy of the self-test's allowlist, the servers, their network; return
    what could not be removed (never raises an orchestrator error)."""
    from orchestrator.config.allowlist import validate_allowlist
    from orchestrator.docker import testservers
    from orchestrator.docker.egress_gc import remove_egress
    from orchestrator.policy.network import egress_key

    problems = []
    if setup.network_made:
        key = egress_key(validate_allowlist([_allow_entry(setup)]), [setup.network])
        try:  # the proxy first: it sits on the servers' network
            remove_egress(engine, key)
        except OrchestratorError as exc:
            problems.append(f"proxy {key}: {exc}")
    for server in setup.servers.values():
        try:
            testservers.remove_server(engine, server.container_id)
        except OrchestratorError as exc:
            problems.append(f"server {server.alias}: {exc}")
    if setup.network_made:
        try:
            if not testservers.remove_network(engine, setup.network):
                problems.append(f"network {setup.network} is still in use")
        except OrchestratorError as exc:
            problems.append(f"network {setup.network}: {exc}")
    return problems
