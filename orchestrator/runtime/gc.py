"""Garbage collection: remove labelled objects whose owner process is gone.

``run`` calls :func:`collect` at start (one list request), and ``orchestrator gc`` calls it
on demand, so a SIGKILLed orchestrator leaves nothing behind for long. Objects owned by a
live process, or by a process in another pid namespace, are left alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from orchestrator import labels
from orchestrator.errors import EngineError
from orchestrator.runtime.engine import Inventory, ManagedObject

log = logging.getLogger(__name__)

#: Containers first: a network or volume in use cannot be removed before them.
_ORDER = {"container": 0, "network": 1, "volume": 2}


@dataclass
class GcReport:
    removed: list[ManagedObject] = field(default_factory=list)
    kept: list[ManagedObject] = field(default_factory=list)
    failed: list[tuple[ManagedObject, str]] = field(default_factory=list)


def collect(engine: Inventory, *, everything: bool = False) -> GcReport:
    """Remove orphaned objects (or, with ``everything``, all managed objects of dead owners
    in any pid namespace)."""
    report = GcReport()
    for obj in sorted(engine.list_managed(), key=lambda o: _ORDER[o.kind]):
        if obj.labels.get(labels.SHARED) == "true":
            continue  # proxies and networks shared between runs: see collect_shared
        state = labels.owner_state(obj.labels)
        if state == "alive" or (state == "foreign" and not everything):
            report.kept.append(obj)
            continue
        try:
            engine.remove_object(obj)
        except EngineError as exc:
            log.warning("gc could not remove %s %s: %s", obj.kind, obj.name, exc)
            report.failed.append((obj, str(exc)))
        else:
            report.removed.append(obj)
    return report
