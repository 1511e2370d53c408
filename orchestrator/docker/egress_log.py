"""A run's egress decisions, followed from the shared proxy's log while the run runs.

The proxy (:mod:`orchestrator.docker.egress`) is shared by every run with the same
allowlist and logs every decision into its ``json-file`` log, which the engine rotates
(:data:`orchestrator.egress.PROXY_LOG_OPTIONS`). Reading a run's decisions only at its end
lets anything that fills the log meanwhile erase them, so :class:`DecisionLog` follows the
log from the moment the run's network is attached: a thread keeps the lines of the run's
clients (its network's subnet) as the engine writes them, and :meth:`DecisionLog.close`
stops it and reads what came after the last line seen (the tunnels logged when the run's
containers went, and the rest of a flood until the proxy reports its end), never a line
twice. Docker's own timestamp on each line is the cursor.

What a run keeps is bounded: :data:`~orchestrator.egress.RUN_DENIED` denied and
:data:`~orchestrator.egress.RUN_ALLOWED` allowed decisions one by one, the rest counted,
together with what the proxy itself counted instead of logging
(:data:`~orchestrator.egress.FLOOD_MARK` lines). When the proxy is replaced during the run
(:func:`~orchestrator.docker.egress.ensure_egress` replaces an unhealthy one), the thread
follows its successor, found by name.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from docker import errors as docker_errors

from orchestrator.docker.client import DockerClient, engine_errors
from orchestrator.egress import (
    RUN_ALLOWED,
    RUN_DENIED,
    Decision,
    parse_decisions,
    parse_floods,
)
from orchestrator.runtime.engine import EgressDecision, EgressLog

__all__ = ["DecisionLog"]

log = logging.getLogger(__name__)

#: How long :meth:`DecisionLog.close` waits at most for the proxy to report the end of the
#: run's flood (it may still be working through the requests of a worker now gone); the
#: counts are a lower bound after that.
_FLOOD_SETTLE = 60.0
#: How long an end of the flood must stand (no later count for the run) to be taken as
#: the end: under load the proxy may see a gap in a flood that goes on.
_FLOOD_QUIET = 3.0
#: A line longer than this (the proxy cuts its own at 512 bytes) is dropped unread.
_LINE_LIMIT = 4096


def _nanos(stamp: str) -> int | None:
    """Docker's RFC 3339 timestamp (``2026-11-27T05:00:00.123456789Z``) in nanoseconds."""
    whole, _, rest = stamp.partition(".")
    digits = rest.rstrip("Z")
    if not stamp.endswith("Z") or not (digits.isdigit() or not digits):
        return None
    try:
        seconds = datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
    return int(seconds) * 1_000_000_000 + int((digits or "0").ljust(9, "0")[:9])


class DecisionLog:
    """The decisions of one run's clients (``subnets``) on the proxy ``locate`` names,
    from ``since`` on; with ``follow`` a thread reads them as they are logged."""

    def __init__(
        self,
        engine: DockerClient,
        locate: Callable[[], str | None],
        subnets: Sequence[ipaddress.IPv4Network],
        since: datetime,
        *,
        follow: bool = True,
    ) -> None:
        self._engine = engine
        self._locate = locate
        self._subnets = list(subnets)
        self._since = since
        self._lock = threading.Lock()
        self._closed = False
        self._stream: Any = None
        self._cursor = 0  # the last line's docker timestamp (ns) ...
        self._at_cursor: set[str] = set()  # ... and the lines seen with it
        self._kept: list[Decision] = []
        self._counts = {True: 0, False: 0}  # kept, by verdict
        self._unlisted = {True: 0, False: 0}
        self._unlisted_bytes = 0
        self._flooding = False  # the proxy's last flood line for the run had counts
        self._flood_seen = 0.0  # when the last one was read (monotonic; 0: none)
        self._thread: threading.Thread | None = None
        if follow:
            self._thread = threading.Thread(
                target=self._follow, name="egress-decisions", daemon=True
            )
            self._thread.start()

    # -- reading --------------------------------------------------------------------------

    def _follow(self) -> None:
        """Follow the proxy's log until closed; a replaced proxy's successor is followed."""
        while not self._closed:
            container = self._locate()
            if container is not None:
                try:
                    self._read(container, follow=True)
                except Exception as exc:  # noqa: BLE001 (the reader must end quietly: close() reads again)
                    log.debug("following the egress proxy's log: %s", exc)
            if not self._closed:
                time.sleep(0.5)  # the proxy went away: look for its successor

    def _read(self, container: str, *, follow: bool) -> None:
        since = self._cursor / 1e9 if self._cursor else self._since.timestamp() - 1.0
        stream = self._engine.api.logs(
            container,
            stdout=True,
            stderr=False,
            stream=True,
            follow=follow,
            timestamps=True,
            since=max(since, 1.0),
        )
        with self._lock:
            if self._closed and follow:
                stream.close()
                return
            if follow:
                self._stream = stream
        pending = b""
        try:
            for chunk in stream:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._take(line)
                if len(pending) > _LINE_LIMIT:
                    pending = b""
            if pending:
                self._take(pending)
        finally:
            stream.close()

    def _take(self, raw: bytes) -> None:
        """One log line (docker's timestamp, a space, the proxy's line)."""
        if len(raw) > _LINE_LIMIT:
            return
        stamp, _, line = raw.decode(errors="replace").partition(" ")
        moment = _nanos(stamp)
        with self._lock:
            if moment is not None:
                if moment < self._cursor or (moment == self._cursor and line in self._at_cursor):
                    return  # read already
                if moment > self._cursor:
                    self._cursor, self._at_cursor = moment, set()
                self._at_cursor.add(line)
            for decision in parse_decisions(line):
                if self._mine(decision.client) and decision.time >= self._since:
                    self._keep(decision, len(line) + 1)
            for flood in parse_floods(line):
                if self._mine(flood.client) and flood.time >= self._since:
                    self._unlisted[False] += flood.denied
                    self._unlisted[True] += flood.allowed
                    self._unlisted_bytes += flood.size
                    self._flooding = not flood.ended
                    self._flood_seen = time.monotonic()

    def _keep(self, decision: Decision, size: int) -> None:
        limit = RUN_ALLOWED if decision.allowed else RUN_DENIED
        if self._counts[decision.allowed] < limit:
            self._counts[decision.allowed] += 1
            self._kept.append(decision)
            return
        self._unlisted[decision.allowed] += 1
        self._unlisted_bytes += size

    def _mine(self, client: str) -> bool:
        try:
            address = ipaddress.IPv4Address(client)
        except ValueError:
            return False
        return any(address in subnet for subnet in self._subnets)

    # -- the end --------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop following (the run's network is going); nothing is read any more."""
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def close(self) -> EgressLog:
        """Stop following, read what came after the last line seen, and return the run's
        decisions. Raises the engine's errors of that last read."""
        self.stop()  # ends the thread's read at once
        if self._thread is not None:
            self._thread.join(timeout=5)
        deadline = time.monotonic() + _FLOOD_SETTLE
        while True:
            container = self._locate()
            if container is not None:
                with (
                    engine_errors("reading the egress proxy's decisions"),
                    contextlib.suppress(docker_errors.NotFound),  # removed meanwhile
                ):
                    self._read(container, follow=False)
            settled = not self._flood_seen or (
                not self._flooding and time.monotonic() - self._flood_seen >= _FLOOD_QUIET
            )
            if container is None or settled or time.monotonic() > deadline:
                return self.result()
            time.sleep(0.5)  # the proxy has not reported the end of the run's flood yet

    def result(self) -> EgressLog:
        with self._lock:
            return EgressLog(
                decisions=[EgressDecision(d.host, d.port, d.allowed, d.method) for d in self._kept],
                unlisted_denied=self._unlisted[False],
                unlisted_allowed=self._unlisted[True],
                unlisted_bytes=self._unlisted_bytes,
            )
