"""Egress allowlists: parsing and normalising ``network: {allow: [...]}`` entries. Pure.

An allowlisted worker reaches the outside only through an egress proxy (see
``orchestrator.egress`` and docs/network.md); the proxy enforces exactly the normalised
entries built here.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: ``DOMAIN`` alone means these ports.
DEFAULT_PORTS = (80, 443)
_KEY_LENGTH = 16
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, order=True)
class AllowEntry:
    """One admitted destination: a host pattern and exactly one port.

    ``host`` is a lower-case fully qualified name (``api.example.org``), a wildcard
    (``*.example.org``: any name ending in ``.example.org``, not ``example.org`` itself) or
    a dotted IPv4 address (matched only when a request names that address literally).
    """

    host: str
    port: int

    @property
    def wildcard(self) -> bool:
        """True for ``*.DOMAIN`` patterns."""
        return self.host.startswith("*.")

    @property
    def is_ip(self) -> bool:
        """True when the host is an IPv4 address."""
        return not self.wildcard and self.host.rsplit(".", 1)[-1].isdigit()

    def matches(self, host: str, port: int) -> bool:
        """Whether a request for ``host:port`` is admitted, as the proxy decides it."""
        if port != self.port:
            return False
        name = host.lower()
        if self.wildcard:
            return name.endswith(self.host[1:]) and len(name) > len(self.host) - 1
        return name == self.host

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def validate_allowlist(entries: Sequence[str]) -> tuple[AllowEntry, ...]:
    """Check and normalise an allowlist; return its entries sorted and without duplicates.

    Each entry is ``DOMAIN`` (ports 80 and 443), ``DOMAIN:PORT`` (that port only),
    ``*.DOMAIN[:PORT]`` (subdomains of DOMAIN, not DOMAIN itself) or an IPv4 address
    ``A.B.C.D[:PORT]``. Names are case-insensitive and must have at least two labels.
    Raises :class:`ValueError` listing every invalid entry, one per line, with the fix.
    """
    if isinstance(entries, str):
        raise ValueError("the allowlist must be a list of entries, not one string")
    found: set[AllowEntry] = set()
    problems: list[str] = []
    for index, entry in enumerate(entries):
        try:
            found.update(_parse_entry(entry))
        except ValueError as exc:
            problems.append(f"allow[{index}] {entry!r}: {exc}")
    if problems:
        raise ValueError("\n".join(problems))
    if not found:
        raise ValueError(
            "the allowlist is empty: it would allow nothing; use `network: none` instead"
        )
    return tuple(sorted(found))


def _parse_entry(entry: object) -> list[AllowEntry]:
    if not isinstance(entry, str):
        raise ValueError("must be a string: DOMAIN, DOMAIN:PORT or *.DOMAIN")
    text = entry.strip()
    if not text:
        raise ValueError("is empty; write a domain such as api.example.org")
    if "://" in text or any(c in text for c in "/?#@"):
        if re.fullmatch(r"[\d.]+/\d+", text):
            raise ValueError("IP ranges are not supported; list single IPv4 addresses")
        raise ValueError(
            "write only the host and an optional port (api.example.org:443), "
            "without scheme, user, path or query"
        )
    if any(c.isspace() for c in text):
        raise ValueError("contains white space; write one host per entry")
    if text.startswith("[") or text.count(":") > 1:
        raise ValueError("IPv6 addresses are not supported; the egress network is IPv4 only")
    host, colon, port_text = text.partition(":")
    if colon:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
        ports: tuple[int, ...] = (int(port_text),)
    else:
        ports = DEFAULT_PORTS
    host = _check_host(host)
    return [AllowEntry(host, port) for port in ports]


def _check_host(raw: str) -> str:
    if not raw.isascii():
        try:
            hint = f" ({raw.encode('idna').decode()})"
        except UnicodeError:
            hint = ""
        raise ValueError(f"write an internationalised name in its xn-- form{hint}")
    host = raw.lower()
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]
    if host == "*":
        raise ValueError("'*' alone would allow everything; use `network: full` for that")
    wildcard = host.startswith("*.")
    domain = host[2:] if wildcard else host
    if "*" in domain:
        raise ValueError("'*' may only stand as the whole first label, as in *.example.org")
    labels_ = domain.split(".")
    if labels_[-1].isdigit() or re.fullmatch(r"[\d.\-]+", domain):
        if wildcard:
            raise ValueError("a wildcard needs a domain name, not an IP address")
        if "-" in domain:
            raise ValueError("IP ranges are not supported; list single IPv4 addresses")
        return _check_ip(domain)
    if wildcard and len(labels_) < 2:
        raise ValueError("a wildcard must cover a domain below a top-level domain (*.example.org)")
    if len(labels_) < 2:
        raise ValueError(
            "must be a fully qualified domain name with at least two labels "
            "(single-label names would reach container names on the proxy's networks)"
        )
    bad = [label for label in labels_ if not _LABEL.match(label)]
    if bad:
        raise ValueError(
            f"{bad[0]!r} is not a valid DNS label (letters, digits and inner hyphens, "
            "at most 63 characters)"
        )
    if len(domain) > 253:
        raise ValueError("the name is longer than 253 characters")
    return host


def _check_ip(text: str) -> str:
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        raise ValueError(
            "is neither a domain name nor a dotted IPv4 address such as 192.0.2.10"
        ) from None
    if address.is_loopback or address.is_link_local or address.is_unspecified:
        raise ValueError("loopback, link-local and unspecified addresses are never reachable")
    if address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError("multicast and broadcast addresses cannot be proxied")
    return str(address)


def bound_host(entry: object) -> AllowEntry:
    """One host an egress credential is bound to: an exact name, HTTPS, port 443 unless
    written ``host:port``. Wildcards and IP literals are refused (a credential goes to a
    name whose certificate the proxy verifies). Raises ValueError naming the fix."""
    if not isinstance(entry, str):
        raise ValueError("must be a host name such as api.example.org")
    text = entry.strip()
    if "*" in text:
        raise ValueError(
            f"{text!r}: wildcards are refused for a credential; list each exact host name"
        )
    try:
        (found,) = _parse_entry(text if ":" in text else f"{text}:443")
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    if found.is_ip:
        raise ValueError(
            f"{text!r}: IP literals are refused for a credential; name the host "
            "(its certificate is checked against that name)"
        )
    return found


def allowlist_key(allow: Iterable[AllowEntry]) -> str:
    """The short hash naming the proxy and network of a normalised allowlist."""
    text = "\n".join(str(entry) for entry in sorted(set(allow)))
    return hashlib.sha256(text.encode()).hexdigest()[:_KEY_LENGTH]
