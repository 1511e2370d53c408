"""A run's own certificate authority, made on the host for one run's credential proxy.

The credential proxy terminates TLS for the hosts an egress credential is bound to, with
certificates it issues from this CA. The CA is new for every run, valid for a short time
(the run's timeout and a margin), limited to issuing server certificates for the bound
host names (a name constraint: those names, and no IP address unless one is a bound host
itself), and its key exists only in this process's memory and in the proxy's in-memory,
read-only state folder. The worker gets the certificate only.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NoReturn

__all__ = ["RunCA", "make_run_ca"]

#: Beyond the run's own timeout, how long the certificate stays valid.
MARGIN = timedelta(hours=1)


@dataclass(frozen=True)
class RunCA:
    """A run's CA: the certificate (public) and its key (PEM, shown nowhere)."""

    certificate: bytes
    key: bytes = field(repr=False)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a run's CA is never pickled: its key stays in this process")


def make_run_ca(run_id: str, hosts: Sequence[str], *, lifetime_s: float) -> RunCA:
    """A fresh CA for run ``run_id`` that may only issue certificates for ``hosts`` (names)."""
    # Imported here: only a run with egress credentials needs them, and they cost a plain
    # command's start-up tens of milliseconds (docs/performance.md).
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "orchestrator credential proxy"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"orchestrator run {run_id[:40]} CA"),
        ]
    )
    now = datetime.now(UTC)
    permitted: list[x509.GeneralName] = []
    addresses: set[int] = set()
    for host in sorted(set(hosts)):
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            permitted.append(x509.DNSName(host))
            continue
        permitted.append(x509.IPAddress(ipaddress.ip_network(address)))
        addresses.add(address.version)
    excluded: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_network(network))
        for version, network in ((4, "0.0.0.0/0"), (6, "::/0"))
        if version not in addresses
    ]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(seconds=lifetime_s) + MARGIN)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=excluded or None),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return RunCA(
        certificate=certificate.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
