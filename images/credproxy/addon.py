"""mitmproxy addon: write egress credentials into requests to their bound hosts only.

Loaded by ``mitmdump -s`` in upstream mode (every connection leaves through the run's
allowlist proxy). It reads ``$CREDPROXY_STATE/config.json`` and the value files it names
(each read once, here, never logged). For every connection and request:

* TLS is terminated only when the CONNECT target is a bound ``host:port`` and the client's
  SNI names that same host; every other connection is tunnelled untouched.
* A request on such a connection is forwarded only in the form the bound host reads one
  way: its ``Host`` (exactly one; for HTTP/2 ``:authority`` and any ``host`` too) and an
  absolute-form target name the tunnel's host and port, or it is refused (403); an
  absolute-form target is rewritten to origin form. Otherwise each credential bound to the
  host has its placeholder replaced by the value in its one header (in its whole
  ``format``, when one is set).
* A CONNECT to a bound host's name on a port it is not bound to is refused (403).
* Upgrades: only to WebSocket version 13 (its messages inspected both ways); any other
  ``Upgrade`` request is refused (403), any other ``101`` answer ends the connection.
* A folded header line (obs-fold) is refused (403); mitmproxy itself refuses a doubled
  ``Content-Length`` and ``Transfer-Encoding`` with ``Content-Length`` (audited here).
* A placeholder anywhere else (another header, the URL, the body, a CONNECT request, a
  plain-HTTP request, a WebSocket message), spelled as itself, percent-, JSON- or
  base64-encoded, blocks the request (403) or the WebSocket.
* Responses from bound hosts are scrubbed of the values in every spelling the request side
  searches for, case ignored (headers, body, trailers; streamed ones chunk by chunk);
  ones compressed once with a known coding are decoded, scrubbed and re-encoded; an unknown
  or stacked ``Content-Encoding`` is refused (502).

Each substitution and block is one line on stdout: ``CREDPROXY {json}`` with event,
credential, host, port, method, path (no query), status and reason: never a value.
Any error in a hook blocks what it was deciding on (fail closed).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
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
#: Content codings mitmproxy decodes and encodes again: a response in one of them (once) is
#: scrubbed decoded; any other, or two stacked, is refused.
KNOWN_CODINGS = ("gzip", "deflate", "br", "zstd")
MASKED = "a value behind more than one encoding in the answer; masked"


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


_AUTHORITY = re.compile(r"(?:\[([0-9a-f:.]+)\]|([a-z0-9._-]+))(?::([0-9]{1,5}))?")


def _host_of(authority: str, default_port: int = 443) -> tuple[str, int] | None:
    """The host and port an authority (a ``Host`` value, an absolute-form target's) names,
    read strictly: no user part, no spaces or line breaks, a port of digits (443 when
    absent, as HTTPS means); None when it is anything else."""
    found = _AUTHORITY.fullmatch(authority.lower())
    if found is None:
        return None
    host = (found[1] or found[2] or "").rstrip(".")
    return (host, int(found[3]) if found[3] else default_port) if host else None


def _tokens(values: list[str]) -> set[str]:
    return {token.strip().lower() for value in values for token in value.split(",")}


def _websocket_handshake(request: http.Request) -> bool:
    """Whether the request asks to upgrade to WebSocket version 13, and only that."""
    headers = request.headers
    return (
        request.method == "GET"
        and [value.strip().lower() for value in headers.get_all("upgrade")] == ["websocket"]
        and "upgrade" in _tokens(headers.get_all("connection"))
        and [value.strip() for value in headers.get_all("sec-websocket-version")] == ["13"]
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class _Refusals(logging.Handler):
    """mitmproxy's own refusals that end a connection before any flow exists (an HTTP/2
    request whose ``:authority`` and ``host`` differ, or any other HTTP/2 protocol error),
    audited as blocks: only the reason is known there, not the host."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "HTTP/2 protocol error" in message:
            reason = message.split("HTTP/2 protocol error:", 1)[-1].strip()[:120]
            _event("blocked", None, "-", 0, f"HTTP/2 protocol error refused: {reason}")


class CredentialProxy:
    def __init__(self) -> None:
        server_log = logging.getLogger("mitmproxy.proxy.server")
        server_log.setLevel(logging.INFO)  # its refusals are logged at INFO
        server_log.addHandler(_Refusals())
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
        else:
            target = self._target(flow)
            named = [
                c for (host, _), found in self.bound.items() if host == target[0] for c in found
            ]
            if named and target not in self.bound:
                names = ",".join(sorted({c.name for c in named}))
                self._block(flow, names, "CONNECT to a bound host on a port it is not bound to")

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

    def _misdirected(self, flow: http.HTTPFlow, target: tuple[str, int]) -> str | None:
        """Why a request on a connection intercepted for ``target`` could reach another
        host behind it (a front end may route by the Host header or by the request target),
        or None. An absolute-form target naming ``target`` is made origin-form."""
        request = flow.request
        sni = (flow.client_conn.sni or "").lower().rstrip(".")
        server = flow.server_conn.address
        dialled = (str(server[0]).lower().rstrip("."), int(server[1])) if server else target
        if not (sni == target[0] and dialled == target):
            return "target, TLS SNI and connection do not name the same bound host"
        hosts = request.headers.get_all("host")
        if len(hosts) > 1:
            return "Host given twice"
        authority = request.data.authority.decode("latin-1")
        if request.is_http2 or request.is_http3:
            if not authority and not hosts:
                return "no :authority and no Host"
            if authority and hosts and _host_of(authority) != _host_of(hosts[0]):
                return ":authority and Host name different hosts"
        elif not hosts:
            return "no Host header"
        elif authority and _host_of(authority) != target:
            return "absolute-form target names another host than the connection's"
        if any(_host_of(name) != target for name in [authority, *hosts] if name):
            return "Host names another host than the connection's"
        if authority and not (request.is_http2 or request.is_http3):
            request.authority = ""  # origin form: the one target the bound host sees
        return None

    @_guarded
    def request(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        flow.metadata["credproxy_seen"] = True
        target = self._target(flow)
        intercepted = request.scheme == "https" and flow.client_conn.tls_established
        bound = self.bound.get(target, []) if intercepted else []
        names = ",".join(c.name for c in bound) or "-"
        if any(b"\r" in value or b"\n" in value for _, value in request.headers.fields):
            self._block(flow, names, "folded header line (obs-fold)")
            return
        if "upgrade" in request.headers and not _websocket_handshake(request):
            self._block(flow, names, "upgrade to anything but WebSocket version 13")
            return
        if intercepted and bound:
            problem = self._misdirected(flow, target)
            if problem is not None:
                self._block(flow, names, problem)
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

    def _scrub_fields(
        self, fields: tuple[tuple[bytes, bytes], ...]
    ) -> tuple[tuple[bytes, bytes], ...]:
        """Header or trailer lines, each name and value scrubbed on its own."""
        scrub = self._scrubber()
        return tuple((scrub.scrub(name), scrub.scrub(value)) for name, value in fields)

    @_guarded
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        if response.status_code == 101 and not (
            _websocket_handshake(flow.request)
            and response.headers.get("upgrade", "").strip().lower() == "websocket"
        ):
            names = ",".join(flow.metadata.get("credproxy") or []) or "-"
            _event("blocked", flow, names, 101, "switched to a protocol other than WebSocket 13")
            flow.metadata["credproxy_audited"] = True
            flow.kill()  # the connection ends here: nothing after the 101 is relayed
            return
        if not flow.metadata.get("credproxy_scrub"):
            return
        response.headers.fields = self._scrub_fields(response.headers.fields)
        codings = [
            token
            for token in (
                t.strip().lower()
                for v in response.headers.get_all("content-encoding")
                for t in v.split(",")
            )
            if token not in ("", "identity")
        ]
        if not codings:
            response.stream = self._scrubber()  # chunk by chunk: streamed answers too
        elif len(codings) > 1 or codings[0] not in KNOWN_CODINGS:
            # buffered, never relayed: replaced by a refusal in response()
            flow.metadata["credproxy_refuse"] = (
                f"Content-Encoding '{','.join(codings)[:60]}' cannot be scrubbed"
            )
        # else: buffered, decoded and scrubbed whole in response()

    @_guarded
    def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        names = ",".join(flow.metadata.get("credproxy") or [])
        refused = flow.metadata.get("credproxy_refuse")
        if flow.metadata.get("credproxy_scrub") and not refused:
            if response.trailers:
                response.trailers.fields = self._scrub_fields(response.trailers.fields)
            if isinstance(response.stream, Scrubber):
                if response.stream.masked:  # relayed already: what held the value, masked
                    _event("blocked", flow, names or "-", response.status_code, MASKED)
            else:
                scrubber = self._scrubber()
                try:
                    content = response.get_content(strict=True) or b""
                except ValueError:
                    content, refused = b"", "an answer that does not decode as its Content-Encoding"
                response.set_content(scrubber.scrub(content))
                refused = refused or (MASKED if scrubber.masked else None)
        if refused:
            _event("blocked", flow, names or "-", 502, refused)
            flow.response = http.Response.make(502, BLOCKED_BODY, {"content-type": "text/plain"})
            return
        if names:
            _event("substituted", flow, names, response.status_code, "")

    @_guarded
    def error(self, flow: http.HTTPFlow) -> None:
        names = flow.metadata.get("credproxy")
        if flow.metadata.get("credproxy_audited"):
            return
        if names and flow.response is None:
            _event("substituted", flow, ",".join(names), 0, "no answer from the host")
        elif not flow.metadata.get("credproxy_seen") and flow.error is not None:
            # refused by mitmproxy before any hook decided: framing it will not forward (a
            # doubled Content-Length, Transfer-Encoding with Content-Length), a body too large
            message = flow.error.msg.split(":", 1)[0].removeprefix("Received ")[:80]
            _event("blocked", flow, "-", 400, f"request refused by mitmproxy ({message})")

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
