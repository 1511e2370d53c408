"""The credential proxy tests' local internet: a fake OpenAI-compatible API and a recorder.

``SERVER`` runs in a test container (python3 of the client image, with ``h2``) as
``python3 -c SERVER ROLE``, HTTPS on 8443 with /srv/cert.pem and /srv/key.pem and plain
HTTP on 8080 (HTTP/2 too on 8443, when the client offers it). Role ``llm`` is the fake API: it accepts only ``Authorization: Bearer
<the real key>`` (read from /srv/real) and also offers an echo, a streamed (SSE) echo and
redirects; it prints every request it receives (``BOUND`` and a JSON object: the raw
request line and the header lines) on stdout, where the test checks that the real key
only ever arrived in origin form with the bound Host. Its answers that carry the key back
in other shapes: ``/upgrade`` (101 whatever was asked, then the request reflected as raw
bytes), ``/trailers`` (in a trailer), ``/encoded?coding=C`` (under Content-Encoding C) and
``/reflect?form=F`` (upper case, lower-case percent-encoded, JSON with ``\\/``, JSON
``\\u`` escapes). Role ``other`` answers 200 to everything and prints every request it
receives (request line, headers, body) on stdout, where the test looks for the real key.
"""

from __future__ import annotations

SERVER = r"""
import base64, gzip, hashlib, json, ssl, struct, sys, threading, time, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLE = sys.argv[1]
REAL = open("/srv/real").read().strip() if ROLE == "llm" else None
OTHER = sys.argv[2] if len(sys.argv) > 2 else ""


def ws_send(stream, text):
    data = text.encode()
    head = bytes([0x81, len(data)]) if len(data) < 126 else bytes([0x81, 126]) + struct.pack("!H", len(data))
    stream.write(head + data)
    stream.flush()


def ws_read(stream):
    head = stream.read(2)
    if len(head) < 2 or head[0] & 0x0F == 8:
        return None
    length = head[1] & 0x7F
    if length == 126:
        length = struct.unpack("!H", stream.read(2))[0]
    elif length == 127:
        length = struct.unpack("!Q", stream.read(8))[0]
    mask = stream.read(4) if head[1] & 0x80 else b"\0\0\0\0"
    data = stream.read(length)
    return bytes(b ^ mask[i % 4] for i, b in enumerate(data)).decode(errors="replace")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _body(self):
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status, body, kind="application/json", extra=()):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        body = self._body()
        if ROLE == "other":
            print("RECEIVED", repr(self.requestline), repr(str(self.headers)), repr(body), flush=True)
            return self._send(200, {"other": True})
        print("BOUND " + json.dumps({"line": self.requestline, "headers": self.headers.items()}),
              flush=True)
        auth = self.headers.get("authorization", "")
        path = self.path.split("?")[0]
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        if path == "/upgrade":  # switches whatever was asked, then reflects the request
            self.send_response(101)
            self.send_header("upgrade", self.headers.get("upgrade") or "x")
            self.send_header("connection", "Upgrade")
            self.end_headers()
            self.wfile.write((self.requestline + "\r\n" + str(self.headers)).encode())
            self.wfile.flush()
            self.close_connection = True
            return
        if path == "/trailers":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.send_header("trailer", "x-echo")
            self.end_headers()
            self.wfile.write(b"5\r\nhello\r\n0\r\nx-echo: " + auth.encode() + b"\r\n\r\n")
            return
        if path == "/encoded":
            coding = query.get("coding", "")
            data = auth.encode()
            for _ in range(coding.count("gzip")):
                data = gzip.compress(data)
            return self._send(200, data, "text/plain", [("content-encoding", coding)])
        if path == "/reflect":
            form = query.get("form")
            shown = {
                "upper": auth.upper(),
                "percent-lower": "".join("%%%02x" % ord(c) for c in auth),
                "json-slash": json.dumps(auth).replace("/", "\\/"),
                "json-u": "".join("\\u%04x" % ord(c) for c in auth),
            }[form]
            return self._send(200, shown.encode(), "text/plain")
        if path == "/echo":
            return self._send(200, {"headers": dict(self.headers), "body": body.decode(errors="replace")})
        if path == "/sse":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for index in range(4):
                # the key split over two writes: the scrubber must join them
                half = len(auth) // 2
                self.wfile.write(("data: " + str(index) + " " + auth[:half]).encode())
                self.wfile.flush()
                time.sleep(0.05)
                self.wfile.write((auth[half:] + "\n\n").encode())
                self.wfile.flush()
            self.close_connection = True
            return
        if path == "/ws":  # a WebSocket: first the Authorization header back, then echoes
            accept = base64.b64encode(hashlib.sha1(
                (self.headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()
            ).digest()).decode()
            self.send_response(101)
            self.send_header("upgrade", "websocket")
            self.send_header("connection", "Upgrade")
            self.send_header("sec-websocket-accept", accept)
            self.end_headers()
            ws_send(self.wfile, "hello " + auth)
            while (text := ws_read(self.rfile)) is not None:
                print("WS RECEIVED", repr(text), flush=True)
                ws_send(self.wfile, "echo:" + text)
            self.close_connection = True
            return
        if path == "/redirect":
            target = OTHER + "/landing"
            return self._send(302, b"", "text/plain", [("location", target)])
        if auth != "Bearer " + REAL:
            return self._send(401, {"error": {"message": "invalid api key"}})
        if path == "/v1/chat/completions":
            request = json.loads(body or b"{}")
            text = request.get("messages", [{}])[-1].get("content", "")
            answer = "summary: " + text[:40]
            return self._send(200, {
                "id": "chatcmpl-test", "object": "chat.completion", "model": "fake",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })
        return self._send(200, {"ok": True, "path": path})

    do_GET = do_POST = do_PUT = _handle

    def handle(self):
        if ROLE == "llm" and getattr(self.request, "selected_alpn_protocol", lambda: None)() == "h2":
            return self._handle_h2()
        return super().handle()

    def _handle_h2(self):
        # HTTP/2 (offered when the client offers it): each request recorded as it arrived
        # (its header fields, pseudo-headers first), answered 200 for the real key, else 401
        import h2.config, h2.connection, h2.events
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8",
                                           validate_inbound_headers=False)
        connection = h2.connection.H2Connection(config=config)
        connection.initiate_connection()
        self.request.sendall(connection.data_to_send())
        while data := self.request.recv(65536):
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    fields = dict(event.headers)
                    line = fields.get(":method", "") + " " + fields.get(":path", "") + " HTTP/2"
                    print("BOUND " + json.dumps({"line": line, "headers": event.headers}), flush=True)
                    good = fields.get("authorization") == "Bearer " + REAL
                    body = json.dumps({"ok": good, "path": fields.get(":path")}).encode()
                    connection.send_headers(event.stream_id, [
                        (":status", "200" if good else "401"), ("content-type", "application/json"),
                        ("content-length", str(len(body)))])
                    connection.send_data(event.stream_id, body, end_stream=True)
            self.request.sendall(connection.data_to_send())


def serve(server):
    server.serve_forever()


plain = ThreadingHTTPServer(("0.0.0.0", 8080), Handler)
secure = ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/srv/cert.pem", "/srv/key.pem")
context.set_alpn_protocols(["h2", "http/1.1"])
secure.socket = context.wrap_socket(secure.socket, server_side=True)
for server in (plain, secure):
    threading.Thread(target=serve, args=(server,), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""
