#!/opt/credproxy/bin/python3
"""Start mitmproxy with the credential addon (launch.py: a lean mitmdump), and relay its
output with the values removed.

Environment:
  CREDPROXY_STATE  the read-only, in-memory folder the orchestrator mounts for this run:
                   config.json (port, upstream proxy, the credentials without their
                   values), one file per value, mitmproxy-ca.pem (the run CA's key and
                   certificate) and, optionally, trust-ca.pem (extra upstream CAs).

mitmproxy's confdir is made in /tmp (a tmpfs): it holds a link to the CA file and the
Diffie-Hellman parameters mitmproxy writes itself. Upstream certificates are checked
against the image's CA bundle plus trust-ca.pem. Everything mitmproxy prints passes
through a scrubber that removes the values in every spelling before it reaches the log.
``--check`` loads the configuration and exits.

A spare proxy (``CREDPROXY_SPARE_IDLE``: seconds) is started before any run needs it, with
an empty state folder and no network: mitmproxy imports everything, then both wait. A run
takes it by moving its state in (config.json last) and attaching it to its network; past
the idle time untaken, it exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "/usr/local/lib/credproxy")

from forms import Scrubber  # noqa: E402

STATE = Path(os.environ.get("CREDPROXY_STATE", "/run/credproxy"))
CONF = Path("/tmp/mitmproxy")
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
UPSTREAM_BUNDLE = Path("/tmp/upstream-ca.pem")
LAUNCH = "/usr/local/lib/credproxy/launch.py"
#: Set by SIGTERM: a waiting spare stops waiting.
STOPPING = False


def fail(message: str) -> None:
    print(f"credproxy: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def read_state() -> tuple[dict, list[str]]:
    """The run's configuration and values; mitmproxy's confdir and upstream bundle made."""
    try:
        config = json.loads((STATE / "config.json").read_text())
        values = [(STATE / c["value_file"]).read_text() for c in config["credentials"]]
    except (OSError, ValueError, KeyError) as exc:
        fail(f"cannot read the configuration in {STATE}: {type(exc).__name__}")
    if not (STATE / "mitmproxy-ca.pem").is_file():
        fail(f"no CA in {STATE}")
    CONF.mkdir(mode=0o700, exist_ok=True)
    link = CONF / "mitmproxy-ca.pem"
    if not link.is_symlink():
        link.symlink_to(STATE / "mitmproxy-ca.pem")
    bundle = SYSTEM_BUNDLE.read_bytes()
    trust = STATE / "trust-ca.pem"
    if trust.is_file():
        bundle += b"\n" + trust.read_bytes()
    UPSTREAM_BUNDLE.write_bytes(bundle)
    return config, values


def wait_for_state(child: subprocess.Popen[bytes]) -> None:
    """A spare (CREDPROXY_SPARE_IDLE set): wait until a run hands its state over (the
    orchestrator writes config.json last); past the idle time, stop mitmproxy and exit."""
    idle = float(os.environ.get("CREDPROXY_SPARE_IDLE") or 0)
    if not idle:
        return  # a run's own proxy: its state was there before it started
    deadline = time.monotonic() + idle
    while not (STATE / "config.json").exists():
        if time.monotonic() >= deadline or STOPPING:
            assert child.stdin is not None
            child.stdin.close()
            child.wait()
            print("credproxy: spare not taken, exiting", flush=True)
            sys.exit(0)
        time.sleep(0.02)  # hidden: the network is attached after the state is in


def main() -> None:
    if "--check" in sys.argv:
        read_state()
        print("credproxy: configuration ok")
        return
    # mitmproxy starts importing at once and waits for its settings on stdin.
    child = subprocess.Popen(
        ["/opt/credproxy/bin/python3", LAUNCH],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    def stop(*_: object) -> None:
        global STOPPING
        STOPPING = True
        child.terminate()

    signal.signal(signal.SIGTERM, stop)
    wait_for_state(child)
    try:
        config, values = read_state()
    except SystemExit:
        child.kill()
        raise
    settings = [
        "--mode", f"upstream:{config['upstream']}",
        "--listen-port", str(config["port"]),
        "--set", f"confdir={CONF}",
        "--set", "upstream_cert=false",
        "--set", f"ssl_verify_upstream_trusted_ca={UPSTREAM_BUNDLE}",
        "--set", "body_size_limit=16m",
        "--set", "termlog_verbosity=warn",
        "--set", "http3=false",
    ]  # fmt: skip
    scrub = Scrubber({value: "credential" for value in values if value})
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write(json.dumps(settings).encode() + b"\n")
        child.stdin.close()
    except BrokenPipeError:
        fail(f"mitmproxy exited before it was configured (code {child.wait()})")
    for line in child.stdout:
        sys.stdout.buffer.write(scrub.scrub(line))
        sys.stdout.buffer.flush()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
