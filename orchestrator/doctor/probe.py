"""The egress self-test's probe: runs *inside* a worker as ``python3 -c SOURCE JOBS``.

Standard library only (the worker image has python3, not the orchestrator). ``JOBS`` is a
JSON list of ``[kind, key, *args]``; every job runs at once in its own thread, and the last
line on stdout is one JSON object ``{key: result}``. Each result is a list whose first word
says what happened (``ok``, ``http-error``, ``failed``, ``connected``, ``answered``, ...).

Every target is a local container or the host; the one outside name (``example.org``) is
only resolved, and resolving it must fail.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

results: dict[str, list[Any]] = {}


def interfaces(key: str) -> None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:  # no netlink answer: what sysfs lists
        names = os.listdir("/sys/class/net")
    results[key] = ["ok", sorted(names)]


def routes(key: str) -> None:
    """Every route not on loopback, IPv4 and IPv6: a ``none`` worker must have none."""
    found = []
    for path, iface_field in (("/proc/net/route", 0), ("/proc/net/ipv6_route", 9)):
        try:
            with open(path) as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        rows = lines[1:] if path.endswith("/route") else lines
        for line in rows:
            fields = line.split()
            if len(fields) > iface_field and fields[iface_field] != "lo":
                found.append(" ".join(fields[:3]))
    results[key] = ["ok", found]


def connect(key: str, host: str, port: int) -> None:
    results[key] = _connect(host, port, 3.0)


def fetch(key: str, url: str) -> None:
    """An HTTP GET through whatever proxy the environment names (HTTP_PROXY)."""
    try:
        with urllib.request.urlopen(url, timeout=15) as answer:  # noqa: S310
            results[key] = ["ok", answer.status, answer.read(200).decode(errors="replace")]
    except urllib.error.HTTPError as exc:
        results[key] = ["http-error", exc.code, ""]
    except OSError as exc:
        results[key] = ["failed", 0, str(getattr(exc, "reason", exc))]


def resolve(key: str, name: str) -> None:
    try:
        results[key] = ["resolved", socket.getaddrinfo(name, 443)[0][4][0]]
    except OSError as exc:
        results[key] = ["failed", _why(exc)]


def udp(key: str, host: str, port: int) -> None:
    """One datagram to ``host:port``: an echo server there answers, if it can be reached."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.sendto(b"doctor", (host, port))
            results[key] = ["answered", sock.recvfrom(512)[0].decode(errors="replace")]
        except OSError as exc:
            results[key] = ["failed", _why(exc)]


def host_services(key: str, port: int) -> None:
    """Connect to ``port`` on the host, as this worker's network sees it: the default
    gateway and the first address of every attached subnet (Docker's bridge gateway)."""
    candidates: list[str] = []
    try:
        with open("/proc/net/route") as handle:
            rows = [line.split() for line in handle.read().splitlines()[1:]]
    except OSError:
        rows = []
    for fields in rows:
        if len(fields) < 8 or fields[0] == "lo":
            continue
        destination, gateway, mask = (_address(fields[i]) for i in (1, 2, 7))
        subnet = 0 < bin(mask).count("1") < 31  # not a host route (gVisor lists its own)
        for address in (gateway, (destination & mask) + 1 if subnet else 0):
            text = socket.inet_ntoa(struct.pack("!L", address))
            if address and text not in candidates:
                candidates.append(text)
    results[key] = ["ok", {address: _connect(address, port, 3.0) for address in candidates}]


def _why(exc: OSError) -> str:
    """``ENETUNREACH``, ``TimeoutError``, ``gaierror: Name or service not known``."""
    if isinstance(exc, socket.gaierror):
        return f"gaierror: {exc.strerror}"
    return errno.errorcode.get(exc.errno or 0) or type(exc).__name__


def _address(field: str) -> int:
    """An address from /proc/net/route (hex of the address's bytes in host order) as an
    integer in network order."""
    return int(struct.unpack("!L", struct.pack("=L", int(field, 16)))[0])


def _connect(host: str, port: int, timeout: float) -> list[Any]:
    sock = socket.socket()
    sock.settimeout(timeout)
    try:
        sock.connect((host, port))
        return ["connected"]
    except OSError as exc:
        return ["failed", _why(exc)]
    finally:
        sock.close()


JOBS: dict[str, Callable[..., None]] = {
    "interfaces": interfaces,
    "routes": routes,
    "connect": connect,
    "fetch": fetch,
    "resolve": resolve,
    "udp": udp,
    "host_services": host_services,
}


def _guarded(kind: str, key: str, *args: Any) -> None:
    """Run one job; whatever it raises is its result (a probe never dies half-way)."""
    try:
        JOBS[kind](key, *args)
    except Exception as exc:  # noqa: BLE001 -- reported, not hidden
        results[key] = ["error", f"{type(exc).__name__}: {exc}"]


def main(jobs: list[list[Any]]) -> None:
    """All jobs at once, each in a thread; one after another where no thread can start
    (a runtime that refuses them must not hide what the network allows)."""
    threads = [threading.Thread(target=_guarded, args=job) for job in jobs]
    started = []
    try:
        for thread in threads:
            thread.start()
            started.append(thread)
    except RuntimeError:  # "can't start new thread"
        for job in jobs[len(started) :]:
            _guarded(*job)
    for thread in started:
        thread.join()
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
