"""Throw-away local servers for ``orchestrator doctor``'s egress self-test.

The self-test needs something real to reach and to be refused: two tiny servers (HTTP on
:data:`HTTP_PORT`, a UDP echo on :data:`UDP_PORT`, the QUIC port) on an internal network of
their own, which the self-test's throw-away project declares as a local service network
(``network.services``), so the egress proxy joins it and nothing else does. Nothing they
do leaves the machine.

The network and the servers carry the owner labels: if the doctor is killed, ``gc`` removes
them like any dead run's objects. They run from the worker image (it has python3), as
``nobody``, with every capability dropped and the orchestrator's seccomp profile.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from docker import errors as docker_errors
from docker.types import Ulimit

from orchestrator import labels
from orchestrator.docker.client import DockerClient, engine_errors
from orchestrator.docker.networks import release_network
from orchestrator.docker.podman import security_opt_for, ulimits_for
from orchestrator.docker.seccomp import default_security_opt
from orchestrator.errors import EngineError, ImageMissing

#: Marks what the self-test creates (besides the owner labels): its token.
SELFTEST = f"{labels.PREFIX}.doctor"
HTTP_PORT = 8080
UDP_PORT = 443
_READY = b"listening"

#: Runs in each server: ``python3 -c SCRIPT NAME``. Every answer names the server.
SCRIPT = r"""
import socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = sys.argv[1]

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("doctor test server " + NAME + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", UDP_PORT))

def echo():
    while True:
        data, peer = udp.recvfrom(512)
        udp.sendto(NAME.encode() + b":" + data, peer)

threading.Thread(target=echo, daemon=True).start()
server = ThreadingHTTPServer(("0.0.0.0", HTTP_PORT), Handler)
print("listening", flush=True)
server.serve_forever()
""".replace("UDP_PORT", str(UDP_PORT)).replace("HTTP_PORT", str(HTTP_PORT))


@dataclass(frozen=True)
class TestServer:
    """One running server: its alias on the network, container id and address there."""

    alias: str
    container_id: str
    address: str


def create_network(engine: DockerClient, name: str, token: str) -> None:
    """The servers' own internal network (owner-labelled: ``gc`` removes it if we die)."""
    with engine_errors(f"creating the self-test network {name}"):
        engine.api.create_network(
            name,
            driver="bridge",
            internal=True,
            labels=engine.labels_for({SELFTEST: token}),
            check_duplicate=True,
        )


def start_server(
    engine: DockerClient, image: str, network: str, alias: str, token: str
) -> TestServer:
    """Start one server on ``network``, reachable there as ``alias``."""
    host_config = engine.api.create_host_config(
        network_mode=network,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=security_opt_for(engine, default_security_opt()),
        # Explicit, as for workers: Podman's own default cannot always be set (podman.py).
        ulimits=ulimits_for(engine, [Ulimit(name="nofile", soft=1024, hard=1024)]),
        # UDP 443 as nobody: the port floor is a per-network-namespace setting.
        sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
        mem_limit=64 << 20,
        memswap_limit=64 << 20,
        pids_limit=32,
        init=True,
        ipc_mode="private",
    )
    name = f"orchestrator-doctor-{token}-{alias}"
    with engine_errors(f"creating the self-test server {name}"):
        try:
            created = engine.api.create_container(
                image=image,
                name=name,
                command=["python3", "-c", SCRIPT, alias],
                user="65534:65534",
                environment={"PYTHONDONTWRITEBYTECODE": "1"},
                labels=engine.labels_for({SELFTEST: token}),
                host_config=host_config,
                networking_config={"EndpointsConfig": {network: {"Aliases": [alias]}}},
                use_config_proxy=False,
            )
        except docker_errors.ImageNotFound:
            raise ImageMissing(image) from None
    container = str(created["Id"])
    try:
        with engine_errors(f"starting the self-test server {name}"):
            engine.api.start(container)
            info = engine.api.inspect_container(container)
        address = info["NetworkSettings"]["Networks"][network]["IPAddress"]
    except BaseException:
        remove_server(engine, container)
        raise
    return TestServer(alias, container, str(address))


def wait_listening(engine: DockerClient, servers: Sequence[TestServer], timeout: float) -> None:
    """Wait until every server said it listens; EngineError naming the first that did not."""
    deadline = time.monotonic() + timeout
    for server in servers:
        while True:
            with engine_errors("reading a self-test server's log"):
                log = engine.api.logs(server.container_id, stdout=True, stderr=True)
            if _READY in log:
                break
            if time.monotonic() > deadline:
                tail = log.decode(errors="replace").strip()[-300:]
                raise EngineError(
                    f"self-test server '{server.alias}' did not start within {timeout:g} s: "
                    f"{tail or 'no output'}"
                )
            time.sleep(0.05)


def remove_server(engine: DockerClient, container: str) -> None:
    with engine_errors("removing a self-test server"), contextlib.suppress(docker_errors.NotFound):
        engine.api.remove_container(container, force=True, v=True)


def remove_network(engine: DockerClient, name: str) -> bool:
    """Remove the servers' network, disconnecting whatever is left on it first."""
    return release_network(engine, name)
