"""A stand-in for an OpenAI-compatible chat-completions API, for trying the example
offline (README.md, "Run it offline"). Standard library only; run in a container on a
local network: HTTPS on 8443 with /srv/cert.pem and /srv/key.pem. It accepts only
``Authorization: Bearer <the key in /srv/real>`` and answers each request with
``summary: `` and the first words of the last message; it prints one line per request
(never the key)."""

from __future__ import annotations

import json
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REAL = open("/srv/real").read().strip()  # noqa: SIM115 - read once at start


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b"{}"
        key_ok = self.headers.get("authorization") == f"Bearer {REAL}"
        print(self.command, self.path, "key ok" if key_ok else "WRONG KEY", flush=True)
        if not key_ok:
            self._send(401, {"error": {"message": "invalid API key"}})
            return
        if self.path.split("?")[0] != "/v1/chat/completions":
            self._send(404, {"error": {"message": "not found"}})
            return
        messages = json.loads(body).get("messages") or [{}]
        words = " ".join(str(messages[-1].get("content", "")).split()[:8])
        self._send(
            200,
            {
                "id": "chatcmpl-offline",
                "object": "chat.completion",
                "model": "offline",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": f"summary: {words}"},
                    }
                ],
            },
        )


server = ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/srv/cert.pem", "/srv/key.pem")
server.socket = context.wrap_socket(server.socket, server_side=True)
print("listening on 8443", flush=True)
server.serve_forever()
