"""The console's own defences, in front of every request.

- **Host**: only ``127.0.0.1:PORT`` and ``localhost:PORT`` are answered (a page on another
  site that rebinds its name to 127.0.0.1 sends its own name: refused, DNS rebinding).
- **Prefix**: every page lives under ``/PREFIX/``, a random 128-bit path made at start;
  any other path is 404. The session cookie is scoped to that path: browsers do not keep
  cookies apart by port, so a cookie with ``Path=/`` would go to every other server on
  127.0.0.1 too; one with ``Path=/PREFIX/`` goes only where the prefix is known.
- **Token**: the printed address holds a random token that logs one browser in, once:
  ``POST /PREFIX/login`` with ``token`` (the forward file the console opens) or ``GET
  /PREFIX/?token=`` (the address pasted). Either answers with a new random session id in
  an HttpOnly, SameSite=Strict cookie, ``Path=/PREFIX/``, and a redirect to the page
  without the token. The token is spent then: a second use is 403. Later requests need
  that session id; anything else is 403. A logged-in page mints another single-use token
  for another browser (:meth:`Secrets.mint`).
- **CSRF**: every state change is a POST carrying ``csrf`` (a second secret, shown only in
  the console's own forms); a POST without it, with a wrong one, or from another origin
  (an ``Origin`` header naming another site) is 403. A GET never changes anything.
- **Headers** on every answer: a Content-Security-Policy that allows no script at all,
  styles from the console only, no frames, forms posting only to the console;
  ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``, no caching.
"""

from __future__ import annotations

import hmac
import html
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

__all__ = [
    "COOKIE",
    "CSP",
    "LOGIN_CSP",
    "MAX_FORM_BYTES",
    "MINTED_FOR",
    "RAW_CSP",
    "Secrets",
    "guard",
    "read_form",
]

COOKIE = "orchestrator_review"

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; sandbox allow-forms allow-same-origin"
)

#: The policy of the page that follows a login (:func:`_logged_in`): no content at all, no
#: sandbox (Chromium refuses a refresh in a sandbox without scripts).
LOGIN_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

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

#: A token minted for another browser (:meth:`Secrets.mint`) is good for this many seconds.
MINTED_FOR = 600.0

#: At most this many minted tokens wait to be used at once (the oldest are dropped).
_MAX_MINTED = 16

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Secrets:
    """The secrets of one start of the console, and the port it answers on: the path
    prefix, the printed single-use token, the tokens minted since, the session ids they
    were exchanged for, and the CSRF token."""

    def __init__(
        self,
        port: int,
        *,
        address: str = "127.0.0.1",
        tls: bool = False,
    ) -> None:
        self.port = port
        self.address = address
        """The address listened on (``--listen``); any but loopback is served over TLS."""
        self.tls = tls
        self.prefix = secrets.token_hex(16)
        """128 random bits: the first segment of every path the console answers."""
        self.token = secrets.token_urlsafe(32)
        """The printed token: logs one browser in, once."""
        self.csrf = secrets.token_urlsafe(32)
        self.clock: Callable[[], float] = time.monotonic
        """When minted tokens expire is measured on this clock."""
        self.on_first_login: Callable[[], None] | None = None
        """Called once, when the printed token is spent (the forward file is removed)."""
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {self.token: float("inf")}
        """Unspent tokens -> when they expire (on :attr:`clock`; the printed one never)."""
        self._sessions: set[str] = set()

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def base(self) -> str:
        """The path every page is under, without the final slash: ``/PREFIX``."""
        return f"/{self.prefix}"

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

    @property
    def home(self) -> str:
        """The console's first page, without a token."""
        return f"{self.scheme}://{self._authority}{self.base}/"

    @property
    def login(self) -> str:
        """Where the forward file posts the token."""
        return f"{self.home}login"

    def url(self, token: str | None = None) -> str:
        """The address to open: the console's first page with ``token`` (default: the
        printed one)."""
        return f"{self.home}?{urlencode({'token': token or self.token})}"

    def mint(self) -> str:
        """A new single-use token for another browser, good for :data:`MINTED_FOR` s."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            now = self.clock()
            self._tokens = {t: end for t, end in self._tokens.items() if end > now}
            minted = [t for t, end in self._tokens.items() if end != float("inf")]
            for old in minted[: max(0, len(minted) - _MAX_MINTED + 1)]:
                del self._tokens[old]
            self._tokens[token] = now + MINTED_FOR
        return token

    def exchange(self, token: str) -> str | None:
        """Spend ``token``: a new session id, or None for a token that is wrong, spent or
        expired."""
        with self._lock:
            found = next((t for t in self._tokens if _same(token, t)), None)
            if found is None:
                return None
            ends = self._tokens.pop(found)
            if ends <= self.clock():
                return None
            session = secrets.token_urlsafe(32)
            self._sessions.add(session)
            first = found == self.token
        if first and self.on_first_login is not None:
            self.on_first_login()
        return session

    def known(self, session: str | None) -> bool:
        """Whether ``session`` is a session id this console gave out."""
        if not session:
            return False
        with self._lock:
            return any(_same(session, s) for s in self._sessions)


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
                # A raw download sets its own, stricter policy, the login page its own:
                # those are kept.
                raw = [v for k, v in own if k.lower() == b"content-security-policy"]
                headers = [(k, v) for k, v in own if k.decode("latin-1").lower() not in _OURS]
                headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                if raw in ([RAW_CSP.encode()], [LOGIN_CSP.encode()]):
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


#: The answer to a token that is wrong, spent or expired.
SPENT = (
    "refused: this address's token is wrong or was used already (each works once, in one "
    "browser); use the browser it opened, make an address for another browser on the "
    "console's page 'Another browser', or restart orchestrator review for a new one"
)


def _logged_in(target: str, session: str, keys: Secrets) -> Response:
    """The answer to a spent token: the session cookie, and a page that goes on to
    ``target`` (the address without the token).

    Not a 303: a SameSite=Strict cookie is not sent on a redirect that a cross-site
    request started (the forward file's POST comes from a ``file://`` page), while a
    refresh the console's own page asks for is same-site. That page holds nothing but the
    link, so its policy may lift the sandbox a refresh needs (:data:`LOGIN_CSP`).
    """
    where = html.escape(quote(target, safe="/?=&%"))
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0; url={where}">'
        "<title>orchestrator review</title></head>\n"
        f'<body><p>Logged in: <a href="{where}">open the review console</a>.</p></body></html>\n'
    )
    response = HTMLResponse(page, headers={"Content-Security-Policy": LOGIN_CSP})
    response.set_cookie(
        keys.cookie,
        session,
        httponly=True,
        samesite="strict",
        path=f"{keys.base}/",
        secure=keys.tls,
    )
    return response


def _foreign(request: Request, keys: Secrets) -> bool:
    # With Referrer-Policy no-referrer the browser sends "Origin: null" for the console's
    # own forms (and a file:// page for its form): only a real foreign origin is refused
    # here; the CSRF token (or the login token) decides.
    origin = request.headers.get("origin")
    return origin not in (None, "null") and origin not in keys.origins


async def _refusal(request: Request, keys: Secrets) -> Response | None:
    """The answer to a request that fails a check, or None to let it through."""
    if request.headers.get("host", "") not in keys.hosts:
        answered = " or ".join(sorted(keys.hosts))
        return _refuse(f"refused: wrong Host header (this console answers {answered} only)", 421)
    path = request.url.path
    if path == "/favicon.ico":  # asked by browsers at the root, where no cookie goes
        return Response(status_code=204)
    first, slash, _ = path[1:].partition("/")
    if not _same(first, keys.prefix):
        return _refuse(  # says nothing of the prefix
            "not found: the console's address changes at each start; open the one "
            "orchestrator review printed",
            404,
        )
    if not slash:  # /PREFIX: the cookie's path is /PREFIX/
        query = request.url.query
        return RedirectResponse(f"{keys.base}/" + (f"?{query}" if query else ""), 303)
    if path == f"{keys.base}/login" and request.method == "POST":
        if _foreign(request, keys):
            return _refuse("refused: the form came from another origin")
        try:
            form = await read_form(request)
        except ValueError:
            return _refuse("refused: form too large", 413)
        given = form.get("token", [])
        session = keys.exchange(given[0]) if len(given) == 1 else None
        if session is None:
            return _refuse(SPENT)
        return _logged_in(f"{keys.base}/", session, keys)
    token = request.query_params.get("token")
    if token is not None:
        session = keys.exchange(token) if request.method == "GET" else None
        if session is None:
            return _refuse(SPENT)
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        return _logged_in(path + (f"?{urlencode(rest)}" if rest else ""), session, keys)
    if not keys.known(request.cookies.get(keys.cookie)):
        return _refuse(
            "refused: not logged in; open the address the console printed (its token "
            "logs one browser in, once)"
        )
    if request.method == "GET" or request.method == "HEAD":
        return None
    if request.method != "POST":
        return _refuse("refused: method not allowed", 405)
    if _foreign(request, keys):
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
