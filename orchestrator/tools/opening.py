"""A session opened in the background, so a server can answer its client at once.

``orchestrator mcp`` answers ``initialize`` and ``tools/list`` before its session's
container exists: :class:`Opening` opens the session on a thread of its own, the first tool
call waits for it (:meth:`Opening.wait`), and a failure to open is kept and raised to every
caller as one :class:`OpenFailed` whose message says what went wrong. Whoever made the
opening closes what it opened: :meth:`Opening.settle` waits for the thread and hands over
the session, or None.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError, OrchestratorError

if TYPE_CHECKING:
    from orchestrator.runtime.session import Session

__all__ = ["OpenFailed", "Opening", "describe"]

log = logging.getLogger(__name__)


class OpenFailed(OrchestratorError):
    """The session could not be opened; ``cause`` is why."""

    def __init__(self, reason: str, cause: BaseException) -> None:
        super().__init__(f"the sandbox could not be opened: {reason}")
        self.reason = reason
        self.cause = cause


def describe(error: BaseException) -> str:
    """One line for a failure to open: the orchestrator's own words where it has them."""
    if isinstance(error, ConfigError):
        return "; ".join(error.problems)
    if isinstance(error, OrchestratorError):
        return " ".join(str(error).split("\n"))
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror}"
    return f"{type(error).__name__}: {error}"


class Opening:
    """``open_session()`` running on a thread of its own, started at construction."""

    def __init__(
        self,
        open_session: Callable[[], Session],
        *,
        on_failure: Callable[[OpenFailed], None] | None = None,
    ) -> None:
        self._open = open_session
        self._on_failure = on_failure
        self._done = threading.Event()
        self._session: Session | None = None
        self._failure: OpenFailed | None = None
        self._thread = threading.Thread(target=self._run, name="session-open", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._session = self._open()
        except BaseException as exc:  # every failure is answered to the calls, none raised here
            self._failure = OpenFailed(describe(exc), exc)
            log.debug("opening the session failed", exc_info=exc)
        finally:
            self._done.set()
        if self._failure is not None and self._on_failure is not None:
            self._on_failure(self._failure)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def failure(self) -> OpenFailed | None:
        """Why the session could not be opened (None: opened, or still opening)."""
        return self._failure

    def wait(self, timeout: float | None = None) -> Session:
        """The session once open; :class:`OpenFailed` if it could not be, TimeoutError if
        it is still opening after ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError("the sandbox is still opening")
        if self._failure is not None:
            raise self._failure
        assert self._session is not None
        return self._session

    def settle(self) -> Session | None:
        """Wait until the opening ends; the session it opened (the caller closes it), or None."""
        self._thread.join()
        return self._session
