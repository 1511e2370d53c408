"""``ADD <url>``: what may be fetched, how, and what the fetch answered. Pure.

Nothing is downloaded by the orchestrator's own process. A URL whose host and port are on
the project's build allowlist is fetched by a throw-away container on the build's own
network (the egress proxy's image, which has python3, run as ``nobody`` under the build
runtime with a step's limits), through the same egress proxy as ``RUN`` steps:
:data:`SCRIPT` makes one request, never follows a redirect, writes the body to
:data:`DOWNLOAD` in the container's layer (its size capped by the build's disk limit, the
file-size limit and the layer watch a step gets) and says what it got in one JSON line
(:func:`answer_of`). A redirect is checked against the allowlist here before the next
request (:func:`next_url`). The builder then reads the file out of the container, takes
its sha256 itself and puts it into the step's layer, mode 0600 unless ``--chmod``; a
remote archive is never unpacked (Docker's rule). See docs/build.md.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

from orchestrator.build.dockerfile import BuildRefused
from orchestrator.config.allowlist import validate_allowlist

__all__ = [
    "CA_FILE",
    "DOWNLOAD",
    "FETCH_USER",
    "FOLDER",
    "MAX_REDIRECTS",
    "SCRIPT",
    "Answer",
    "answer_of",
    "check_url",
    "file_name",
    "next_url",
    "parse_checksum",
]

#: The fetch container's folder (put into its layer before it starts, owned by
#: :data:`FETCH_USER`: gVisor keeps an empty ``/tmp`` in memory, where the engine's
#: archive API would not see the body).
FOLDER = "/fetch"
#: Where the fetch container writes the body (read back with the archive API).
DOWNLOAD = f"{FOLDER}/download"
#: Where the host's trusted certificates are put for an https URL.
CA_FILE = f"{FOLDER}/ca.pem"
#: The fetch runs as ``nobody``.
FETCH_USER = 65534
#: Redirects followed at most (each one checked against the allowlist first).
MAX_REDIRECTS = 10
#: The mark of the fetch container's one answer line.
ANSWER_MARK = "ORCHESTRATOR-FETCH "
#: A file a URL gives is 0600 in the image (Docker's rule), unless ``--chmod``.
URL_MODE = 0o600
_CHECKSUM = re.compile(r"^sha256:([0-9a-f]{64})$")

#: Runs in the fetch container: ``python3 -c SCRIPT URL PROXY``. One request through the
#: proxy, no redirect followed, the body to DOWNLOAD; one answer line on stdout.
SCRIPT = (
    r"""
import errno, hashlib, json, os, ssl, sys, urllib.error, urllib.request
url, proxy = sys.argv[1], sys.argv[2]
def say(**answer):
    sys.stdout.write("MARK" + json.dumps(answer) + "\n")
    sys.stdout.flush()
class Keep(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
context = ssl.create_default_context(cafile="CA" if os.path.exists("CA") else None)
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({"http": proxy, "https": proxy}),
    urllib.request.HTTPSHandler(context=context), Keep())
request = urllib.request.Request(url, headers={"User-Agent": "orchestrator-build"})
try:
    reply = opener.open(request, timeout=60)
except urllib.error.HTTPError as exc:
    reply = exc
except Exception as exc:
    say(error=str(exc)[:300])
    sys.exit(0)
status = reply.status if hasattr(reply, "status") else reply.code
headers = reply.headers
if status != 200:
    say(status=status, location=headers.get("Location", "")[:4096],
        proxy=bool(headers.get("X-Squid-Error")), reason=str(getattr(reply, "reason", ""))[:200])
    sys.exit(0)
digest, size = hashlib.sha256(), 0
try:
    with open("DOWNLOAD", "wb") as out:
        while True:
            chunk = reply.read(1 << 16)
            if not chunk:
                break
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
except OSError as exc:  # the file-size limit (EFBIG), or the server's connection
    say(error=str(exc)[:300], too_big=exc.errno == errno.EFBIG)
    sys.exit(0)
say(status=200, size=size, sha256=digest.hexdigest(),
    modified=headers.get("Last-Modified", "")[:100])
""".replace("MARK", ANSWER_MARK)
    .replace("DOWNLOAD", DOWNLOAD)
    .replace("CA", CA_FILE)
)


@dataclass(frozen=True)
class Answer:
    """What one request got: a body (status 200), a redirect, another status, or an error."""

    status: int = 0
    location: str = ""
    proxy: bool = False
    """The egress proxy refused the request (not the server)."""
    reason: str = ""
    error: str = ""
    too_big: bool = False
    """The body went past the file-size limit (the build's disk limit)."""
    size: int = 0
    modified: str = ""


def check_url(url: str, allow: Sequence[str], where: str) -> tuple[str, int]:
    """``(host, port)`` of an http(s) ``url`` on the build allowlist ``allow``; refused
    in one line naming ``where`` otherwise (nothing is fetched)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BuildRefused(f"{where}: {url}: not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise BuildRefused(f"{where}: {url}: only http and https URLs are fetched")
    if parts.username is not None or parts.password is not None:
        raise BuildRefused(f"{where}: {url}: credentials in a URL are never sent")
    host = (parts.hostname or "").lower()
    if not host:
        raise BuildRefused(f"{where}: {url}: no host")
    port = port or (443 if scheme == "https" else 80)
    if not allow:
        raise BuildRefused(
            f"{where}: {url}: the project declares no build allowlist, so nothing is "
            f"downloaded: add '{host}:{port}' to build.allow in orchestrator.yaml, or put "
            "the file into the build context"
        )
    if not any(entry.matches(host, port) for entry in validate_allowlist(allow)):
        raise BuildRefused(
            f"{where}: {url}: {host}:{port} is not on the project's build allowlist "
            "(build.allow): nothing was downloaded"
        )
    return host, port


def next_url(url: str, answer: Answer, allow: Sequence[str], where: str, hops: int) -> str:
    """The URL a redirect leads to, checked against the allowlist before it is fetched."""
    if not answer.location:
        raise BuildRefused(f"{where}: {url}: redirect ({answer.status}) without a Location")
    if hops >= MAX_REDIRECTS:
        raise BuildRefused(f"{where}: {url}: more than {MAX_REDIRECTS} redirects")
    target = urljoin(url, answer.location)
    try:
        check_url(target, allow, where)
    except BuildRefused as exc:
        why = str(exc).removeprefix(f"{where}: {target}: ")
        why = why.replace("nothing was downloaded", "not followed")
        raise BuildRefused(f"{where}: {url} redirected to {target}: {why}") from None
    return target


def answer_of(output: str) -> Answer | None:
    """The fetch container's answer line in its output (the last one), or None."""
    lines = [line for line in output.splitlines() if line.startswith(ANSWER_MARK)]
    if not lines:
        return None
    try:
        found = json.loads(lines[-1][len(ANSWER_MARK) :])
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None

    def text(name: str) -> str:
        value = found.get(name)
        return value if isinstance(value, str) else ""

    def number(name: str) -> int:
        value = found.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Answer(status=number("status"), location=text("location"),
                  proxy=found.get("proxy") is True, reason=text("reason"), error=text("error"),
                  too_big=found.get("too_big") is True, size=number("size"),
                  modified=text("modified"))  # fmt: skip


def file_name(url: str, where: str) -> str:
    """The file name a URL gives a destination folder (the last part of its path)."""
    name = posixpath.basename(unquote(urlsplit(url).path))
    if name in ("", ".", "..") or "\0" in name:
        raise BuildRefused(
            f"{where}: {url}: no file name in the URL: name the destination file "
            "(a destination without a trailing /)"
        )
    return name


def parse_checksum(text: str, where: str) -> str:
    """``--checksum=sha256:HEX``: the hex digest (lower case)."""
    match = _CHECKSUM.match(text.strip().lower())
    if match is None:
        raise BuildRefused(
            f"{where}: --checksum={text}: expected sha256: and 64 hexadecimal digits"
        )
    return match.group(1)
