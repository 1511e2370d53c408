"""``build.ca``: a build step fetching over HTTPS through the build allowlist's proxy from a
local server whose certificate a test CA signed (as a mirror or a proxy re-signing TLS
would) fails with CERTIFICATE_VERIFY_FAILED without the setting and succeeds with it; the
committed image's own trust store and environment are as they were. See docs/build.md.
"""

from __future__ import annotations

import datetime

import pytest

from orchestrator.docker.images import WORKER_IMAGE
from tests.integration.test_build import builds, docker  # noqa: F401 (the fixture)

pytestmark = pytest.mark.docker

BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: Serves /pkg.txt over HTTPS on 8443 with the certificate in /certs.
SERVER = r"""
import http.server, ssl
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/certs/server.pem", "/certs/server.key")
open("/tmp/pkg.txt", "w").write("package over tls\n")
server = http.server.ThreadingHTTPServer(
    ("0.0.0.0", 8443),
    lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory="/tmp"),
)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def _certificates(name: str) -> tuple[bytes, bytes, bytes]:
    """A test CA's certificate, and a server certificate for ``name`` it signed (+ key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "build.ca test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(pem), server.public_bytes(pem), key_pem


def _digest_and_env(image: str) -> list[str]:
    shown = docker("run", "--rm", "--entrypoint", "sh", image, "-c",
                   f"sha256sum {BUNDLE}; env")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()


def test_build_ca_lets_a_step_fetch_from_a_server_a_project_ca_signed_and_keeps_the_image_s_store(
    builds,  # noqa: F811 (the fixture)
    project,
    tmp_path,
):
    service_net = f"buildca-{builds.marker}"
    server = f"tlssrv-{builds.marker}"
    host = f"{server}.{service_net}"
    ca, cert, key = _certificates(host)
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "server.pem").write_bytes(cert)
    (certs / "server.key").write_bytes(key)
    for path in (certs, *certs.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the server runs as nobody
    (project.root / "test-ca.pem").write_bytes(ca)
    docker("network", "create", service_net)
    try:
        started = docker("run", "-d", "--name", server, "--network", service_net, "--user",
                         "65534", "-v", f"{certs}:/certs:ro", "--entrypoint", "python3",
                         WORKER_IMAGE, "-c", SERVER)  # fmt: skip
        assert started.returncode == 0, started.stderr
        base = f"network:\n  services:\n    - network: {service_net}\nbuild:\n  allow: ['{host}:8443']\n"
        dockerfile = (
            "FROM @BASE@\nUSER root\nLABEL test.mark=@MARK@\n"
            f"RUN python3 -c \"import urllib.request as u; open('/fetched.txt', 'w').write("
            f"u.urlopen('https://{host}:8443/pkg.txt', timeout=30).read().decode())\"\n"
        )
        project.extra = base
        project.write_project()
        refused = builds(dockerfile)
        assert refused.returncode != 0
        assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr, refused.stderr

        project.extra = base + "  ca: [test-ca.pem]\n"
        project.write_project()
        tag = f"orchestrator-test/build-{builds.marker}:ca"
        done = builds(dockerfile, tag=tag)
        assert done.returncode == 0, done.stderr
        fetched = docker("run", "--rm", "--entrypoint", "cat", tag, "/fetched.txt")
        assert fetched.stdout == "package over tls\n", fetched.stderr
        # The image's own trust store and environment are its base's: the bundle with the
        # project's CA was the step's only.
        before, after = _digest_and_env(WORKER_IMAGE), _digest_and_env(tag)
        assert before[0] == after[0]
        assert not [line for line in after if "CA_BUNDLE" in line or "SSL_CERT" in line]
        in_image = docker("run", "--rm", "--entrypoint", "cat", tag, BUNDLE).stdout.encode()
        assert ca.strip() not in in_image
    finally:
        docker("rm", "-f", server)
        attached = docker("network", "inspect", service_net, "--format",
                          "{{range .Containers}}{{.Name}} {{end}}").stdout.split()  # fmt: skip
        for name in attached:
            docker("network", "disconnect", "-f", service_net, name)
        removed = docker("network", "rm", service_net)
        assert removed.returncode == 0, removed.stderr


def test_a_build_ca_file_that_is_not_a_certificate_is_refused_in_one_line(
    builds,  # noqa: F811 (the fixture)
    project,
):
    (project.root / "not-a-ca.pem").write_text("-----BEGIN PRIVATE KEY-----\nx\n")
    project.extra = "build:\n  allow: ['example.test:443']\n  ca: [not-a-ca.pem]\n"
    project.write_project()
    done = builds("FROM @BASE@\nLABEL test.mark=@MARK@\nRUN true\n")
    assert done.returncode == 125
    [line] = done.stderr.strip().splitlines()
    assert "build.ca:" in line and "not-a-ca.pem is not a PEM certificate" in line, line
