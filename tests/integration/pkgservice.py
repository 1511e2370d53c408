"""A local package server for build tests: an apt repository, files and redirects.

The server runs from the worker image (python3 and ``dpkg-deb``) as ``nobody``, on a
network of the test's own which the test's project declares as a local service network,
answering as ``pkgs`` and ``other``. At start it makes a tiny Debian package, ``tinytool``
(``/usr/bin/tinytool`` prints :data:`TOOL_SAYS`), and a flat apt repository holding it
(``/repo/``: ``Packages``, ``Release``, the ``.deb``). It also serves :data:`FILE_TEXT` at
``/file.txt``, a gzip tar at ``/archive.tar.gz``, 64 MiB of zeros at ``/big``, and redirects: ``/moved-here`` to
``/file.txt``, ``/moved`` to the same file as ``other.NET`` (a name not on a test's
allowlist). Nothing leaves the machine.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator import labels
from orchestrator.docker.images import WORKER_IMAGE

PORT = 8000
FILE_TEXT = "fetched from the package server\n"
FILE_DIGEST = hashlib.sha256(FILE_TEXT.encode()).hexdigest()
TOOL_SAYS = "tinytool 1.0 works"

SCRIPT = (
    r"""
import hashlib, io, os, posixpath, subprocess, sys, tarfile
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NET = sys.argv[1]
root = "/tmp/pkg"
os.makedirs(root + "/DEBIAN")
os.makedirs(root + "/usr/bin")
with open(root + "/DEBIAN/control", "w") as out:
    out.write("Package: tinytool\nVersion: 1.0\nArchitecture: all\nMaintainer: tests <t@t.test>\n"
              "Description: a tool for the build tests\n")
with open(root + "/usr/bin/tinytool", "w") as out:
    out.write("#!/bin/sh\necho 'TOOL_SAYS'\n")
os.chmod(root + "/usr/bin/tinytool", 0o755)
os.makedirs("/tmp/repo")
deb = "/tmp/repo/tinytool_1.0_all.deb"
subprocess.run(["dpkg-deb", "--root-owner-group", "--build", root, deb], check=True,
               stdout=subprocess.DEVNULL)
data = open(deb, "rb").read()
packages = (open(root + "/DEBIAN/control").read() + "Filename: ./tinytool_1.0_all.deb\n"
            "Size: %d\nSHA256: %s\n\n" % (len(data), hashlib.sha256(data).hexdigest())).encode()
release = ("Origin: tests\nLabel: tests\nDate: %s\nSHA256:\n %s %d Packages\n"
           % (formatdate(usegmt=True), hashlib.sha256(packages).hexdigest(), len(packages))).encode()
archive = io.BytesIO()
with tarfile.open(fileobj=archive, mode="w:gz") as tar:
    member = tarfile.TarInfo("inside.txt")
    member.size = 7
    tar.addfile(member, io.BytesIO(b"inside\n"))
FILES = {"/repo/Packages": packages, "/repo/Release": release, "/repo/tinytool_1.0_all.deb": data,
         "/file.txt": b"FILE_TEXT", "/archive.tar.gz": archive.getvalue()}
BIG = 64 << 20
MOVED = {"/moved-here": "/file.txt", "/moved": "http://other.%s:PORT/file.txt" % NET}

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        path = self.path.split("?")[0]
        if path.startswith("http://"):  # a proxy's absolute form
            path = "/" + path.split("/", 3)[3]
        path = posixpath.normpath(path)  # apt asks for /repo/./Packages
        if path in MOVED:
            self.send_response(302)
            self.send_header("Location", MOVED[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path == "/big":  # BIG bytes of zeros
            self.send_response(200)
            self.send_header("Content-Length", str(BIG))
            self.end_headers()
            try:
                for _ in range(BIG >> 20):
                    self.wfile.write(bytes(1 << 20))
            except OSError:
                pass
            return
        body = FILES.get(path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Last-Modified", "Wed, 21 Oct 2015 07:28:00 GMT")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
print("listening", flush=True)
server.serve_forever()
""".replace("TOOL_SAYS", TOOL_SAYS)
    .replace("FILE_TEXT", FILE_TEXT.replace("\n", "\\n"))
    .replace("PORT", str(PORT))
)


@contextmanager
def package_service(engine, role: str) -> Iterator[str]:
    """The package server on a network of its own; the network's name. Removed after,
    with the egress proxy a build joined to it for ``pkgs.NET:8000``."""
    from orchestrator.docker import egress as eg
    from orchestrator.docker import egress_gc as eg_gc
    from orchestrator.docker.networks import release_network

    net = f"pkg-{role}-{uuid.uuid4().hex[:8]}"
    engine.api.create_network(net, driver="bridge")
    server = None
    try:
        server = engine.api.create_container(
            image=WORKER_IMAGE,
            name=f"orchestrator-test-{role}pkgs-{os.getpid()}-{net[-8:]}",
            command=["python3", "-c", SCRIPT, net],
            user="65534:65534",
            labels=engine.labels_for({f"{labels.PREFIX}.test": role}),
            host_config=engine.api.create_host_config(
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                network_mode=net,
                mem_limit=128 << 20,
                pids_limit=64,
            ),
            networking_config={"EndpointsConfig": {net: {"Aliases": ["pkgs", "other"]}}},
        )["Id"]
        engine.start(server)
        deadline = time.monotonic() + 60
        while b"listening" not in engine.api.logs(server):
            assert time.monotonic() < deadline, engine.api.logs(server).decode()
            time.sleep(0.1)
        yield net
    finally:
        if server is not None:
            engine.remove(server)
        try:
            allow = eg.validate_allowlist([f"pkgs.{net}:{PORT}"])
            eg_gc.remove_egress(engine, eg.egress_key(allow, [net]))
        finally:
            release_network(engine, net)  # what is still leaving it disconnected first


def project_text(net: str) -> str:
    """A project's lines letting builds fetch from the package server."""
    return f"network:\n  services:\n    - network: {net}\nbuild:\n  allow: ['pkgs.{net}:{PORT}']\n"
