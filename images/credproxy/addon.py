"""mitmproxy addon: write egress credentials into requests to their bound hosts only.

Loaded by ``mitmdump -s`` in upstream mode (every connection leaves through the run's
allowlist proxy). It reads ``$CREDPROXY_STATE/config.json`` and the value files it names
(each read once, here, never logged). For every connection and request:

* TLS is terminated only when the CONNECT target is a bound ``host:port`` and the client's
  SNI names that same host; every other connection is tunnelled untouched.
* A request on such a connection whose ``Host`` (or ``:authority``) names another host is
  refused (403). Otherwise each credential bound to the host has its placeholder replaced
  by the value in its one header (in its whole ``format``, when one is set).
* A placeholder anywhere else (another header, the URL, the body, a CONNECT request, a
  plain-HTTP request, a WebSocket message), spelled as itself, percent-, JSON- or
  base64-encoded, blocks the request (403) or the WebSocket.
* Responses from bound hosts are scrubbed of the values (headers and body, streamed ones
  chunk by chunk); compressed ones are decoded, scrubbed and re-encoded.

Each substitution and block is one line on stdout: ``CREDPROXY {json}`` with event,
credential, host, port, method, path (no query), status and reason: never a value.
Any error in a hook blocks what it was deciding on (fail closed).
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from forms import Scrubber, contains  # noqa: E402
from mitmproxy import http, tls  # noqa: E402

STATE = Path(os.environ.get("CREDPROXY_STATE", "/run/credproxy"))
EVENT_MARK = "CREDPROXY"
READY_MARK = "CREDPROXY-READY"
BLOCKED_BODY = b"blocked by the credential proxy (see the run's audit log)\n"


class Credential:
    def __init__(self, entry: dict[str, Any], value: str) -> None:
        self.name: str = entry["name"]
        self.hosts: set[tuple[str, int]] = set()
        for host in entry["hosts"]:
            name, _, port = host.rpartition(":")
            self.hosts.add((name.lower(), int(port)))
        self.header: str = entry["header"].lower()
        self.format: str | None = entry.get("format")
        self.placeholder: str = entry["placeholder"]
        self.value = value

    def bound_form(self) -> str | None:
        """The header's exact expected text from the worker (with ``format``)."""
        return None if self.format is None else self.format.replace("{value}", self.placeholder)

    def written(self, text: str) -> str:
        if self.format is not None:
            return self.format.replace("{value}", self.value)
        return text.replace(self.placeholder, self.value)


def _load() -> list[Credential]:
    config = json.loads((STATE / "config.json").read_text())
    found = []
    for entry in config["credentials"]:
        value = (STATE / entry["value_file"]).read_text()
        if not value or "\n" in value or "\r" in value:
            raise SystemExit(f"credential {entry['name']}: its value is not one line")
        found.append(Credential(entry, value))
    return found


def _event(
    kind: str,
    flow: http.HTTPFlow | None,
    credential: str,
    status: int,
    reason: str,
    host: str = "",
    port: int = 0,
    method: str = "",
) -> None:
    if flow is not None:
        host = host or flow.request.host
        port = port or flow.request.port
        method = method or flow.request.method
        path = flow.request.path.split("?", 1)[0]
    else:
        path = ""
    line = {
        "event": kind,
        "credential": credential,
        "host": host.lower(),
        "port": port,
        "method": method or "-",
        "path": path[:512],
        "status": status,
        "reason": reason,
    }
    print(f"{EVENT_MARK} {json.dumps(line, sort_keys=True)}", flush=True)


def _guarded(hook: Callable[..., None]) -> Callable[..., None]:
    """Any error while deciding blocks: the flow gets a 403 (or is killed)."""

    @wraps(hook)
    def run(self: CredentialProxy, subject: Any) -> None:
        try:
            hook(self, subject)
        except Exception as exc:  # noqa: BLE001 - fail closed, whatever went wrong
            reason = f"internal error ({type(exc).__name__}); blocked"
            if isinstance(subject, http.HTTPFlow):
                _event("blocked", subject, "-", 403, reason)
                if subject.response is None or hook.__name__ in ("request", "http_connect"):
                    subject.response = http.Response.make(403, BLOCKED_BODY)
                else:
                    subject.kill()
            elif isinstance(subject, tls.ClientHelloData):
                subject.ignore_connection = False  # intercepted, then refused per request
                print(f"{EVENT_MARK}-ERROR {reason}", flush=True)

    return run


def _host_of(authority: str, default_port: int) -> tuple[str, int]:
    authority = authority.strip().lower()
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = authority.partition(":")
    return host.rstrip("."), int(port) if port.isdigit() else default_port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class CredentialProxy:
    def __init__(self) -> None:
        self.credentials = _load()
        self.bound: dict[tuple[str, int], list[Credential]] = {}
        for credential in self.credentials:
            for target in credential.hosts:
                self.bound.setdefault(target, []).append(credential)

    def running(self) -> None:
        print(READY_MARK, flush=True)

    # -- connections ----------------------------------------------------------------------

    def _placeholder_in(self, data: bytes) -> Credential | None:
        return next((c for c in self.credentials if contains(data, c.placeholder)), None)

    @_guarded
    def http_connect(self, flow: http.HTTPFlow) -> None:
        """The CONNECT itself: no placeholder in it, and a named target."""
        head = b"\n".join(k + b":" + v for k, v in flow.request.headers.fields)
        found = self._placeholder_in(head + b"\n" + flow.request.host.encode())
        if found is not None:
            self._block(flow, found.name, "placeholder in the CONNECT request")
        elif _is_ip(flow.request.host):
            self._block(flow, "-", "IP-literal CONNECT target; name the host")

    @_guarded
    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        """Terminate TLS only toward a bound host whose name the SNI repeats."""
        address = data.context.server.address
        target = (str(address[0]).lower().rstrip("."), int(address[1])) if address else None
        if target is None or target not in self.bound:
            data.ignore_connection = True  # tunnelled untouched, through the allowlist proxy
            return
        sni = (data.client_hello.sni or "").lower().rstrip(".")
        if sni != target[0]:
            # Intercepted anyway: the run CA's name constraints make the client refuse
            # our certificate, and a client that ignores that gets a 403 per request.
            names = ",".join(c.name for c in self.bound[target])
            _event(
                "blocked",
                None,
                names,
                0,
                f"TLS SNI '{sni[:80]}' does not name the CONNECT target",
                host=target[0],
                port=target[1],
                method="CONNECT",
            )

    # -- requests -------------------------------------------------------------------------

    def _block(self, flow: http.HTTPFlow, credential: str, reason: str) -> None:
        _event("blocked", flow, credential, 403, reason)
        flow.response = http.Response.make(403, BLOCKED_BODY, {"content-type": "text/plain"})

    def _target(self, flow: http.HTTPFlow) -> tuple[str, int]:
        return flow.request.host.lower().rstrip("."), int(flow.request.port)

    @_guarded
    def request(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        target = self._target(flow)
        intercepted = request.scheme == "https" and flow.client_conn.tls_established
        bound = self.bound.get(target, []) if intercepted else []
        if intercepted and bound:
            if len(request.headers.get_all("host")) > 1:
                self._block(flow, ",".join(c.name for c in bound), "Host given twice")
                return
            sni = (flow.client_conn.sni or "").lower().rstrip(".")
            host = _host_of(request.host_header or "", target[1])
            server = flow.server_conn.address
            dialled = (str(server[0]).lower().rstrip("."), int(server[1])) if server else target
            if not (sni == target[0] and host == target and dialled == target):
                self._block(
                    flow,
                    ",".join(c.name for c in bound),
                    "target, TLS SNI and Host do not name the same bound host",
                )
                return
        # The bound header of each bound credential: checked, then left out of the search.
        written: dict[str, Credential] = {}
        for credential in bound:
            values = request.headers.get_all(credential.header)
            if not any(credential.placeholder in value for value in values):
                continue
            if len(values) != 1:
                self._block(flow, credential.name, f"header {credential.header} given twice")
                return
            form = credential.bound_form()
            if form is not None and values[0] != form:
                self._block(
                    flow, credential.name, f"header {credential.header} is not in the bound form"
                )
                return
            if form is None and values[0].count(credential.placeholder) != 1:
                self._block(flow, credential.name, f"placeholder twice in {credential.header}")
                return
            written[credential.header] = credential
        rest = [
            name + b":" + value
            for name, value in request.headers.fields
            if name.decode("latin-1").lower() not in written
        ]
        # A placeholder in the bound header must still be the only thing of note there.
        for header, credential in written.items():
            others = [c for c in self.credentials if c is not credential]
            text = request.headers[header].encode("latin-1", "replace")
            if any(contains(text, c.placeholder) for c in others):
                self._block(flow, credential.name, f"another placeholder in {header}")
                return
        places = {
            "a header": b"\n".join(rest),
            "the URL": request.data.path
            + b"\n"
            + (request.data.authority or b"")
            + b"\n"
            + request.host.encode(),
            "the body": (request.raw_content or b"")
            + b"\n"
            + (request.get_content(strict=False) or b""),
            "a trailer": b"\n".join(k + b":" + v for k, v in (request.trailers or {}).fields)
            if request.trailers
            else b"",
        }
        for place, data in places.items():
            found = self._placeholder_in(data)
            if found is not None:
                why = (
                    "plain HTTP"
                    if request.scheme == "http"
                    else "another host"
                    if not bound
                    else place
                )
                self._block(flow, found.name, f"placeholder in {place} ({why})")
                return
        for header, credential in written.items():
            request.headers[header] = credential.written(request.headers[header])
        if bound:
            request.headers["accept-encoding"] = "identity"  # responses are scrubbed
            flow.metadata["credproxy"] = sorted(c.name for c in written.values())
            flow.metadata["credproxy_scrub"] = True

    # -- responses ------------------------------------------------------------------------

    def _scrubber(self) -> Scrubber:
        return Scrubber({c.value: f"credential {c.name}" for c in self.credentials})

    @_guarded
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or not flow.metadata.get("credproxy_scrub"):
            return
        scrub = self._scrubber()
        for index, (name, value) in enumerate(list(response.headers.fields)):
            cleaned = scrub.scrub(value)
            if cleaned != value:
                response.headers.fields = (
                    *response.headers.fields[:index],
                    (name, cleaned),
                    *response.headers.fields[index + 1 :],
                )
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            response.stream = self._scrubber()  # chunk by chunk: streamed answers too
        # else: buffered, decoded and scrubbed whole in response()

    @_guarded
    def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        names = flow.metadata.get("credproxy")
        if flow.metadata.get("credproxy_scrub") and not callable(response.stream):
            content = response.get_content(strict=False) or b""
            response.set_content(self._scrubber().scrub(content))
        if names:
            _event("substituted", flow, ",".join(names), response.status_code, "")

    @_guarded
    def error(self, flow: http.HTTPFlow) -> None:
        names = flow.metadata.get("credproxy")
        if names and flow.response is None:
            _event("substituted", flow, ",".join(names), 0, "no answer from the host")

    # -- WebSocket ------------------------------------------------------------------------

    @_guarded
    def websocket_message(self, flow: http.HTTPFlow) -> None:
        assert flow.websocket is not None
        message = flow.websocket.messages[-1]
        if message.from_client:
            found = self._placeholder_in(message.content)
            if found is not None:
                message.drop()
                _event("blocked", flow, found.name, 0, "placeholder in a WebSocket message")
                flow.kill()
        elif flow.metadata.get("credproxy_scrub"):
            message.content = self._scrubber().scrub(message.content)


addons = [CredentialProxy()]
