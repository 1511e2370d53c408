"""mitmproxy with only what the credential proxy uses: a lean ``mitmdump``.

``mitmdump`` loads every default addon (flow filters, playback, the onboarding web app with
Flask, proxy authentication with LDAP, HAR export, ...): importing them took about 1.4 s of
the proxy's ~2.3 s start on a loaded 2-core machine, while a run's proxy needs five. This
starts mitmproxy's own ``Master`` with exactly these, in the order ``mitmdump`` gives them:

  termlog (warnings to stdout), core (option checks), disable_h2c (no h2c upgrades),
  proxyserver, the credential addon, next_layer, tlsconfig, errorcheck (a startup error
  exits instead of serving)

Importing a submodule of ``mitmproxy.addons`` runs that package's ``__init__``, which
imports every addon; the package is therefore registered empty (its folder as its path)
before the five are imported. The options are mitmdump's, given the same way
(``--set name=value``, ``--mode``, ``--listen-port``), as one JSON list on stdin: mitmproxy
is imported first, then the line awaited, so a spare proxy (started before any run needs
it, see entry.py) has paid its start-up before its run's configuration exists. The
credential addon is imported directly, not through ``-s``, once the line came: an addon
that fails to load stops the proxy (no worker starts without it), where the script loader
would log it and serve without it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import types

import mitmproxy

_ADDONS = types.ModuleType("mitmproxy.addons")
_ADDONS.__path__ = [f"{mitmproxy.__path__[0]}/addons"]
_ADDONS.__package__ = "mitmproxy.addons"
sys.modules["mitmproxy.addons"] = _ADDONS
mitmproxy.addons = _ADDONS  # type: ignore[attr-defined]

from mitmproxy import exceptions, http, master, options, tls  # noqa: E402, F401
from mitmproxy.addons import (  # noqa: E402
    core,
    disable_h2c,
    errorcheck,
    next_layer,
    proxyserver,
    tlsconfig,
)

sys.path.insert(0, "/usr/local/lib/credproxy")
import forms  # noqa: E402, F401


def _settings(argv: list[str]) -> dict[str, str]:
    """mitmdump's ``--mode M --listen-port P --set name=value`` as option names and values."""
    settings: dict[str, str] = {}
    words = iter(argv)
    for word in words:
        value = next(words)
        if word == "--set":
            name, _, value = value.partition("=")
            settings[name] = value
        elif word in ("--mode", "--listen-port"):
            settings[word[2:].replace("-", "_")] = value
        else:
            raise SystemExit(f"credproxy launch: unknown argument {word}")
    return settings


async def _main(settings: dict[str, str]) -> None:
    import addon  # reads the run's configuration: only once it is there

    opts = options.Options()
    proxy = master.Master(opts, with_termlog=True)
    proxy.addons.add(
        core.Core(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),
        *addon.addons,
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        errorcheck.ErrorCheck(),
    )
    try:
        opts.set(*(f"{name}={value}" for name, value in settings.items()))
    except exceptions.OptionsError as exc:
        print(f"credproxy launch: {exc}", file=sys.stderr)
        sys.exit(1)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, proxy.shutdown)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    await proxy.run()


if __name__ == "__main__":
    # Everything heavy is imported above; the settings (mitmdump's arguments, as a JSON
    # list) arrive on stdin once the run's state is there: at once for a run's own proxy,
    # when a run takes it for a spare. No line: the spare was never taken.
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    asyncio.run(_main(_settings(json.loads(line))))
