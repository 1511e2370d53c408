"""Allowlisted egress through the proxy, tried for real against a tiny local "internet".

The internet is three test web servers (images/testweb) on the proxies' outside network:
one answering as ``allowed.test`` (and ``www.allowed.test``), one as ``denied.test``, and
one reachable only by its IP address. Workers run on the internal network of an
allowlist's proxy and try every way out. No packet leaves this machine: every name used
is a ``.test`` name that only the engine's DNS knows, and every address is a test
container's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime

import pytest

from orchestrator import labels
from orchestrator.docker import egress as eg
from orchestrator.docker import egress_gc as eg_gc
from orchestrator.docker.images import (
    BASE_REPOSITORY,
    WORKER_IMAGE,
    build_image,
    host_suite,
)
from orchestrator.errors import EngineError
from orchestrator.plan import ContainerSpec

docker = pytest.mark.docker

TESTWEB_IMAGE = "orchestrator/testweb:latest"
#: Marks what these tests create, besides the owner labels the engine adds.
TEST_LABEL = f"{labels.PREFIX}.test"
ALLOW = ["allowed.test"]


# -- pure: the allowlist and the decision log -------------------------------------------


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


def test_decision_lines_are_parsed():
    text = (
        "egress-proxy: allowing allowed.test:80\n"
        "EGRESS 1700000000.250 GET allowed.test 80 allow 200 TCP_MISS\n"
        "EGRESS 1700000001.000 CONNECT Denied.Test 443 - 403 TCP_DENIED\n"
        "EGRESS 1700000002.000 NONE - - - 400 NONE_NONE\n"
        "EGRESS garbage\n"
    )
    got = eg.parse_decisions(text)
    assert [(d.host, d.port, d.allowed, d.method, d.status) for d in got] == [
        ("allowed.test", 80, True, "GET", 200),
        ("denied.test", 443, False, "CONNECT", 403),
        ("-", 0, False, "NONE", 400),
    ]
    assert got[0].time == datetime.fromtimestamp(1700000000.25, UTC)


def test_proxy_env_points_every_client_at_the_proxy():
    egress = eg.Egress("net", "http://proxy:3128", "cid", "0123456789abcdef")
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


@pytest.fixture(scope="module")
def internet(engine):
    """Build the images, start the test servers; remove everything at the end."""
    base = f"{BASE_REPOSITORY}:{host_suite()}"
    if not engine.image_exists(base):  # the engine fixture's build_all makes it
        pytest.fail(f"base image {base} missing")
    eg.build_proxy_image(engine, base)
    build_image(engine, "testweb", TESTWEB_IMAGE, base, lambda _: None)
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
    left = [
        o
        for o in engine.list_managed()
        if o.labels.get(TEST_LABEL) or o.labels.get(eg.EGRESS_KEY) in keys
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


def run_probe(engine, network, script, *, env=None, timeout=90):
    """Run ``script`` in a hardened worker container on ``network``; return (code, output)."""
    spec = ContainerSpec(
        image=WORKER_IMAGE,
        command=["python3", "-c", textwrap.dedent(script)],
        user="10001:10001",
        working_dir="/tmp",
        env={"HOME": "/tmp", "RES_OPTIONS": "timeout:1 attempts:1", **(env or {})},
        mounts=[],
        network_mode=network,
        read_only_rootfs=True,
        cap_drop=["ALL"],
        cap_add=[],
        security_opt=["no-new-privileges:true"],
        pids_limit=64,
        mem_limit=256 << 20,
        memswap_limit=256 << 20,
        nano_cpus=1_000_000_000,
        tmpfs={"/tmp": "rw,nosuid,nodev,size=16m,mode=1777"},
        labels={labels.RUN_ID: "egress-test", labels.WORKER: "probe", TEST_LABEL: "egress"},
        run_id="egress-test",
        worker="probe",
    )
    cid = engine.create(spec)
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


@docker
def test_allowlisted_host_is_reachable_and_everything_else_is_refused(engine, internet, egress):
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
    code, output = run_probe(engine, egress.network, probe_script(jobs), env=eg.proxy_env(egress))
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
    outside_env = {"http_proxy": f"http://{proxy_outside_ip}:{eg.PROXY_PORT}"}
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
    assert host["Memory"] == host["MemorySwap"] == eg.PROXY_MEMORY
    assert host["PidsLimit"] == eg.PROXY_PIDS
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
    assert labels.OWNER_PID not in got  # shared objects outlive their creator
    network = engine.api.inspect_network(egress.network)
    assert network["Internal"] is True
    assert network["Labels"][eg.EGRESS_KEY] == egress.key
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
    code, output = run_probe(engine, egress.network, probe_script(jobs), env=eg.proxy_env(egress))
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
    assert len(networks) == 1


@docker
def test_idle_rules_and_removal_leave_nothing(engine, internet):
    allow = eg.validate_allowlist(["idle.test"])
    key = eg.allowlist_key(allow)
    internet["keys"].add(key)
    egress = eg.ensure_egress(engine, allow)
    assert not eg_gc.is_idle(engine, key, 60)  # just started: a run may be on its way
    # A worker that exists (even before it starts) keeps the proxy busy.
    spec_script = "import time; time.sleep(60)"
    spec = ContainerSpec(
        image=WORKER_IMAGE,
        command=["python3", "-c", spec_script],
        user="10001:10001",
        working_dir="/tmp",
        env={"HOME": "/tmp", **eg.proxy_env(egress)},
        mounts=[],
        network_mode=egress.network,
        read_only_rootfs=True,
        cap_drop=["ALL"],
        cap_add=[],
        security_opt=["no-new-privileges:true"],
        pids_limit=16,
        mem_limit=64 << 20,
        memswap_limit=64 << 20,
        nano_cpus=500_000_000,
        tmpfs={"/tmp": "rw,nosuid,nodev,size=1m,mode=1777"},
        labels={TEST_LABEL: "egress"},
    )
    worker = engine.create(spec)
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
    assert f"{eg.PROXY_PREFIX}{key}" in removed and egress.network in removed
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
    assert second.network == first.network
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
def test_worker_files_get_none_allowlist_or_full_end_to_end(engine, internet, project):
    from orchestrator.audit import AuditFilter, AuditLog
    from orchestrator.config import load_project, load_worker
    from orchestrator.policy.network import full_network
    from orchestrator.runtime import execute, prepare

    jobs = [
        ["fetch", "http_allowed", "http://allowed.test/"],
        ["fetch", "https_allowed", "https://allowed.test/"],
        ["fetch", "http_denied", "http://denied.test/"],
        ["connect", "direct_ip", internet["addresses"]["ipweb"], 80],
    ]
    command = json.dumps(["python3", "-c", probe_script(jobs)])
    project.extra = "untrusted_network: allow\n"
    project.write_project()
    project.worker("listed", f"command: {command}\nnetwork: {{allow: [allowed.test]}}")
    project.worker("closed", f"command: {command}\nresources: {{timeout: 60}}")
    project.worker("open", f"command: {command}\ntrust: session\nnetwork: full")
    loaded = load_project(project.root)
    audit = AuditLog(loaded.sandbox_root / "audit.jsonl")

    def run(name):
        prepared = prepare(loaded, load_worker(loaded, name))
        if name == "open":  # let the project's own network reach the test servers too
            engine.prepare_network(prepared.spec)
            for cid in internet["web_ids"]:
                info = engine.api.inspect_container(cid)
                if prepared.spec.network_mode not in info["NetworkSettings"]["Networks"]:
                    engine.api.connect_container_to_network(
                        cid, prepared.spec.network_mode, aliases=internet["aliases"][cid]
                    )
        result = execute(engine, prepared, audit=audit)
        return prepared, result, last_json(result.stdout)

    prepared, result, seen = run("listed")
    internet["keys"].add(eg.allowlist_key(eg.validate_allowlist(["allowed.test"])))
    assert prepared.spec.network_mode.startswith("orchestrator-egress-")
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
    try:
        assert prepared.spec.network_mode == full_network(loaded.root)
        assert seen["http_allowed"][:2] == ["ok", 200]
        assert seen["http_denied"][:2] == ["ok", 200]
    finally:
        for cid in internet["web_ids"]:
            engine.api.disconnect_container_from_network(
                cid, prepared.spec.network_mode, force=True
            )
    # The project network is shared, not owned: gc removes it once nothing uses it.
    assert prepared.spec.network_mode in engine.collect_shared(idle_seconds=0)
