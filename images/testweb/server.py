"""HTTP on 80 and 8080, HTTPS on 443, UDP echo on 9999; answers name the server.

Each HTTP answer names the server, the port and the Host header it was asked for.

Binding ports below 1024 as a non-root user needs the container's
net.ipv4.ip_unprivileged_port_start sysctl set to 0.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = os.environ.get("TESTWEB_NAME", "testweb")
HERE = os.path.dirname(os.path.abspath(__file__))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        port = self.server.server_address[1]
        body = f"testweb {NAME} port {port} host {self.headers.get('Host', '')}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        print(f"{NAME}: {self.address_string()} {format % args}", flush=True)


def serve(port: int, tls: bool) -> None:
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)  # noqa: S104
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(os.path.join(HERE, "cert.pem"), os.path.join(HERE, "key.pem"))
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    server.serve_forever()


def echo(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", port))  # noqa: S104
        while True:
            data, peer = sock.recvfrom(2048)
            sock.sendto(f"{NAME}:".encode() + data, peer)


if __name__ == "__main__":
    for port, tls in ((80, False), (8080, False), (443, True)):
        threading.Thread(target=serve, args=(port, tls), daemon=True).start()
    threading.Thread(target=echo, args=(9999,), daemon=True).start()
    print(f"testweb {NAME} listening on 80, 8080, 443 (TLS) and 9999/udp", flush=True)
    threading.Event().wait()
