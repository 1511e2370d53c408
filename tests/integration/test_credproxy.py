"""Egress credentials against the real engine: the worker holds a placeholder, the run's
credential proxy writes the key in toward the bound host only, and every attack below is
tried from inside a real worker (runc and gVisor).

The local internet: a fake OpenAI-compatible API (``llm``, accepting only the real key)
and a recorder (``other``, printing every request it receives) on a declared service
network, with certificates from a test CA given in ``network.trust_ca``. Clients: curl,
urllib, requests and httpx in a test image built on the worker image.
"""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import shutil
import tarfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orchestrator import Orchestrator
from orchestrator.credproxy import CREDPROXY_IMAGE, PLACEHOLDER_PATTERN, proxy_ids
from orchestrator.docker.egress import EGRESS_KEY
from orchestrator.docker.egress_gc import remove_egress
from orchestrator.docker.images import WORKER_IMAGE, build_all
from orchestrator.errors import EngineError, ImageBuildError
from tests.integration.conftest import unavailable
from tests.integration.credfake import SERVER
from tests.integration.credprobe import CORPUS, PROBE

pytestmark = pytest.mark.docker

CLIENT_IMAGE = "orchestrator/test-credclient:2"
TEST_LABEL = "io.orchestrator.test"
CLIENT_DOCKERFILE = f"""
FROM {WORKER_IMAGE}
USER root
RUN set -eu; export DEBIAN_FRONTEND=noninteractive; apt-get update; \\
    apt-get install -y --no-install-recommends curl python3-requests python3-httpx \\
        python3-h2; \\
    apt-get clean; rm -rf /var/lib/apt/lists/*
USER 10001:10001
"""


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _certificates(names: list[str]) -> tuple[bytes, dict[str, tuple[bytes, bytes]]]:
    """A test CA and, per name, a server certificate and key it signed."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "credproxy test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaves = {}
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        leaves[name] = (_pem(cert), key_pem)
    return _pem(ca), leaves


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o444, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def world(engine):
    """The service network, the fake API and the recorder; the client image."""
    from orchestrator.docker.images import build_credproxy_image

    if not engine.image_exists(CREDPROXY_IMAGE):
        try:
            build_credproxy_image(engine, rebuild_base=False, progress=lambda _: None)
        except ImageBuildError as exc:  # no index or mirror here: a missing means
            unavailable(f"cannot build {CREDPROXY_IMAGE}: {exc}")
    if not engine.image_exists(WORKER_IMAGE):
        build_all(engine, with_credproxy=False)
    if not engine.image_exists(CLIENT_IMAGE):
        for _ in engine.api.build(
            fileobj=io.BytesIO(CLIENT_DOCKERFILE.encode()),
            tag=CLIENT_IMAGE,
            rm=True,
            forcerm=True,
            labels={TEST_LABEL: "credproxy"},
            decode=True,
        ):
            pass
    net = f"credtest-{uuid.uuid4().hex[:8]}"
    llm, other = f"llm.{net}", f"other.{net}"
    ca, leaves = _certificates([llm, other])
    real = f"sk-REALKEY/{secrets.token_hex(16)}"  # a '/': JSON and percent forms differ
    engine.api.create_network(net, driver="bridge")
    made: list[str] = []
    allow: list[str] = []
    try:
        for role in ("llm", "other"):
            cert, key = leaves[f"{role}.{net}"]
            container = engine.api.create_container(
                image=CLIENT_IMAGE,  # python3 with h2: the fake speaks HTTP/2 too
                command=["python3", "-c", SERVER, role, f"http://{other}:8080"],
                name=f"orchestrator-test-cred{role}-{os.getpid()}-{net}",
                labels=engine.labels_for({TEST_LABEL: "credproxy"}),
                host_config=engine.api.create_host_config(
                    cap_drop=["ALL"], security_opt=["no-new-privileges:true"], network_mode=net
                ),
                networking_config={"EndpointsConfig": {net: {"Aliases": [role]}}},
            )["Id"]
            made.append(container)
            files = {"cert.pem": cert, "key.pem": key, "real": real.encode()}
            engine.api.put_archive(container, "/srv", _tar(files))
            engine.start(container)
        deadline = time.monotonic() + 30
        while not all(b"listening" in engine.api.logs(c) for c in made):
            assert time.monotonic() < deadline, "the test servers did not start"
            time.sleep(0.1)
        allow = [f"{host}:{port}" for host in (llm, other) for port in (8443, 8080)]
        yield {
            "net": net,
            "llm": llm,
            "other": other,
            "ca": ca,
            "real": real,
            "servers": made,
            "allow": allow,
        }
    finally:
        for container in made:
            engine.remove(container)
        try:  # the allowlists' proxies joined the service network: they go first
            for proxy in engine.api.containers(all=True, filters={"network": [net]}):
                key = (proxy.get("Labels") or {}).get(EGRESS_KEY)
                if key:
                    remove_egress(engine, key)
        finally:
            engine.api.remove_network(net)


def _write_project(project, world, isolation: str) -> None:
    (project.root / "ca.pem").write_bytes(world["ca"])
    project.isolation = isolation
    project.extra = (
        "credentials:\n"
        "  llm:\n"
        "    source: env\n"
        "    env: CREDTEST_REAL_KEY\n"
        "    egress:\n"
        f"      hosts: ['{world['llm']}:8443']\n"
        "      format: 'Bearer {value}'\n"
        "      placeholder_env: OPENAI_API_KEY\n"
        "network:\n"
        f"  services: [{{network: {world['net']}}}]\n"
        "  trust_ca: [ca.pem]\n"
    )
    project.write_project()
    allow = world["allow"]
    project.worker(
        "w",
        f"""
        image: {CLIENT_IMAGE}
        command: ["python3", "-c", "pass"]
        secrets: [llm]
        network: {{allow: {json.dumps(allow)}}}
        sandbox: {{}}
        resources: {{memory: 512m}}
        """,
    )


def test_a_placeholder_holding_worker_gets_answers_and_leaks_nothing(
    engine, world, project, isolation, monkeypatch
):
    real = world["real"]
    monkeypatch.setenv("CREDTEST_REAL_KEY", real)
    _write_project(project, world, isolation)
    logs: list[str] = []
    original = type(engine).credential_proxy_log

    def captured(self, container_id):  # the proxy's own log, as the hook reads it
        text = original(self, container_id)
        logs.append(text)
        return text

    monkeypatch.setattr(type(engine), "credential_proxy_log", captured)
    with Orchestrator(project.root, engine=engine) as orch:
        planned = json.dumps(orch.plan("w").spec.to_dict())
        assert real not in planned
        session = orch.open_session("w")
        with session:
            run = session._run
            inspected = json.dumps(engine.api.inspect_container(run.launch.container_id))
            proxies = [  # the run's own proxy, or the spare it took (named after its run)
                c
                for c in engine.api.containers(filters={"label": "io.orchestrator.role"})
                if c["Labels"]["io.orchestrator.role"] in ("credproxy", "credproxy-spare")
                and run.spec.run_id in c["Names"][0]
            ]
            proxy_inspect = json.dumps([engine.api.inspect_container(p["Id"]) for p in proxies])
            done = session.exec(
                ["python3", "-c", PROBE, f"https://{world['llm']}:8443", world["other"]],
                timeout=240,
            )
        assert done.exit_code == 0, done.stderr[-2000:] + "".join(logs)[-3000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULTS "))
        seen = json.loads(line.removeprefix("RESULTS "))
    placeholder = seen["placeholder"]
    assert PLACEHOLDER_PATTERN.fullmatch(placeholder), placeholder
    # clients, unchanged, reach the API: the fake accepted only the real key
    assert seen["curl"][0] == "200", seen["curl"]
    for client in ("urllib", "requests", "httpx"):
        assert seen[client][0] == 200, (client, seen[client])
        assert "summary: summarise this" in seen[client][1]
    # the placeholder anywhere else is blocked
    for attempt in (
        "other_http_header",
        "other_http_query",
        "other_http_body",
        "llm_body",
        "llm_query",
        "llm_other_header",
        "llm_body_base64",
        "llm_body_percent",
        "llm_body_json_escaped",
        "llm_plain_http",
        "host_mismatch",
    ):
        assert seen[attempt][0] == 403, (attempt, seen[attempt])
    # tunnelled untouched to an unbound host: the placeholder, never the value, arrives
    assert seen["other_https_header"][0] == 200, seen["other_https_header"]
    assert seen["sni_mismatch"][0] == "tls-refused", seen["sni_mismatch"]
    assert seen["ip_literal_connect"] == ["connect", "403"], seen["ip_literal_connect"]
    # reflection and a streamed answer come back scrubbed; a redirect carries nothing
    assert seen["echo"][0] == 200 and "[credential llm]" in seen["echo"][1], seen["echo"]
    assert seen["sse"][0] == 200 and seen["sse"][1].count("[credential llm]") == 4, seen["sse"]
    assert "REALKEY" not in seen["echo"][1] + seen["sse"][1]
    # a WebSocket: the handshake carried the key, its reflection came back scrubbed, and a
    # message holding the placeholder closed it instead of reaching the server
    status, first, echoed, after = seen["websocket"]
    assert (status, echoed) == ("101", "echo:hello"), seen["websocket"]
    assert first.startswith("hello Bearer [credential llm]"), first
    assert after is None or after.startswith("closed"), after
    assert "steal" not in engine.api.logs(world["servers"][0]).decode(errors="replace")
    assert seen["redirect"][0] == 403, seen["redirect"]
    # nothing of the value or the CA key inside the worker
    assert seen["state_visible"] is False
    assert seen["found"] == [], seen["found"]
    assert seen["env_ca"]["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"
    # ... nor outside it, where it could be read back
    assert real not in json.dumps(seen)
    assert real not in inspected and placeholder in inspected
    assert len(proxies) == 1 and real not in proxy_inspect
    assert logs and all(real not in text for text in logs)
    received = engine.api.logs(world["servers"][1]).decode(errors="replace")
    assert "RECEIVED" in received and real not in received
    assert placeholder in received  # what went to the unbound host over HTTPS
    sandbox = project.root / ".sandbox"
    for path in sandbox.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert real.encode() not in path.read_bytes(), path
    assert not any(Path("/dev/shm").glob(f"*{run.spec.run_id}*"))  # the state is gone
    entries = [json.loads(x) for x in (sandbox / "audit.jsonl").read_text().splitlines()]
    events = [e for e in entries if e["operation"] == "egress.credential"]
    substituted = [e for e in events if e["allowed"]]
    blocked = [e for e in events if not e["allowed"]]
    assert len(substituted) >= 4 and all(e["metadata"]["status"] for e in substituted)
    assert len(blocked) >= 11, blocked
    assert all("?" not in e["metadata"]["path"] for e in events)


def _image_forms():
    """The proxy image's own ``forms`` module: ``contains`` finds a secret in every spelling
    the proxy's request side searches for."""
    import importlib.util

    source = Path(__file__).resolve().parents[2] / "images" / "credproxy" / "forms.py"
    spec = importlib.util.spec_from_file_location("credproxy_forms_it", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Each request shape of the corpus (credprobe.CORPUS): what the worker must get back, and
#: the reason the proxy audits its refusal with (None: forwarded, the key written in).
CORPUS_EXPECTED: dict[str, tuple[list[str], str | None]] = {
    "absolute_other": (["403"], "absolute-form target names another host"),
    "absolute_same": (["200"], None),
    "host_twice": (["403"], "Host given twice"),
    "host_twice_other": (["403"], "Host given twice"),
    "host_other": (["403"], "Host names another host"),
    "host_other_port": (["403"], "Host names another host"),
    "host_folded": (["403"], "folded header line"),
    "http10_no_host": (["403"], "no Host header"),
    "pipelined": (["200", "403"], "Host names another host"),
    "content_length_twice": (["400"], "request refused by mitmproxy (multiple content-length"),
    "chunked_and_length": (["400"], "request refused by mitmproxy (message with both"),
    "upgrade_other": (["403"], "upgrade to anything but WebSocket version 13"),
    "upgrade_unasked": ([], "switched to a protocol other than WebSocket 13"),
    "websocket_version_8": (["403"], "upgrade to anything but WebSocket version 13"),
    "trailers": (["200"], None),
    "encoded_unknown": (["502"], "Content-Encoding 'x-secret' cannot be scrubbed"),
    "encoded_stacked": (["502"], "Content-Encoding 'gzip,gzip' cannot be scrubbed"),
    "reflect_upper": (["200"], None),
    "reflect_percent-lower": (["200"], None),
    "reflect_json-slash": (["200"], None),
    "reflect_json-u": (["200"], None),
    "connect_other_port": (["connect 403"], "CONNECT to a bound host on a port it is not"),
    "h2_same": (["200"], None),
    "h2_authority_other": (["403"], "Host names another host"),
    "h2_authority_vs_host": (["ConnectionTerminated"], "HTTP/2 protocol error refused"),
}


def test_the_proxy_forwards_only_requests_it_understands(
    engine, world, project, isolation, monkeypatch
):
    """Request shapes a front end could route to another host than the tunnel's, framing
    it could read another way, upgrades that would end inspection and answers that carry
    the key back in other shapes, sent as raw bytes through the real proxy: each is
    refused (and audited) or forwarded in origin form with the bound Host, and the real key
    never comes back to the worker in any spelling the proxy searches requests for."""
    real = world["real"]
    monkeypatch.setenv("CREDTEST_REAL_KEY", real)
    _write_project(project, world, isolation)
    llm, other = f"{world['llm']}:8443", f"{world['other']}:8443"
    server_log_before = engine.api.logs(world["servers"][0]).decode(errors="replace")
    with Orchestrator(project.root, engine=engine) as orch, orch.open_session("w") as session:
        done = session.exec(["python3", "-c", CORPUS, llm, other], timeout=240)
    assert done.exit_code == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("CORPUS "))
    seen = json.loads(line.removeprefix("CORPUS "))
    forms = _image_forms()
    assert sorted(seen) == sorted(CORPUS_EXPECTED)
    for name, (statuses, _) in CORPUS_EXPECTED.items():
        got = seen[name]
        assert got["statuses"] == statuses, (name, got["statuses"])
        back = base64.b64decode(got["raw"])
        assert not forms.contains(back, real), (name, back[:400])  # never back to the worker
    # the bound server: the key arrived only in origin form, with one Host naming it
    server_log = engine.api.logs(world["servers"][0]).decode(errors="replace")
    arrived = [
        json.loads(x.removeprefix("BOUND "))
        for x in server_log[len(server_log_before) :].splitlines()
        if x.startswith("BOUND ")
    ]
    keyed = [entry for entry in arrived if real in json.dumps(entry)]
    assert len(keyed) >= 9, arrived  # every forwarded case above wrote the key in
    for entry in keyed:
        _, target, version = entry["line"].split(" ")
        assert target.startswith("/"), entry
        assert version in ("HTTP/1.1", "HTTP/1.0", "HTTP/2"), entry
        named = [v for n, v in entry["headers"] if n.lower() in ("host", ":authority")]
        assert named == [llm], entry
    assert any(entry["line"] == "GET /v1/models HTTP/1.1" for entry in keyed)  # rewritten
    assert "absolute" not in json.dumps(arrived)
    received = engine.api.logs(world["servers"][1]).decode(errors="replace")
    assert real not in received
    # every refusal audited, with its reason
    audit = project.root / ".sandbox" / "audit.jsonl"
    entries = [json.loads(x) for x in audit.read_text().splitlines()]
    blocked = [
        e["metadata"]["reason"]
        for e in entries
        if e["operation"] == "egress.credential" and not e["allowed"]
    ]
    for name, (_, reason) in CORPUS_EXPECTED.items():
        if reason is not None:
            assert any(reason in found for found in blocked), (name, reason, blocked)
    assert real not in audit.read_text()


def test_the_summarise_example_calls_the_fake_api_without_its_key(
    engine, world, tmp_path, monkeypatch
):
    """The example as shipped, pointed at the fake API: a cold one-shot run under gVisor."""
    from tests.integration.conftest import require_gvisor

    require_gvisor(engine)
    example = Path(__file__).resolve().parents[2] / "examples" / "summarise"
    root = tmp_path / "summarise"
    shutil.copytree(example, root)
    host = f"{world['llm']}:8443"
    (root / "ca.pem").write_bytes(world["ca"])
    config = (root / "orchestrator.yaml").read_text().replace("[api.openai.com]", f"[{host}]")
    config += f"network:\n  services: [{{network: {world['net']}}}]\n  trust_ca: [ca.pem]\n"
    (root / "orchestrator.yaml").write_text(config)
    worker = root / "workers" / "summarise.worker"
    worker.write_text(worker.read_text().replace("api.openai.com:443", host))
    monkeypatch.setenv("OPENAI_API_KEY", world["real"])
    with Orchestrator(root, engine=engine) as orch:
        result = orch.run(
            "summarise",
            inputs=[root / "downloads"],
            env={"OPENAI_BASE_URL": f"https://{host}/v1"},
        )
        assert result.exit_code == 0, (result.stdout, result.stderr, result.error)
        assert "2 summarised, 0 failed" in result.stdout
        store = orch.staging.store
        change = store.get(result.outbox.change_id)
        (staged,) = [f for f in change.files if f.path == "summaries.json"]
        with store.open_blob(change.id, staged.sha256) as blob:
            summaries = json.loads(blob.read())
    assert all(item["summary"].startswith("summary: ") for item in summaries), summaries
    assert world["real"] not in json.dumps(summaries)


# -- sessions, the warm pool, batch and child workers -----------------------------------
#
# The placeholder, the proxy and the CA are per run whatever opens the run: these check that
# each way of opening one (a batch's warm pool, a session, a child through the broker) hands
# the proxy its value and the worker its placeholder. The proxy is the same container under
# either runtime, and the main test above already tries every attack under both, so these
# run under runc only (the worker's runtime changes nothing of the paths tested here).

#: A call to the fake API as an SDK makes it: POST, the key from the environment. It prints
#: ``STATUS <code> <answer>`` and exits 0 only on a 200.
CALL = """
import json, os, sys, urllib.error, urllib.request
url, text = sys.argv[1], sys.argv[2]
if text.startswith("/"):
    text = open(text).read()
request = urllib.request.Request(
    url + "/v1/chat/completions",
    data=json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode(),
    headers={"authorization": "Bearer " + os.environ.get("OPENAI_API_KEY", ""),
             "content-type": "application/json"},
)
try:
    with urllib.request.urlopen(request, timeout=60) as answer:
        body = json.loads(answer.read())
        print("STATUS", answer.status, body["choices"][0]["message"]["content"], flush=True)
except urllib.error.HTTPError as exc:
    print("STATUS", exc.code, exc.read()[:200], flush=True)
    sys.exit(3)
"""


def _worker_front(world, command: list[str], extra: str = "") -> str:
    return (
        f"image: {CLIENT_IMAGE}\n"
        f"command: {json.dumps(command)}\n"
        f"network: {{allow: {json.dumps(world['allow'])}}}\n"
        "resources: {memory: 512m}\n" + extra
    )


def _no_proxy_left(engine, run_ids: set[str]) -> None:
    """The runs' proxies and their state are gone (other projects' runs may be going on)."""
    names = [c["Names"][0] for c in engine.api.containers(all=True)]
    for run_id in run_ids:
        label = f"io.orchestrator.run-id={run_id}"
        assert not engine.api.containers(all=True, filters={"label": label}), run_id
        assert not [name for name in names if run_id in name], run_id  # a taken spare
        assert not any(Path("/dev/shm").glob(f"*{run_id}*")), run_id


def _substitutions(project) -> list[dict]:
    audit = project.root / ".sandbox" / "audit.jsonl"
    entries = [json.loads(x) for x in audit.read_text().splitlines()]
    return [e for e in entries if e["operation"] == "egress.credential" and e["allowed"]]


def test_a_batch_from_the_warm_pool_calls_the_api_once_per_input(
    engine, world, project, monkeypatch
):
    monkeypatch.setenv("CREDTEST_REAL_KEY", world["real"])
    _write_project(project, world, "runc")
    url = f"https://{world['llm']}:8443"
    script = "import os, subprocess, sys\n" + "".join(
        [
            "name = os.listdir('/inputs')[0]\n",
            f"sys.exit(subprocess.call(['python3', '-c', {CALL!r}, {url!r}, '/inputs/' + name]))\n",
        ]
    )
    project.worker("each", _worker_front(world, ["python3", "-c", script], "secrets: [llm]\n"))
    folder = project.root / "docs"
    folder.mkdir()
    for n in range(3):
        (folder / f"d{n}.txt").write_text(f"document number {n}")
    done = Orchestrator(project.root, engine=engine).batch("each", [folder], concurrency=2)
    assert [r["status"] for r in done.records] == ["succeeded"] * 3, done.records
    assert done.exit_code == 0
    # each input's run had its own proxy, which wrote the key in: the fake accepted it
    calls = [e for e in _substitutions(project) if e["metadata"]["path"] == "/v1/chat/completions"]
    runs = {e["run_id"] for e in calls}
    assert len(runs) == 3, calls
    _no_proxy_left(engine, runs)


def test_a_child_gets_the_credential_through_its_parent_and_only_then(
    engine, world, project, monkeypatch
):
    from orchestrator.audit import AuditFilter

    monkeypatch.setenv("CREDTEST_REAL_KEY", world["real"])
    _write_project(project, world, "runc")
    url = f"https://{world['llm']}:8443"
    child = ["python3", "-c", CALL, url, "hello from the child"]
    project.worker("child", _worker_front(world, child, "trust: session\nsecrets: [llm]\n"))
    holder = "trust: session\nsecrets: [llm]\nchildren: [child]\n"
    project.worker("parent", _worker_front(world, ["sleep", "infinity"], holder))
    lacking = "trust: session\nchildren: [child]\n"
    project.worker("lacking", _worker_front(world, ["orchestrator-call", "child"], lacking))
    orch = Orchestrator(project.root, engine=engine)
    with orch.open_session("parent") as session:
        own = session.exec(["python3", "-c", CALL, url, "hello from the session"], timeout=120)
        assert own.exit_code == 0, own.stdout + own.stderr
        assert "STATUS 200 summary: hello from the session" in own.stdout
        called = session.exec(["orchestrator-call", "child"], timeout=180)
        assert called.exit_code == 0, called.stdout + called.stderr
        assert "STATUS 200 summary: hello from the child" in called.stdout
        assert world["real"] not in own.stdout + called.stdout + called.stderr
    # a parent without the credential cannot hand it on: refused before any child exists
    refused = orch.run("lacking")
    assert refused.exit_code != 0, refused.stdout
    assert "egress credential 'llm'" in refused.stderr, refused.stderr
    calls = orch.audit.query(AuditFilter(operation="broker.call"))
    assert [e.metadata["child"] for e in calls] == ["child"], calls
    (refusal,) = orch.audit.query(AuditFilter(operation="broker.refused"))
    assert "egress credential 'llm'" in (refusal.reason or ""), refusal
    runs = {e["run_id"] for e in _substitutions(project)}
    assert len(runs) == 2  # the session's own run and its child's: each its own proxy
    _no_proxy_left(engine, runs)


def test_a_proxy_that_does_not_serve_starts_no_worker(engine, world, project, monkeypatch):
    """Fails closed: the proxy starts while the worker's container is made, and a proxy that
    exits before serving (here: an image without one) leaves the worker unstarted."""
    from orchestrator.docker import credproxy as docker_credproxy

    monkeypatch.setenv("CREDTEST_REAL_KEY", world["real"])
    monkeypatch.setattr(docker_credproxy, "CREDPROXY_IMAGE", WORKER_IMAGE)
    _write_project(project, world, "runc")
    project.zone("work", "rw")
    front = "trust: session\nsecrets: [llm]\nsandbox: {zones: [{name: work, mode: rw}]}\n"
    project.worker("touch", _worker_front(world, ["touch", "/work/started"], front))
    with pytest.raises(EngineError, match="before accepting connections; no worker starts"):
        Orchestrator(project.root, engine=engine).run("touch")
    assert not (project.root / "work" / "started").exists()
    audit = project.root / ".sandbox" / "audit.jsonl"
    entries = [json.loads(x) for x in audit.read_text().splitlines()]
    (ended,) = [e for e in entries if e["operation"] == "run.ended"]
    assert ended["allowed"] is False and ended["metadata"]["container_removed"], ended
    _no_proxy_left(engine, {ended["run_id"]})


# -- spare proxies ----------------------------------------------------------------------
#
# A run takes a spare proxy (started earlier, mitmproxy imported, waiting) when there is one,
# and leaves one ready for the next run. These check what a spare is before it is taken,
# that one taker wins, that a taken spare of a killed orchestrator is gc's, and the opt-out.


def _spare_names(engine) -> dict[str, str]:
    """Free spares: id -> name."""
    from orchestrator.docker import credproxy as dcp

    found = engine.api.containers(all=True, filters={"label": f"{dcp.ROLE_LABEL}={dcp.SPARE_ROLE}"})
    free = {c["Id"]: c["Names"][0].lstrip("/") for c in found}
    return {cid: name for cid, name in free.items() if name.startswith(dcp.SPARE_PREFIX)}


def _one_spare(engine) -> str:
    """Exactly one fresh free spare, ready (made as a run makes it); its id."""
    from orchestrator.docker import credproxy as dcp

    dcp.wait_for_spares()
    dcp.remove_spares(engine, 0)
    dcp._keep_ready(engine, "{}:{}".format(*proxy_ids()), 1)
    (spare,) = _spare_names(engine)
    return spare


def test_a_spare_holds_nothing_and_reaches_nothing_until_a_run_takes_it(
    engine, world, project, monkeypatch
):
    from orchestrator.docker import credproxy as dcp

    monkeypatch.setenv("CREDTEST_REAL_KEY", world["real"])
    _write_project(project, world, "runc")
    spare = _one_spare(engine)
    info = engine.api.inspect_container(spare)
    assert info["HostConfig"]["NetworkMode"] == "none"
    assert not info["NetworkSettings"]["Networks"]  # out of none too: loopback only
    interfaces = engine.api.exec_create(spare, ["cat", "/proc/net/dev"], user="10002")
    listed = engine.api.exec_start(interfaces["Id"]).decode()
    assert [line.split(":")[0].strip() for line in listed.splitlines()[2:]] == ["lo"], listed
    assert info["HostConfig"]["ReadonlyRootfs"] and info["HostConfig"]["CapDrop"] == ["ALL"]
    folder = Path(info["Config"]["Labels"][dcp.SPARE_STATE_LABEL])
    assert folder.is_dir() and not any(folder.iterdir())  # no value, no key, no config
    assert info["Config"]["Labels"]["io.orchestrator.shared"] == "true"
    # mitmproxy is imported and waits: the spare's own processes, not a run's proxy yet
    deadline = time.monotonic() + 20
    while not any("launch.py" in " ".join(p) for p in engine.api.top(spare)["Processes"]):
        assert time.monotonic() < deadline, engine.api.top(spare)
        time.sleep(0.1)
    # a run takes it: its request is answered through it, and it goes with the run
    url = f"https://{world['llm']}:8443"
    project.worker(
        "call", _worker_front(world, ["python3", "-c", CALL, url, "hi"], "secrets: [llm]\n")
    )
    result = Orchestrator(project.root, engine=engine).run("call")
    assert result.exit_code == 0, (result.stdout, result.stderr, result.error)
    assert "STATUS 200 summary: hi" in result.stdout
    assert spare not in _spare_names(engine)
    with pytest.raises(Exception, match="No such container"):
        engine.api.inspect_container(spare)
    assert not folder.exists()
    # and one is ready for the next run
    dcp.wait_for_spares()
    (after,) = _spare_names(engine)
    assert after != spare
    _no_proxy_left(engine, {result.run_id})


def test_two_takers_of_one_spare_take_it_once(engine, world, tmp_path, monkeypatch):
    """The claim is the rename of the spare's folder: of two runs taking at once, one gets
    the spare and its state moves in; the other gets none (and starts its own proxy)."""
    import threading

    from orchestrator.docker import credproxy as dcp

    spare = _one_spare(engine)
    attached: list[str] = []
    monkeypatch.setattr(
        dcp, "_attach", lambda _e, container, _s, detach: attached.append(container)
    )
    user = "{}:{}".format(*proxy_ids())
    states, got = [], {}
    barrier = threading.Barrier(2)
    shm = Path("/dev/shm")

    def take(n: int) -> None:
        barrier.wait()
        got[n] = dcp._take_spare(engine, None, states[n], user)

    try:
        for n in range(2):
            state = shm / f"orchestrator-secrets-{os.getpid()}-0-racetest{n}-credproxy"
            state.mkdir(mode=0o700)
            (state / "config.json").write_text(json.dumps({"credentials": []}))
            states.append(state)
        threads = [threading.Thread(target=take, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(got.values(), key=str) == [None, spare] or sorted(got.values(), key=str) == [
            spare,
            None,
        ], got
        assert attached == [spare]
        # the winner's state went into the spare's folder, now inside its own state folder
        # (nothing of the take is left under a name in /dev/shm); the loser's is untouched
        winner = 0 if got[0] == spare else 1
        assert (states[winner] / "spare" / "config.json").is_file()
        assert sorted(p.name for p in states[winner].iterdir()) == ["spare"]
        assert (states[1 - winner] / "config.json").is_file()
        assert not (states[1 - winner] / "spare").exists()
    finally:
        for state in states:
            shutil.rmtree(state, ignore_errors=True)
        engine.remove(spare)
        dcp.remove_spares(engine, 0)


def test_a_spare_that_dies_as_it_is_taken_gives_way_to_a_new_proxy(
    engine, world, project, monkeypatch
):
    from orchestrator.docker import credproxy as dcp

    monkeypatch.setenv("CREDTEST_REAL_KEY", world["real"])
    _write_project(project, world, "runc")
    spare = _one_spare(engine)
    hand_over = dcp._hand_over

    def die_then_hand_over(state):
        engine.api.kill(dcp.TAKEN_PREFIX + state.name)  # it crashed as it was being taken
        engine.api.wait(dcp.TAKEN_PREFIX + state.name, timeout=30)
        hand_over(state)

    monkeypatch.setattr(dcp, "_hand_over", die_then_hand_over)
    url = f"https://{world['llm']}:8443"
    front = _worker_front(world, ["python3", "-c", CALL, url, "hi"], "secrets: [llm]\n")
    project.worker("call", front)
    result = Orchestrator(project.root, engine=engine).run("call")
    assert result.exit_code == 0 and "STATUS 200 summary: hi" in result.stdout, result
    with pytest.raises(Exception, match="No such container"):
        engine.api.inspect_container(spare)
    _no_proxy_left(engine, {result.run_id})


def test_gc_leaves_a_spare_that_is_being_taken(engine, world):
    """A spare whose folder a run has just claimed (renamed away), not yet renamed itself,
    is left to that run by gc, however old it is; an exited one goes."""
    from orchestrator.docker import credproxy as dcp

    spare = _one_spare(engine)
    info = engine.api.inspect_container(spare)
    folder = Path(info["Config"]["Labels"][dcp.SPARE_STATE_LABEL])
    aside = folder.with_name(".racetest-claimed")
    os.rename(folder, aside)  # as a taker's claim does
    try:
        assert dcp.remove_spares(engine, 0) == []
        assert engine.api.inspect_container(spare)["State"]["Running"]
        engine.api.kill(spare)
        engine.api.wait(spare, timeout=30)
        assert dcp.remove_spares(engine, 0) == [info["Name"].lstrip("/")]
    finally:
        shutil.rmtree(aside, ignore_errors=True)
        engine.remove(spare)


@pytest.mark.serial  # gc of a dead owner's objects: another process's gc may take them first
def test_a_taken_spare_of_a_killed_orchestrator_is_removed_by_gc(
    engine, world, project, monkeypatch
):
    import signal
    import subprocess
    import sys

    from orchestrator.cleanup import collect_all
    from orchestrator.docker import credproxy as dcp

    monkeypatch.setenv("CREDTEST_REAL_KEY", world["real"])
    _write_project(project, world, "runc")
    project.worker("idle", _worker_front(world, ["sleep", "300"], "secrets: [llm]\n"))
    spare = _one_spare(engine)
    env = {**os.environ, "ORCHESTRATOR_CREDPROXY_SPARES": "0"}  # takes, leaves none behind
    child = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", "idle", "--project", str(project.root)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        taken = f"{dcp.TAKEN_PREFIX}orchestrator-secrets-{child.pid}-"
        while not [
            c for c in engine.api.containers() if c["Names"][0].lstrip("/").startswith(taken)
        ]:
            assert child.poll() is None and time.monotonic() < deadline, "no spare was taken"
            time.sleep(0.2)
        assert spare not in _spare_names(engine)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # the taken spare is its run's now: gc removes it with the run's container and network
    done = collect_all(project.root, idle=3600)
    names = {o.name for o in done.removed}
    assert any(name.startswith(taken) for name in names), names
    assert not [c for c in engine.api.containers(all=True) if taken in c["Names"][0]]
    assert not list(Path("/dev/shm").glob(f"orchestrator-secrets-{child.pid}-*"))


def test_an_untaken_spare_exits_by_itself_and_gc_removes_it(engine, world, monkeypatch):
    from orchestrator.docker import credproxy as dcp

    dcp.wait_for_spares()
    dcp.remove_spares(engine, 0)
    monkeypatch.setattr(dcp, "SPARE_IDLE_S", 2)
    dcp._start_spare(engine, "{}:{}".format(*proxy_ids()))
    (spare,) = _spare_names(engine)
    folder = Path(engine.api.inspect_container(spare)["Config"]["Labels"][dcp.SPARE_STATE_LABEL])
    assert engine.api.wait(spare, timeout=30)["StatusCode"] == 0
    assert b"spare not taken" in engine.api.logs(spare)
    name = _spare_names(engine)[spare]
    assert dcp.remove_spares(engine, 3600) == [name]  # exited: removed however young
    assert not _spare_names(engine) and not folder.exists()


def test_no_spares_when_asked_and_a_bad_count_is_one_line(engine, world, project, monkeypatch):
    import subprocess

    from orchestrator.docker import credproxy as dcp

    monkeypatch.setenv("CREDTEST_REAL_KEY", world["real"])
    _write_project(project, world, "runc")
    dcp.wait_for_spares()
    dcp.remove_spares(engine, 0)
    url = f"https://{world['llm']}:8443"
    project.worker(
        "call", _worker_front(world, ["python3", "-c", CALL, url, "hi"], "secrets: [llm]\n")
    )
    monkeypatch.setenv("ORCHESTRATOR_CREDPROXY_SPARES", "0")
    result = Orchestrator(project.root, engine=engine).run("call")
    assert result.exit_code == 0 and "STATUS 200" in result.stdout, result
    dcp.wait_for_spares()
    assert not _spare_names(engine)  # a new proxy served the run, none was left ready
    import sys

    env = {**os.environ, "ORCHESTRATOR_CREDPROXY_SPARES": "many"}
    console = Path(sys.executable).with_name("orchestrator")  # the real entry point
    done = subprocess.run(
        [str(console), "run", "call", "--project", str(project.root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 125, done
    last = done.stderr.splitlines()[-1]  # after the run's own line
    assert "ORCHESTRATOR_CREDPROXY_SPARES='many'" in last and "from 0 (none) to 8" in last
    assert "Traceback" not in done.stderr


# -- trust_ca files are policy ----------------------------------------------------------

TRUST_ATTACK = """
import errno, os
def attempt(what, action):
    try:
        action()
        print("DID", what)
    except OSError as exc:
        print("refused", what, errno.errorcode[exc.errno])
def append(path):
    with open(path, "a") as handle:
        handle.write("-----BEGIN CERTIFICATE-----\\nMIIBattacker\\n-----END CERTIFICATE-----\\n")
attempt("edit /repo/certs/ca.pem", lambda: append("/repo/certs/ca.pem"))
attempt("replace /repo/certs/ca.pem", lambda: os.rename("/repo/evil.pem", "/repo/certs/ca.pem"))
attempt("remove /repo/certs/ca.pem", lambda: os.unlink("/repo/certs/ca.pem"))
attempt("add /repo/certs/more.pem", lambda: append("/repo/certs/more.pem"))
attempt("move /repo/certs", lambda: os.rename("/repo/certs", "/repo/old-certs"))
attempt("edit /repo/notes.txt", lambda: append("/repo/notes.txt"))
"""


def test_a_full_worker_cannot_rewrite_a_trust_ca_file(engine, project):
    """``network.trust_ca`` names the CAs the credential proxy trusts upstream, for every
    later run: a policy file, read-only to every worker (here one with /repo writable)."""
    import textwrap

    from tests.integration.conftest import cli
    from tests.integration.test_zones import git_init

    git_init(project.root)
    (project.root / "certs").mkdir()
    ca, _ = _certificates([])
    (project.root / "certs" / "ca.pem").write_bytes(ca)
    (project.root / "evil.pem").write_bytes(ca + b"# the worker's own\n")
    (project.root / "notes.txt").write_text("the repo's own file\n")
    project.extra = "network:\n  trust_ca: [certs/ca.pem]\n"
    project.write_project()
    command = json.dumps(["python3", "-c", textwrap.dedent(TRUST_ATTACK)])
    project.worker("w", f"command: {command}\ntrust: full\nsandbox: {{}}")
    result = cli("run", "w", "--project", str(project.root))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    edit = "EACCES" if os.getuid() == 0 else "EROFS"  # as for every policy file
    assert f"refused edit /repo/certs/ca.pem {edit}" in out, out
    assert "refused replace /repo/certs/ca.pem EXDEV" in out, out  # another mount
    assert "refused remove /repo/certs/ca.pem EROFS" in out, out
    assert "refused add /repo/certs/more.pem EROFS" in out, out
    assert "refused move /repo/certs EBUSY" in out, out  # its folder: a mount point
    assert "DID edit /repo/notes.txt" in out, out  # the rest of /repo stays writable
    assert (project.root / "certs" / "ca.pem").read_bytes() == ca
    assert sorted(p.name for p in (project.root / "certs").iterdir()) == ["ca.pem"]
