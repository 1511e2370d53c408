"""The pure preparation of a run: declarations in, a checked and compiled plan out.

Beside :mod:`orchestrator.plan` in the core: it reads the project's declarations and the
inputs given on the host, and touches no engine, no git and no run folder. The runtime
(:mod:`orchestrator.runtime`) takes a :class:`Prepared` from here and makes it real.
"""

from orchestrator.prepare.inputs import InputPath, InputSpec, check_inputs
from orchestrator.prepare.prepared import (
    Prepared,
    check_name,
    compile_prepared,
    load_and_prepare,
    new_id,
    prepare,
)

__all__ = [
    "InputPath",
    "InputSpec",
    "Prepared",
    "check_inputs",
    "check_name",
    "compile_prepared",
    "load_and_prepare",
    "new_id",
    "prepare",
]
