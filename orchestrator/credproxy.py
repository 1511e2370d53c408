"""The credential proxy's contract, for every engine: what it is given and what it answers. Pure.

A worker granted an *egress credential* (a project credential with an ``egress`` binding)
never holds the value. Its environment holds a placeholder, random per run
(``orcph-<name>-<32 hex>``), and its HTTP(S) clients go through a per-run credential proxy
(``images/credproxy``: mitmproxy with the addon ``addon.py``) on the run's own network. The
proxy terminates TLS only for the bound hosts (with a certificate from the run's own CA,
which the worker trusts), writes the real value into the bound header there and nowhere
else, blocks the placeholder anywhere else, scrubs the value out of responses, and sends
everything (intercepted or tunnelled) on through the run's allowlist proxy
(:mod:`orchestrator.egress`), which stays the one place that decides where a run may go.

This module describes that proxy once: its image and version, the name and port workers
reach it by, the environment a worker gets (placeholders, CA bundle variables, proxy
variables), the files it is given (configuration, values, CA), its limits, and the event
line it logs for every substitution and block, with the parser. Engines render it
(:mod:`orchestrator.docker.credproxy`). The image cannot import this package;
``tests/unit/test_credproxy_contract.py`` checks that it reads and writes what is
declared here. See docs/secrets.md.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.egress import PROXY_URL, PROXY_VARIABLES

__all__ = [
    "CA_NAME",
    "CA_VARIABLES",
    "CONFIG_NAME",
    "CREDPROXY_ALIAS",
    "CREDPROXY_IMAGE",
    "CREDPROXY_MEMORY",
    "CREDPROXY_PIDS",
    "CREDPROXY_PORT",
    "CREDPROXY_TMP_SIZE",
    "CREDPROXY_UID",
    "CREDPROXY_URL",
    "CREDPROXY_VERSION",
    "ENV_STATE",
    "EVENT_MARK",
    "PLACEHOLDER_PATTERN",
    "READY_MARK",
    "STATE_DIR",
    "TRUST_NAME",
    "WORKER_BUNDLE",
    "Binding",
    "CredentialEvent",
    "make_placeholder",
    "parse_events",
    "proxy_config",
    "proxy_ids",
    "value_file",
    "worker_env",
]

#: What the orchestrator gives the proxy and expects of it; bump when that changes (the
#: image's tag says it: checkouts of different versions on one machine use their own).
CREDPROXY_VERSION = "3"
#: The proxy image, built from ``images/credproxy`` on a Debian trixie base.
CREDPROXY_IMAGE = f"orchestrator/credproxy:v{CREDPROXY_VERSION}"

# -- how workers reach it ---------------------------------------------------------------

CREDPROXY_ALIAS = "credproxy"
CREDPROXY_PORT = 3129
CREDPROXY_URL = f"http://{CREDPROXY_ALIAS}:{CREDPROXY_PORT}"
#: The system CA bundle the worker's clients read; the run's bundle (the image's own
#: certificates plus the run's CA) is mounted read-only over it.
WORKER_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: Variables that point common clients at that bundle: Python's ssl (and httpx, under the
#: OpenAI and Anthropic SDKs), requests, curl, pip, git, Node (read at its start).
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
)
#: ``orcph-<name>-<32 hex>``: says what it is, and is worth nothing outside the run.
PLACEHOLDER_PATTERN = re.compile(r"orcph-[a-z0-9-]{1,32}-[0-9a-f]{32}")


@dataclass(frozen=True)
class Binding:
    """One egress credential as a run's plan states it (never its value)."""

    name: str
    hosts: list[str]
    """``host:port`` entries (exact names, HTTPS)."""
    header: str
    """The one header (lower case) the value may be written into."""
    format: str | None
    """The header's whole form (``Bearer {value}``), or None: the placeholder is replaced
    where it stands in that header."""
    placeholder_env: str
    placeholder: str


def make_placeholder(name: str) -> str:
    """A fresh placeholder for credential ``name``: ``orcph-<name>-<32 hex>``."""
    label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32] or "credential"
    return f"orcph-{label}-{secrets.token_hex(16)}"


def worker_env(bindings: Sequence[Binding]) -> dict[str, str]:
    """What a worker with egress credentials gets: each placeholder, the CA bundle
    variables, and proxy variables that send its clients to the credential proxy."""
    env = {binding.placeholder_env: binding.placeholder for binding in bindings}
    env.update(dict.fromkeys(CA_VARIABLES, WORKER_BUNDLE))
    no_proxy = "localhost,127.0.0.1"
    for variable in PROXY_VARIABLES:
        env[variable] = no_proxy if variable.lower() == "no_proxy" else CREDPROXY_URL
    return env


# -- what it is given -------------------------------------------------------------------

#: Inside the proxy: the read-only, in-memory folder holding its configuration, the
#: values (one 0400 file each) and the run CA's key. Only the proxy mounts it.
STATE_DIR = "/run/credproxy"
#: The variable naming that folder.
ENV_STATE = "CREDPROXY_STATE"
CONFIG_NAME = "config.json"
#: The run CA, key then certificate, under the name mitmproxy's confdir expects.
CA_NAME = "mitmproxy-ca.pem"
#: Extra CAs the proxy trusts upstream (``network.trust_ca``), concatenated.
TRUST_NAME = "trust-ca.pem"


def value_file(index: int) -> str:
    """The file (in :data:`STATE_DIR`) holding the value of the ``index``-th binding."""
    return f"value-{index}"


def proxy_config(bindings: Sequence[Binding], *, upstream: str = PROXY_URL) -> dict[str, Any]:
    """The proxy's configuration (written as :data:`CONFIG_NAME`): never a value, only
    the files holding them."""
    return {
        "version": CREDPROXY_VERSION,
        "port": CREDPROXY_PORT,
        "upstream": upstream,
        "credentials": [
            {
                "name": binding.name,
                "hosts": list(binding.hosts),
                "header": binding.header,
                "format": binding.format,
                "placeholder": binding.placeholder,
                "value_file": value_file(index),
            }
            for index, binding in enumerate(bindings)
        ],
    }


# -- limits -----------------------------------------------------------------------------

#: The uid (and gid) the proxy runs as, and owns its state, when the orchestrator is root
#: (otherwise the orchestrator's own uid: its 0400 files must be readable to the proxy).
CREDPROXY_UID = 10002


def proxy_ids() -> tuple[int, int]:
    """The uid and gid the proxy runs as, and its state belongs to, from this process."""
    if os.geteuid() == 0:
        return CREDPROXY_UID, CREDPROXY_UID
    return os.getuid(), os.getgid()


CREDPROXY_MEMORY = 384 << 20
CREDPROXY_PIDS = 64
CREDPROXY_TMP_SIZE = 16 << 20
#: Largest request body the proxy reads (it must see a body whole to look for the
#: placeholder in it); larger ones are refused.
BODY_LIMIT = "16m"

# -- what it answers --------------------------------------------------------------------

#: The line (on stdout) once it accepts connections.
READY_MARK = b"CREDPROXY-READY"
#: Every substitution and block is one line on stdout: the mark, a space, a JSON object
#: with :data:`EVENT_FIELDS` (never a value, never a hash of one).
EVENT_MARK = "CREDPROXY"
EVENT_FIELDS = ("event", "credential", "host", "port", "method", "path", "status", "reason")
EventKind = Literal["substituted", "blocked"]


@dataclass(frozen=True)
class CredentialEvent:
    """One request the credential proxy wrote a value into, or blocked."""

    event: EventKind
    credential: str
    host: str
    port: int
    method: str
    path: str
    """Without its query."""
    status: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in EVENT_FIELDS}


def parse_events(text: str, *, redact: Iterable[str] = ()) -> list[CredentialEvent]:
    """The proxy's event lines (other lines are ignored). Any of ``redact`` (the values)
    found in a field is a broken proxy: that event is dropped, never shown."""
    hidden = [value for value in redact if value]
    found: list[CredentialEvent] = []
    for line in text.splitlines():
        if not line.startswith(EVENT_MARK + " "):
            continue
        try:
            data = json.loads(line[len(EVENT_MARK) + 1 :])
        except ValueError:
            continue
        if not isinstance(data, Mapping) or data.get("event") not in ("substituted", "blocked"):
            continue
        fields = {name: data.get(name) for name in EVENT_FIELDS}
        if any(value in str(field) for field in fields.values() for value in hidden):
            continue
        found.append(
            CredentialEvent(
                event=data["event"],
                credential=str(fields["credential"] or "-"),
                host=str(fields["host"] or "-").lower(),
                port=int(str(fields["port"])) if str(fields["port"]).isdigit() else 0,
                method=str(fields["method"] or "-"),
                path=str(fields["path"] or "").split("?", 1)[0],
                status=int(str(fields["status"])) if str(fields["status"]).isdigit() else 0,
                reason=str(fields["reason"] or ""),
            )
        )
    return found
