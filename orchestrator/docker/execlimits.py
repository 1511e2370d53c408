"""Execs set their own open-file limit: runc's is racy.

runc 1.1 built with Go 1.19 or later (Debian 12's 1.1.5) starts an exec'd command's
``runc init`` first and sets its rlimits with ``prlimit`` afterwards, while Go's own start-up
in that ``runc init`` raises the soft ``RLIMIT_NOFILE`` to the hard limit. When the
``prlimit`` lands first (a loaded machine: 48 of 150 execs here), the command keeps
``nofile 4096 4096`` instead of the plan's ``1024 4096`` (runc issue 4195, fixed in runc
1.1.13). A container's own process is not affected: runc sets its limits from inside.

So an exec into a runc container with a ``nofile`` limit goes through :func:`wrapped`:
``/bin/sh`` sets the soft and hard limit to the container's again (lowering needs no
privilege), then replaces itself with the command, which keeps the shell's pid. gVisor's
runsc sets an exec's limits in its own kernel and is left alone. A command that cannot start
is reported in words :class:`~orchestrator.docker.engine.DockerExec` reads as the engine's
own report (not found 127, not runnable 126): it stays a start failure, not the command's
own exit code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: How the wrapper reports a command that cannot start (the first thing on its stdout).
FAILED = b"orchestrator exec failed: "
_SAY = f'printf \'{FAILED.decode()}"%s": %s\\n\' "$1"'
#: $0 the soft limit, $1 the hard one, then the command. The command is looked up as
#: execve(2) with PATH would: a name with a slash as it is, else in PATH's folders.
SCRIPT = (
    'ulimit -S -n "$0" && ulimit -H -n "$1" || exit 126; shift; set -f; '
    "case $1 in */*) p=$1 ;; *) p=; IFS=:; for d in $PATH; do "
    'if [ -f "${d:-.}/$1" ] && [ -x "${d:-.}/$1" ]; then p=${d:-.}/$1; break; fi; done; '
    "unset IFS ;; esac; "
    f"[ -n \"$p\" ] || {{ {_SAY} 'executable file not found in $PATH'; exit 127; }}; "
    f"[ -e \"$p\" ] || {{ {_SAY} 'no such file or directory'; exit 127; }}; "
    f'[ -f "$p" ] && [ -x "$p" ] || {{ {_SAY} \'permission denied\'; exit 126; }}; '
    'exec "$@"'
)


def nofile(
    runtime_is_gvisor: bool, ulimits: Iterable[Mapping[str, Any]] | None
) -> tuple[int, int] | None:
    """The (soft, hard) nofile limit execs into a container must set themselves: the
    container's, from its ulimits as the engine lists them; None under gVisor or without
    one."""
    if runtime_is_gvisor:
        return None
    for entry in ulimits or ():
        name = str(entry.get("Name") or entry.get("name") or "").lower().removeprefix("rlimit_")
        if name == "nofile":
            soft = entry.get("Soft", entry.get("soft"))
            hard = entry.get("Hard", entry.get("hard"))
            if isinstance(soft, int) and isinstance(hard, int) and 0 <= soft <= hard:
                return soft, hard
    return None


def wrapped(argv: Sequence[str], limit: tuple[int, int] | None) -> list[str]:
    """``argv`` as exec'd with ``limit`` (see the module docstring); as it is without one."""
    if limit is None:
        return list(argv)
    return ["/bin/sh", "-c", SCRIPT, str(limit[0]), str(limit[1]), *argv]
