"""The console's own defences, in front of every request.

- **Host**: only ``127.0.0.1:PORT`` and ``localhost:PORT`` are answered (a page on another
  site that rebinds its name to 127.0.0.1 sends its own name: refused, DNS rebinding).
- **Token**: a random token made at start is required on every request, first as
  ``?token=`` (the printed address), which sets an HttpOnly, SameSite=Strict cookie and
  redirects to the same page without the token (so it stays out of history and logs);
  then as that cookie. Anything else is 403.
- **CSRF**: every state change is a POST carrying ``csrf`` (a second secret, shown only in
  the console's own forms); a POST without it, with a wrong one, or from another origin
  (an ``Origin`` header naming another site) is 403. A GET never changes anything.
- **Headers** on every answer: a Content-Security-Policy that allows no script at all,
  styles from the console only, no frames, forms posting only to the console;
  ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``, no caching.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

__all__ = ["COOKIE", "CSP", "MAX_FORM_BYTES", "RAW_CSP", "Secrets", "guard", "read_form"]

COOKIE = "orchestrator_review"

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; sandbox allow-forms allow-same-origin"
)

#: The policy of a raw file download (the app sets it; the guard keeps it): no content of
#: any kind, and a sandbox without any permission, should a browser ever render it.
RAW_CSP = "sandbox; default-src 'none'"

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

_OURS = frozenset(h.lower() for h in HEADERS)

#: A form body larger than this is refused (the console's forms are a few fields).
MAX_FORM_BYTES = 64 << 10

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Secrets:
    """The secrets of one start of the console, and the port it answers on."""

    port: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    address: str = "127.0.0.1"
    """The address listened on (``--listen``); any but loopback is served over TLS."""
    tls: bool = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def _authority(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    @property
    def hosts(self) -> frozenset[str]:
        """The ``Host`` headers answered: the address listened on (and ``localhost`` for
        loopback)."""
        if self.address == "127.0.0.1":
            return frozenset({f"127.0.0.1:{self.port}", f"localhost:{self.port}"})
        return frozenset({self._authority})

    @property
    def origins(self) -> frozenset[str]:
        """The ``Origin`` headers a POST may carry."""
        return frozenset(f"{self.scheme}://{host}" for host in self.hosts)

    @property
    def cookie(self) -> str:
        """The cookie's name: browsers share cookies across ports, consoles must not."""
        return f"{COOKIE}_{self.port}"

    def url(self) -> str:
        """The address to open: the console's first page with the token."""
        return f"{self.scheme}://{self._authority}/?{urlencode({'token': self.token})}"


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _refuse(message: str, status: int = 403) -> Response:
    return PlainTextResponse(f"{message}\n", status_code=status)


async def read_form(request: Request) -> dict[str, list[str]]:
    """The url-encoded body of a POST, field -> values (at most :data:`MAX_FORM_BYTES`)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ValueError("form too large")
    form: dict[str, list[str]] = {}
    for key, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        form.setdefault(key, []).append(value)
    return form


def guard(app: ASGIApp, keys: Secrets) -> ASGIApp:
    """``app`` behind the checks above; every answer gets :data:`HEADERS`."""

    async def check(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await app(scope, receive, send)
            return
        request = Request(scope, receive)

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                own = [(k, v) for k, v in message.get("headers", [])]
                # A raw download sets its own, stricter policy: that one is kept.
                raw = [v for k, v in own if k.lower() == b"content-security-policy"]
                headers = [(k, v) for k, v in own if k.decode("latin-1").lower() not in _OURS]
                headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                if raw == [RAW_CSP.encode()]:
                    headers = [(k, raw[0] if k.lower() == b"content-security-policy" else v)
                               for k, v in headers]  # fmt: skip
                message["headers"] = headers
            await send(message)

        refusal = await _refusal(request, keys)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await app(scope, receive, send_with_headers)

    return check


async def _refusal(request: Request, keys: Secrets) -> Response | None:
    """The answer to a request that fails a check, or None to let it through."""
    if request.headers.get("host", "") not in keys.hosts:
        answered = " or ".join(sorted(keys.hosts))
        return _refuse(f"refused: wrong Host header (this console answers {answered} only)", 421)
    token = request.query_params.get("token")
    if token is not None:
        if not _same(token, keys.token) or request.method != "GET":
            return _refuse("refused: wrong token")
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            keys.cookie, keys.token, httponly=True, samesite="strict", path="/", secure=keys.tls
        )
        return response
    if not _same(request.cookies.get(keys.cookie), keys.token):
        return _refuse("refused: open the address the console printed (it holds the token)")
    if request.method == "GET" or request.method == "HEAD":
        return None
    if request.method != "POST":
        return _refuse("refused: method not allowed", 405)
    # With Referrer-Policy no-referrer the browser sends "Origin: null" for the console's
    # own forms: only a real foreign origin is refused here; the CSRF token decides.
    origin = request.headers.get("origin")
    if origin not in (None, "null") and origin not in keys.origins:
        return _refuse("refused: the form came from another origin")
    try:
        form = await read_form(request)
    except ValueError:
        return _refuse("refused: form too large", 413)
    given = form.get("csrf", [])
    if len(given) != 1 or not _same(given[0], keys.csrf):
        return _refuse("refused: missing or wrong CSRF token; reload the page and try again")
    request.scope["review.form"] = form
    return None
