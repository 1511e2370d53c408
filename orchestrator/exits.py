"""The exit codes the orchestrator gives, in one place, with what each outcome says.

They follow docker's and the shell's conventions: a worker's own code passes through;
otherwise

- 124 the worker ran past its timeout and was killed (as with coreutils ``timeout``);
- 125 the orchestrator itself failed (``docker run``'s own errors);
- 126 the worker's command cannot be run; 127 it is not there (a shell's codes);
- 137 the worker was killed for exceeding its memory limit (128 + SIGKILL);
- 128 + N the run, batch or command was stopped by signal N (130 Ctrl-C, 143 SIGTERM).

A leaf: imports nothing of the package, so the command line's ``--help`` stays light.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Exit", "killed_for_memory", "signalled", "timed_out"]


class Exit(IntEnum):
    """An exit code with a meaning of its own (a worker's other codes are its own)."""

    TIMEOUT = 124
    """Killed at its timeout."""
    ERROR = 125
    """The orchestrator's own error: the worker did not run, or its end is unknown."""
    CANNOT_INVOKE = 126
    """The worker's command exists but cannot be run."""
    NOT_FOUND = 127
    """The worker's command is not there."""
    OOM = 137
    """Killed for exceeding its memory limit (SIGKILL: 128 + 9)."""


def signalled(signum: int) -> int:
    """The exit code of something stopped by signal ``signum``: 128 + N, as a shell says."""
    return 128 + signum


def timed_out(timeout_s: float) -> str:
    """What a run killed at its timeout reports (with :attr:`Exit.TIMEOUT`)."""
    return f"timed out after {timeout_s:g} s; the worker was killed"


def killed_for_memory(memory: int) -> str:
    """What a run killed at its memory limit reports (with :attr:`Exit.OOM`)."""
    return f"killed for exceeding its memory limit ({memory} bytes)"
