"""``orchestrator doctor``: is this machine ready to run workers safely?

:func:`diagnose` reads the engine's facts (:mod:`orchestrator.docker.inspection`), the
host's (:mod:`.host`) and the firewall's (:mod:`.firewall`), judges each
(:mod:`.checks`), and runs real workers against local test servers to prove the network
sandbox holds (:mod:`.selftest`). The result is a :class:`Report` of :class:`Check` rows.
"""

from orchestrator.doctor.checks import Check, Report, Status
from orchestrator.doctor.diagnose import diagnose

__all__ = ["Check", "Report", "Status", "diagnose"]
