"""Egress credentials without an engine: the declaration's rules (plan time, one line each),
the plan, the run CA, the proxy's contract and the image's encoding and scrubbing code."""

from __future__ import annotations

import ast
import base64
import importlib.util
import json
import pickle
import subprocess
import sys
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from cryptography import x509

from orchestrator import credproxy as contract
from orchestrator.cli.main import main
from orchestrator.config import load_project, load_worker
from orchestrator.errors import ConfigError, PolicyError
from orchestrator.prepare import prepare
from orchestrator.runca import make_run_ca
from orchestrator.runtime.container import ContainerBackend

IMAGE = Path(__file__).resolve().parents[2] / "images" / "credproxy"
CREDENTIAL = """credentials:
  llm:
    source: env
    env: OPENAI_API_KEY
    egress:
      hosts: [{hosts}]
      format: 'Bearer {{value}}'
"""


def _forms() -> ModuleType:
    spec = importlib.util.spec_from_file_location("credproxy_forms", IMAGE / "forms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["credproxy_forms"] = module
    spec.loader.exec_module(module)
    return module


def _project(project, hosts="api.example.org", extra=""):
    project.extra = CREDENTIAL.format(hosts=hosts) + extra
    project.write_project()
    return project


def _prepare(project, front):
    project.worker("w", 'command: ["true"]\n' + front)
    loaded = load_project(project.root)
    return prepare(loaded, load_worker(loaded, "w"))


# -- the declaration, at plan time ------------------------------------------------------


def test_an_untrusted_worker_gets_an_egress_credential_as_a_placeholder(project):
    _project(project)
    prepared = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    spec = prepared.spec
    assert prepared.grant.trust == "untrusted" and prepared.grant.egress == ("llm",)
    assert prepared.grant.secrets == ()  # nothing under /run/secrets
    (binding,) = spec.network.credentials
    assert binding.hosts == ["api.example.org:443"] and binding.header == "authorization"
    assert contract.PLACEHOLDER_PATTERN.fullmatch(spec.env["OPENAI_API_KEY"])
    assert spec.env["OPENAI_API_KEY"] == binding.placeholder
    assert binding.placeholder.startswith("orcph-llm-")
    for variable in contract.CA_VARIABLES:
        assert spec.env[variable] == contract.WORKER_BUNDLE
    assert spec.env["HTTPS_PROXY"] == contract.CREDPROXY_URL
    assert [m.target for m in spec.mounts if m.target == contract.WORKER_BUNDLE]
    assert not [m for m in spec.mounts if m.target == "/run/secrets"]
    # a new run, a new placeholder
    again = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    assert again.spec.env["OPENAI_API_KEY"] != spec.env["OPENAI_API_KEY"]


@pytest.mark.parametrize(
    ("network", "wanted"),
    [
        ("none", "need network: {allow: [...]}"),
        ("full", "need network: {allow: [...]}"),
        ("{allow: [other.example.org]}", "bound to api.example.org:443, which the allowlist"),
        ("{allow: ['api.example.org:8443']}", "bound to api.example.org:443"),
    ],
)
def test_an_egress_credential_needs_an_allowlist_covering_its_hosts(project, network, wanted):
    _project(project, extra="untrusted_network: full\n")
    with pytest.raises(PolicyError) as raised:
        _prepare(project, f"secrets: [llm]\nnetwork: {network}")
    (problem,) = raised.value.problems
    assert wanted in problem and "w.worker:" in problem and "\n" not in problem


def test_a_credential_without_egress_is_still_refused_at_untrusted(project):
    project.extra = CREDENTIAL.format(hosts="api.example.org") + (
        "  git: {source: env, env: GIT_TOKEN}\n"
    )
    project.write_project()
    with pytest.raises(PolicyError, match="git: refused at trust 'untrusted'.*egress binding"):
        _prepare(project, "secrets: [llm, git]\nnetwork: {allow: [api.example.org]}")


def test_the_placeholder_variable_is_the_orchestrators(project):
    _project(project)
    with pytest.raises(PolicyError, match=r"w.worker:\d+: env.OPENAI_API_KEY: .*placeholder"):
        _prepare(
            project,
            "secrets: [llm]\nnetwork: {allow: [api.example.org]}\nenv: {OPENAI_API_KEY: x}",
        )
    with pytest.raises(ConfigError, match="SSL_CERT_FILE: set by the orchestrator"):
        _prepare(
            project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}\nenv: {SSL_CERT_FILE: x}"
        )


@pytest.mark.parametrize(
    ("binding", "wanted"),
    [
        ("hosts: ['*.example.org']", "wildcards are refused"),
        ("hosts: [192.0.2.10]", "IP literals are refused"),
        ("hosts: ['https://api.example.org/v1']", "without scheme"),
        ("hosts: []", "at least 1 item"),
        ("hosts: [api.example.org], header: host", "frames the request"),
        ("hosts: [api.example.org], header: 'bad header'", "not an HTTP header name"),
        ("hosts: [api.example.org], format: 'Bearer'", "'{value}' exactly once"),
        ("hosts: [api.example.org], query: key", "body, query and cookie injection are refused"),
        ("hosts: [api.example.org], body: true", "body, query and cookie injection are refused"),
    ],
)
def test_bindings_are_checked_with_one_line_naming_file_line_and_field(project, binding, wanted):
    project.extra = (
        f"credentials:\n  llm:\n    source: env\n    env: K\n    egress: {{{binding}}}\n"
    )
    project.write_project()
    with pytest.raises(ConfigError) as raised:
        load_project(project.root)
    (problem,) = raised.value.problems
    assert wanted in problem, problem
    assert problem.startswith(f"{project.root / 'orchestrator.yaml'}:6: credentials.llm.egress")
    assert "\n" not in problem


def test_the_cli_refuses_at_plan_time_with_exit_125(project, capsys):
    _project(project)
    project.worker("w", 'command: ["true"]\nsecrets: [llm]\nnetwork: none')
    with pytest.raises(SystemExit) as exited:
        main(["plan", "w", "--project", str(project.root)])
    assert exited.value.code == 125
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "w.worker:3: secrets: egress credential(s) llm need network: {allow" in line


def test_the_swarm_refuses_egress_credentials_in_one_line(project):
    from orchestrator.docker.swarm import render

    _project(project)
    prepared = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    refusal = render.refusal(replace(prepared.spec, isolation="runc"))
    assert refusal is not None and "egress credentials (llm)" in refusal


def test_a_child_gets_an_egress_credential_only_if_its_parent_holds_it(project):
    from orchestrator.policy.restrict import restrict

    _project(project)
    parent = _prepare(project, "network: {allow: [api.example.org]}\nchildren: [c]")
    project.worker("c", 'command: ["true"]\nsecrets: [llm]\nnetwork: {allow: [api.example.org]}')
    loaded = load_project(project.root)
    child = load_worker(loaded, "c")
    with pytest.raises(PolicyError, match="asks egress credential 'llm' but parent"):
        restrict(parent.grant, "w", loaded, child, parent.grant.paths)


# -- the run CA -------------------------------------------------------------------------


def test_the_run_ca_is_short_lived_and_limited_to_the_bound_names():
    ca = make_run_ca("run1", ["api.example.org"], lifetime_s=600)
    cert = x509.load_pem_x509_certificate(ca.certificate)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    assert [n.value for n in names.permitted_subtrees] == ["api.example.org"]
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds() < 3 * 3600
    assert b"PRIVATE KEY" in ca.key and b"PRIVATE" not in ca.certificate
    assert "PRIVATE" not in repr(ca)
    with pytest.raises(TypeError):
        pickle.dumps(ca)


def _leaf_served(ca, san: x509.GeneralName, server_hostname: str | None) -> str:
    """A certificate the run CA issued for ``san``, served on loopback; what a client that
    trusts the run CA (only) makes of it: "ok" or the verification error."""
    import socket
    import ssl
    import tempfile
    import threading
    from datetime import UTC, datetime, timedelta

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key = serialization.load_pem_private_key(ca.key, None)
    ca_cert = x509.load_pem_x509_certificate(ca.certificate)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([san]), critical=True)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    with tempfile.TemporaryDirectory() as folder:
        chain, secret = Path(folder, "chain.pem"), Path(folder, "key.pem")
        chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        secret.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(chain, secret)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        connection, _ = listener.accept()
        try:
            with server_context.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cadata=ca.certificate.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            client.wrap_socket(raw, server_hostname=server_hostname),
        ):
            return "ok"
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    finally:
        listener.close()
        thread.join(10)


def test_the_run_ca_cannot_vouch_for_an_ip_address():
    """Its name constraints exclude every IPv4 and IPv6 address: a certificate it issued
    for one is refused by a client that trusts the CA (OpenSSL, through Python's ssl),
    while one for the bound name is accepted."""
    import ipaddress

    ca = make_run_ca("run1", ["api.example.org"], lifetime_s=600)
    names = x509.load_pem_x509_certificate(ca.certificate).extensions
    constraints = names.get_extension_for_class(x509.NameConstraints).value
    assert [n.value for n in constraints.excluded_subtrees or []] == [
        ipaddress.ip_network("0.0.0.0/0"),
        ipaddress.ip_network("::/0"),
    ]
    assert _leaf_served(ca, x509.DNSName("api.example.org"), "api.example.org") == "ok"
    loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    refused = _leaf_served(ca, loopback, "127.0.0.1")
    assert refused != "ok" and "excluded" in refused.lower(), refused
    # a CA for a bound address (never made from a declaration, which refuses IP literals)
    # permits that address only
    by_address = make_run_ca("run2", ["127.0.0.1"], lifetime_s=600)
    assert _leaf_served(by_address, loopback, "127.0.0.1") == "ok"
    other = x509.IPAddress(ipaddress.ip_address("127.0.0.2"))
    assert _leaf_served(by_address, other, "127.0.0.1") != "ok"


# -- the contract and the image ---------------------------------------------------------


def test_events_are_parsed_and_a_line_holding_a_value_is_dropped():
    good = {"event": "blocked", "credential": "llm", "host": "API.example.org", "port": 443}
    good |= {"method": "POST", "path": "/v1?x=1", "status": 403, "reason": "placeholder"}
    text = "\n".join(
        [
            "mitmproxy says hello",
            "CREDPROXY " + json.dumps(good),
            "CREDPROXY " + json.dumps({**good, "reason": "sk-the-real-value-123"}),
            "CREDPROXY not json",
        ]
    )
    (event,) = contract.parse_events(text, redact=["sk-the-real-value-123"])
    assert (event.host, event.path, event.status, event.event) == (
        "api.example.org",
        "/v1",
        403,
        "blocked",
    )


def test_the_proxy_config_names_files_never_values():
    binding = contract.Binding("llm", ["a.example.org:443"], "authorization", None, "K", "p")
    config = contract.proxy_config([binding])
    assert config["credentials"][0]["value_file"] == contract.value_file(0)
    assert set(config["credentials"][0]) == {
        "name",
        "hosts",
        "header",
        "format",
        "placeholder",
        "value_file",
    }


def _constants(path: Path) -> dict[str, object]:
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def test_the_image_reads_and_writes_what_the_contract_declares():
    addon = _constants(IMAGE / "addon.py")
    assert addon["EVENT_MARK"] == contract.EVENT_MARK
    assert addon["READY_MARK"].encode() == contract.READY_MARK
    source = (IMAGE / "addon.py").read_text() + (IMAGE / "entry.py").read_text()
    for name in (
        "config.json",
        "value_file",
        "mitmproxy-ca.pem",
        "trust-ca.pem",
        "CREDPROXY_STATE",
    ):
        assert name in source, name
    assert contract.CONFIG_NAME in source and contract.CA_NAME in source
    assert contract.TRUST_NAME in source and contract.ENV_STATE in source
    for field in contract.EVENT_FIELDS:
        assert f'"{field}"' in source, field
    dockerfile = (IMAGE / "Dockerfile").read_text()
    assert f"EXPOSE {contract.CREDPROXY_PORT}" in dockerfile
    assert f"USER {contract.CREDPROXY_UID}:{contract.CREDPROXY_UID}" in dockerfile
    assert f"CREDPROXY_STATE={contract.STATE_DIR}" in dockerfile


PLACEHOLDER = "orcph-llm-0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "spelled",
    [
        PLACEHOLDER.encode(),
        PLACEHOLDER.upper().encode(),
        urllib.parse.quote("".join(f"%{ord(c):02X}" for c in PLACEHOLDER)).encode(),
        ('{"k": "' + "".join(f"\\u{ord(c):04x}" for c in PLACEHOLDER) + '"}').encode(),
        *[base64.b64encode(pre + PLACEHOLDER.encode() + b"!") for pre in (b"", b"a", b"ab")],
        base64.urlsafe_b64encode(b"user:" + PLACEHOLDER.encode()),
    ],
)
def test_the_placeholder_is_found_in_every_spelling(spelled):
    forms = _forms()
    assert forms.contains(b"prefix " + spelled + b" suffix", PLACEHOLDER)


def test_nothing_is_found_where_it_is_not():
    forms = _forms()
    assert not forms.contains(b"orcph-llm- and an unrelated body " * 20, PLACEHOLDER)


def test_the_scrubber_removes_a_value_split_across_chunks_and_keeps_lengths():
    forms = _forms()
    value = "sk-REALVALUE-1234567890"
    data = f"a {value} b {json.dumps(value)} c".encode() * 3
    scrub = forms.Scrubber({value: "credential llm"})
    out = b"".join(scrub(data[i : i + 3]) for i in range(0, len(data), 3)) + scrub(b"")
    assert value.encode() not in out and len(out) == len(data)
    assert out.count(b"[credential llm]") == 6


SECRET = "sk-REAL/Value+1234567890"


@pytest.mark.parametrize(
    "spelled",
    [
        SECRET,
        SECRET.lower(),
        SECRET.upper(),
        json.dumps(SECRET).replace("/", "\\/"),  # the JSON escape of '/'
        urllib.parse.quote(SECRET, safe=""),
        urllib.parse.quote(SECRET, safe="").lower(),  # lower-case percent-encodings
        urllib.parse.quote(SECRET),  # only some characters encoded
        "".join(f"\\u{ord(c):04x}" for c in SECRET),
        "".join(f"\\u{ord(c):04X}" for c in SECRET),
        base64.b64encode(b"user:" + SECRET.encode()).decode(),
        base64.urlsafe_b64encode(b"ab" + SECRET.encode()).decode(),
        urllib.parse.quote(urllib.parse.quote(SECRET, safe=""), safe=""),  # two levels
    ],
)
def test_the_scrubber_leaves_no_spelling_the_request_side_finds(spelled):
    """Whatever the request side would find the secret in (``contains``), the scrubber
    leaves nothing of: a spelling replaced where it stands, a nested one masked whole."""
    forms = _forms()
    data = f"before {spelled} after".encode()
    assert forms.contains(data, SECRET)  # what the request side would block
    scrub = forms.Scrubber({SECRET: "credential llm"})
    out = scrub.scrub(data)
    assert not forms.contains(out, SECRET), out
    assert len(out) == len(data)
    chunked = forms.Scrubber({SECRET: "credential llm"})
    streamed = b"".join(chunked(data[i : i + 5]) for i in range(0, len(data), 5)) + chunked(b"")
    assert not forms.contains(streamed, SECRET), streamed


def test_a_trust_ca_file_is_never_read_through_a_link(tmp_path):
    from orchestrator.errors import OrchestratorError
    from orchestrator.runtime.credproxy import _trusted

    real = tmp_path / "ca.pem"
    real.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert _trusted([str(real)]).startswith(b"-----BEGIN CERTIFICATE-----")
    (tmp_path / "certs").symlink_to(tmp_path)
    with pytest.raises(OrchestratorError, match=r"network.trust_ca: cannot read .*certs"):
        _trusted([str(tmp_path / "certs" / "ca.pem")])


# -- the run's hook, with the fake engine -----------------------------------------------


class _Recording:
    """Wraps the fake engine's proxy start to see what the proxy is given."""

    def __init__(self, engine):
        self.engine, self.state, self.files = engine, None, {}
        original = engine.start_credential_proxy

        def start(spec, state, user):
            self.state = state
            self.files = {
                p.name: (p.stat().st_mode & 0o777, p.read_bytes()) for p in state.iterdir()
            }
            self.bundle = next(m.source for m in spec.mounts if m.target == contract.WORKER_BUNDLE)
            return original(spec, state, user)

        engine.start_credential_proxy = start


def test_the_proxy_starts_before_the_worker_and_goes_with_its_state(project):
    from orchestrator.runtime import execute, open_audit
    from tests.unit.fake_engine import FakeEngine

    _project(project)
    prepared = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    engine = FakeEngine()
    seen = _Recording(engine)
    value = "sk-unit-value-0123456789"
    execute(
        ContainerBackend(engine),
        prepared,
        audit=open_audit(prepared.project),
        staging=None,
        secrets={"llm": value},
    )
    calls = engine.calls
    # the proxy starts while the worker's container is made, and serves before it starts
    assert calls.index("network") < calls.index("credproxy") < calls.index("start")
    assert calls.index("network") < calls.index("create") < calls.index("start")
    # the proxy was given the value in a 0400 file, the CA key, and no value elsewhere
    assert seen.files["value-0"] == (0o400, value.encode())
    assert seen.files[contract.CA_NAME][0] == 0o400
    assert b"PRIVATE KEY" in seen.files[contract.CA_NAME][1]
    assert value.encode() not in seen.files[contract.CONFIG_NAME][1]
    # ... and never to the worker: no /run/secrets, the bundle holds the certificate only
    assert not prepared.paths.secrets_dir.exists()
    assert not seen.state.exists()  # the values and the key are gone with the run
    assert not Path(seen.bundle).exists()  # the run's folder too


def test_without_a_value_no_proxy_and_no_worker_start(project):
    from orchestrator.errors import OrchestratorError
    from orchestrator.runtime import execute, open_audit
    from tests.unit.fake_engine import FakeEngine

    _project(project)
    prepared = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    engine = FakeEngine()
    with pytest.raises(OrchestratorError, match="egress credential.*llm.*not resolved"):
        execute(
            ContainerBackend(engine), prepared, audit=open_audit(prepared.project), staging=None
        )
    assert "credproxy" not in engine.calls and "create" not in engine.calls


def test_a_backend_without_credential_proxies_refuses_egress_credentials_first(project):
    from orchestrator.errors import OrchestratorError
    from orchestrator.runtime import execute, open_audit
    from tests.unit.fake_engine import FakeEngine
    from tests.unit.seam_only import SeamOnly

    _project(project)
    prepared = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    engine = FakeEngine()
    backend = SeamOnly(
        ContainerBackend(engine), name="vm", capabilities={"credential_proxies": False}
    )
    with pytest.raises(OrchestratorError) as refused:
        execute(backend, prepared, audit=open_audit(prepared.project), staging=None)
    assert str(refused.value) == (
        "the vm backend cannot run a credential proxy, which the egress credentials of "
        "worker 'w' need: use --engine docker"
    )
    assert engine.calls == []  # before anything is made (not even gc's listing)


def test_a_slow_proxy_is_waited_for_and_a_failed_one_starts_no_worker(project):
    """The proxy's start overlaps the worker's creation; the worker's start waits for it,
    and a proxy that fails (after the worker's container was made) leaves it unstarted."""
    import threading

    from orchestrator.errors import EngineError
    from orchestrator.runtime import execute, open_audit
    from tests.unit.fake_engine import FakeEngine

    _project(project)
    prepared = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    engine = FakeEngine()
    created = threading.Event()
    original_create, original_start = engine.create, engine.start_credential_proxy

    def create(spec):
        created.set()
        return original_create(spec)

    def slow(spec, state, user):
        assert created.wait(10)  # the worker's container is made meanwhile
        time.sleep(0.2)
        engine.calls.append("proxy-ready")
        return original_start(spec, state, user)

    engine.create, engine.start_credential_proxy = create, slow
    execute(
        ContainerBackend(engine),
        prepared,
        audit=open_audit(prepared.project),
        staging=None,
        secrets={"llm": "v"},
    )
    assert engine.calls.index("create") < engine.calls.index("proxy-ready")
    assert engine.calls.index("proxy-ready") < engine.calls.index("start")

    prepared = _prepare(project, "secrets: [llm]\nnetwork: {allow: [api.example.org]}")
    engine = FakeEngine()

    def broken(spec, state, user):
        raise EngineError("the credential proxy exited with code 2 before accepting")

    engine.start_credential_proxy = broken
    with pytest.raises(EngineError, match="before accepting"):
        execute(
            ContainerBackend(engine),
            prepared,
            audit=open_audit(prepared.project),
            staging=None,
            secrets={"llm": "v"},
        )
    assert "start" not in engine.calls
    assert engine.containers == set()  # the worker's container, made meanwhile, is gone
    assert not any(Path("/dev/shm").glob(f"*{prepared.spec.run_id}*"))


def test_an_images_ca_bundle_is_read_once_and_kept_for_the_next_process(tmp_path, monkeypatch):
    """The bundle is read from a container made for it once per image id; the next process
    finds it in the user's cache folder, unless another user could have written there."""
    import io
    import tarfile

    from orchestrator.docker import credproxy as docker_credproxy

    made: list[str] = []
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("ca-certificates.crt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"CERTS"))

    class Api:
        def inspect_image(self, image):
            return {"Id": "sha256:" + "ab" * 32}

        def create_container(self, image, **_):
            made.append(image)
            return {"Id": "reader"}

        def create_host_config(self, **_):
            return {}

        def get_archive(self, container, path):
            return [archive.getvalue()], {}

        def remove_container(self, container, force):
            pass

    class Engine:
        api = Api()

        def labels_for(self, extra):
            return extra

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(docker_credproxy, "_BUNDLES", {})
    assert docker_credproxy.image_bundle(Engine(), "img") == b"CERTS"
    monkeypatch.setattr(docker_credproxy, "_BUNDLES", {})  # a new process
    assert docker_credproxy.image_bundle(Engine(), "img") == b"CERTS"
    assert len(made) == 1
    folder = tmp_path / "orchestrator" / "ca-bundles"
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o770)  # another user's write would be trusted: not used
    (folder / ("ab" * 32 + ".pem")).write_bytes(b"PLANTED")
    monkeypatch.setattr(docker_credproxy, "_BUNDLES", {})
    assert docker_credproxy.image_bundle(Engine(), "img") == b"CERTS"
    assert len(made) == 2


def test_the_proxy_wheels_are_downloaded_once_and_kept_in_the_users_cache(monkeypatch, tmp_path):
    from orchestrator.docker import images

    calls = []

    def download(command, **_kwargs):
        calls.append(command)
        dest = Path(command[command.index("--dest") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "mitmproxy-x.whl").write_bytes(b"wheel")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(images.subprocess, "run", download)
    images.download_wheels(tmp_path / "one", lambda _: None)
    images.download_wheels(tmp_path / "two", lambda _: None)
    assert len(calls) == 1  # the second build copied them from the cache
    assert (tmp_path / "two" / "mitmproxy-x.whl").read_bytes() == b"wheel"
    assert not (tmp_path / "two" / ".complete").exists()
    folder = tmp_path / "cache" / "orchestrator" / "wheels"
    folder.chmod(0o777)  # a folder others may write is not trusted: downloaded again
    images.download_wheels(tmp_path / "three", lambda _: None)
    assert len(calls) == 2


def test_a_taken_spare_is_owned_by_the_process_its_name_gives_and_a_free_one_by_none():
    from orchestrator import labels
    from orchestrator.docker import credproxy as dcp

    me = labels.current_owner()
    spare = {
        labels.MANAGED: "true",
        labels.SHARED: "true",
        dcp.ROLE_LABEL: dcp.SPARE_ROLE,
        dcp._NS_LABEL: me.pid_ns,
    }
    free = dcp.owner_labels(f"{dcp.SPARE_PREFIX}0123456789abcdef", spare)
    assert free == spare  # shared: gc's owner pass leaves it alone
    mine = f"{dcp.TAKEN_PREFIX}orchestrator-secrets-{me.pid}-{me.start}-r1-credproxy"
    owned = dcp.owner_labels(mine, spare)
    assert labels.SHARED not in owned and labels.owner_state(owned) == "alive"
    assert owned[labels.RUN_ID] == "r1"
    dead = f"{dcp.TAKEN_PREFIX}orchestrator-secrets-{me.pid}-1-r1-credproxy"  # pid reused
    assert labels.owner_state(dcp.owner_labels(dead, spare)) == "gone"
    elsewhere = {**spare, dcp._NS_LABEL: "pid:[1]"}  # made and taken in another namespace
    assert labels.owner_state(dcp.owner_labels(mine, elsewhere)) == "foreign"
    other = {labels.MANAGED: "true", labels.SHARED: "true", dcp.ROLE_LABEL: "egress"}
    assert dcp.owner_labels(mine, other) == other  # only spares are judged by their name
