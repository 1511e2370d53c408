"""A single-use warm pool: runs of one plan opened ahead of need, each handed out once.

A :class:`WarmPool` (made by :meth:`orchestrator.Orchestrator.pool`) keeps ``size`` runs of
one worker opened in background threads: each has its own run id, session and folders, its
network (for an allowlist, the run's own internal network with the egress proxy already
attached, so that cost leaves the critical path), and its container created and started,
idling (a keep-alive container: the worker's command runs by exec when it is wanted).
:meth:`WarmPool.take` hands one out, exactly once, and starts opening its replacement; the
caller runs it (``run_worker``, ``collect``, ``close``) like any other :class:`Run`, or
:meth:`WarmPool.open_session` hands it out as a session. A pooled container is never
reused: after use it is removed, like every run's.

Audit: a pooled run records ``run.started`` when it is opened (that is when its container
exists); one that is never handed out records ``run.ended`` with status ``unused`` when the
pool closes, so every start has its end. Everything a pool creates carries its owner's
labels: :meth:`WarmPool.close`, leaving its ``with`` block and a normal exit of the program
remove what was never handed out, and ``orchestrator gc`` removes what a SIGKILLed owner
left.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from orchestrator.config import Worker
from orchestrator.errors import OrchestratorError
from orchestrator.prepare import Prepared
from orchestrator.runtime.run import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_LIFETIME, OutputSink, Run

if TYPE_CHECKING:
    from orchestrator.runtime.session import Session

log = logging.getLogger(__name__)

__all__ = ["PoolError", "PoolOwner", "WarmPool"]

#: How long :meth:`WarmPool.take` waits for an opened run, unless told otherwise (seconds).
DEFAULT_TAKE_TIMEOUT = 120.0
#: How long closing waits for runs still being opened, to remove them too (seconds).
CLOSE_WAIT = 60.0

_OPEN_POOLS: weakref.WeakSet[WarmPool] = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_OPEN_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


class Preparer(Protocol):
    """Prepares runs of a worker (an :class:`~orchestrator.Orchestrator` does)."""

    def prepare(
        self,
        worker: str | Worker,
        *,
        inputs: Sequence[str | os.PathLike[str]] = ...,
        env: Mapping[str, str] | None = ...,
        args: Sequence[str] = ...,
        **options: Any,
    ) -> Prepared: ...


class PoolOwner(Preparer, Protocol):
    """What a pool needs of its owner: prepare a run, open it idling, and hand one out as
    a session."""

    def open_keep_alive(
        self, prepared: Prepared, *, keep_alive: bool = ..., gc: bool = ..., output: bool = ...
    ) -> Run: ...

    def open_session(
        self,
        worker: str | Worker | Prepared | Run,
        *,
        idle_timeout: float | None = ...,
        max_lifetime: float | None = ...,
        **options: Any,
    ) -> Session: ...


class PoolError(OrchestratorError):
    """The pool cannot hand out a run: closed, or none ready in time."""


class WarmPool:
    """``size`` opened runs of one worker, each handed out once. Close it after use."""

    def __init__(
        self,
        orchestrator: PoolOwner,
        worker: str | Worker,
        *,
        size: int,
        total: int | None = None,
        keep_alive: bool = True,
        gc: bool = True,
        output: bool = True,
        tailor: Callable[[Prepared], Prepared] | None = None,
        **options: Any,
    ) -> None:
        """``total``: how many runs will be taken, if known (a batch's inputs): no more are
        opened ahead than are still wanted, so none is made only to be discarded (a take
        beyond it still gets one, opened then). ``keep_alive``, ``gc`` and ``output`` are
        :meth:`~orchestrator.Orchestrator.open_keep_alive`'s; ``tailor`` changes each
        prepared run before it opens; ``options`` are ``prepare``'s."""
        if size < 1:
            raise PoolError(f"a warm pool holds at least one run, not {size}; use size=1 or more")
        if options.get("session_id"):
            raise PoolError(
                "a warm pool cannot serve an explicit session id (each pooled run gets a fresh "
                "session); run that worker without the pool"
            )
        self.orchestrator = orchestrator
        self.size = size
        self.options = options
        self.wanted = total
        self.run_options = {"keep_alive": keep_alive, "gc": gc, "output": output}
        self.tailor = tailor
        first = self._prepare(worker)  # refused here, before any thread
        self.worker: Worker = first.worker
        self._cond = threading.Condition()
        self._ready: deque[Run] = deque()
        self._opening = 0
        self._threads: set[threading.Thread] = set()
        self._error: BaseException | None = None
        self._closed = False
        self.handed_out = 0
        _OPEN_POOLS.add(self)
        with self._cond:
            self._fill(first)

    # -- handing out ----------------------------------------------------------------------

    def take(
        self, *, timeout: float | None = DEFAULT_TAKE_TIMEOUT, on_output: OutputSink | None = None
    ) -> Run:
        """One opened run, handed out once (waits up to ``timeout`` seconds for one).

        The caller owns it from here: run its worker (``run_worker``), ``collect`` and
        ``close`` it on every path. A replacement starts opening in the background.
        ``on_output(stream, chunk)`` receives the worker's output live (secrets redacted).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise PoolError(f"the warm pool of '{self.worker.name}' is closed")
                if self._ready:
                    run = self._ready.popleft()
                    break
                if self.wanted is not None and self._opening == 0 and self._error is None:
                    self.wanted += 1  # more takes than announced (a retry): open one now
                    self._fill()
                if self._error is not None and self._opening == 0:
                    error, self._error = self._error, None
                    self._fill()  # the next take tries again
                    raise error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise PoolError(
                        f"no pooled run of '{self.worker.name}' was ready within {timeout:g} s; "
                        "give take() a longer timeout or the pool a larger size"
                    )
                self._cond.wait(remaining)
            self.handed_out += 1
            if self.wanted is not None:
                self.wanted = max(0, self.wanted - 1)
            self._fill()
        run.on_output = on_output
        run.handed_out()
        return run

    def open_session(
        self,
        *,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_lifetime: float | None = DEFAULT_MAX_LIFETIME,
        timeout: float | None = DEFAULT_TAKE_TIMEOUT,
    ) -> Session:
        """A pooled run handed out as a live session (see
        :meth:`orchestrator.Orchestrator.open_session`; its limits count from now)."""
        if not self.run_options["keep_alive"]:
            raise PoolError("this warm pool's runs are not kept alive: open it with keep_alive")
        run = self.take(timeout=timeout)
        return self.orchestrator.open_session(
            run, idle_timeout=idle_timeout, max_lifetime=max_lifetime
        )

    @property
    def ready(self) -> int:
        """How many opened runs wait to be handed out now."""
        with self._cond:
            return len(self._ready)

    def wait_ready(self, timeout: float | None = DEFAULT_TAKE_TIMEOUT) -> bool:
        """Wait until the pool is full (``size`` runs ready); False on timeout or failure."""
        with self._cond:
            return (
                self._cond.wait_for(
                    lambda: (
                        len(self._ready) >= self.size or self._closed or self._error is not None
                    ),
                    timeout,
                )
                and len(self._ready) >= self.size
            )

    # -- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop refilling and remove every run never handed out (recorded as ``unused``).
        Runs still being opened are waited for and removed too. Idempotent."""
        with self._cond:
            self._closed = True
            unused = list(self._ready)
            self._ready.clear()
            threads = list(self._threads)
            self._cond.notify_all()
        _OPEN_POOLS.discard(self)
        for run in unused:
            _discard(run)
        deadline = time.monotonic() + CLOSE_WAIT
        for thread in threads:  # an opener that finishes now discards its own run
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- refilling (background) -----------------------------------------------------------

    def _prepare(self, worker: str | Worker) -> Prepared:
        prepared = self.orchestrator.prepare(worker, **self.options)
        return prepared if self.tailor is None else self.tailor(prepared)

    def _fill(self, first: Prepared | None = None) -> None:
        """Start openers until ``size`` runs are ready or being opened (lock held)."""
        while not self._closed and self._error is None:
            target = self.size if self.wanted is None else min(self.size, self.wanted)
            if len(self._ready) + self._opening >= target:
                return
            self._opening += 1
            thread = threading.Thread(
                target=self._open_one,
                args=(first,),
                name=f"pool-{self.worker.name}",
                daemon=True,
            )
            first = None
            self._threads.add(thread)
            thread.start()

    def _open_one(self, prepared: Prepared | None) -> None:
        run: Run | None = None
        error: BaseException | None = None
        try:
            if prepared is None:
                prepared = self._prepare(self.worker)
            run = self.orchestrator.open_keep_alive(prepared, **self.run_options)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the next take()
            error = exc
        with self._cond:
            self._opening -= 1
            self._threads.discard(threading.current_thread())
            if error is not None:
                log.warning(
                    "the warm pool of '%s' could not open a run: %s", self.worker.name, error
                )
                self._error = error
            elif self._closed:
                pass  # discarded below, outside the lock
            else:
                assert run is not None
                self._ready.append(run)
                run = None
            self._cond.notify_all()
        if run is not None:
            _discard(run)


def _discard(run: Run) -> None:
    try:
        run.discard()
    except (OrchestratorError, OSError) as exc:  # gc removes it later (owner labels)
        log.warning("could not remove the unused pooled run %s: %s", run.spec.run_id, exc)
