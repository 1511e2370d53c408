"""The bounds of every timeout and session duration, checked before anything starts.

Kept apart from the declaration models so that the command line can check its options
without importing them.
"""

from __future__ import annotations

import math

__all__ = ["MAX_SESSION_S", "MAX_TIMEOUT_S", "seconds_problem"]

#: The longest timeout anything accepts (a worker's, a run's, one exec's): a week.
MAX_TIMEOUT_S = 7 * 24 * 3600
#: The longest idle timeout or maximum lifetime a session accepts (None: no limit).
MAX_SESSION_S = 365 * 24 * 3600


def seconds_problem(value: object, maximum: float) -> str | None:
    """Why ``value`` is not a number of seconds in 0 < s <= ``maximum``, or None.

    Checked before anything starts: infinity, NaN or 1e12 s would otherwise reach a clock
    or a thread's wait, and overflow it only after the work began."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value!r} is not a number of seconds"
    if not math.isfinite(value) or not 0 < value <= maximum:
        return f"{value:g} is not in the range 0<x<={maximum:g} seconds"
    return None
