"""The connection to the Docker engine, and the one place SDK errors become ours.

Everything under ``orchestrator.docker`` talks to the engine through
:class:`DockerClient` (``.api`` is the SDK's low-level client) and wraps each request in
:func:`engine_errors`; transient failures are retried a bounded number of times.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import docker
import docker.utils
import requests
from docker import errors as docker_errors

from orchestrator import labels
from orchestrator.errors import EngineError, EngineUnreachable

#: The oldest engine API with everything the plan uses (Docker 20.10).
DEFAULT_API_VERSION = "1.41"
T = TypeVar("T")


def api_version() -> str:
    """The engine API version to ask for: ``DOCKER_API_VERSION``, else the default. Read at
    each use, not at import: a forked command (``orchestrator serve``) has its own env."""
    return os.environ.get("DOCKER_API_VERSION", DEFAULT_API_VERSION)


_TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
#: Engine answers with a 5xx status that are the request's own fault, never worth a retry.
_PERMANENT_5XX = ("executable file not found", "no such file or directory", "permission denied",
                  "oci runtime", "invalid", "not a directory", "is a directory")  # fmt: skip


def _is_unreachable(exc: BaseException) -> bool:
    """True for 'nobody listens' (refused, socket missing), as opposed to a dropped request."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError | FileNotFoundError):
            return True
        for arg in current.args:
            if isinstance(arg, BaseException) and _is_unreachable(arg):
                return True
        current = current.__cause__ or current.__context__
    text = str(exc)
    return "Connection refused" in text or "No such file or directory" in text


def is_transient(exc: BaseException) -> bool:
    """Errors worth another attempt: dropped connections and the engine's own 5xx hiccups."""
    if isinstance(
        exc, requests.exceptions.ConnectionError | requests.exceptions.ChunkedEncodingError
    ):
        return not _is_unreachable(exc)
    if isinstance(exc, docker_errors.APIError) and exc.status_code in _TRANSIENT_STATUS:
        explanation = str(exc.explanation or "").lower()
        return not any(marker in explanation for marker in _PERMANENT_5XX)
    return False


#: A transient engine error is retried: at most this many attempts in all, none started
#: once this many seconds have passed since the first began, waiting 0.1 s, then twice as
#: long before each next one (at most 1 s).
RETRY_ATTEMPTS = 3
RETRY_FOR_S = 10.0


def retrying(func: Callable[[], T]) -> T:
    """Call ``func``, retrying transient engine errors for at most 3 attempts / 10 s; the
    last error is raised as it was. The retry library is imported only once a first
    attempt failed: its import (asyncio) cost every command's start more than the
    command's own work (docs/performance.md)."""
    started = time.monotonic()
    try:
        return func()
    except Exception as exc:
        left = RETRY_FOR_S - (time.monotonic() - started)
        if not is_transient(exc) or left <= 0:
            raise
    from tenacity import (
        retry,
        retry_if_exception,
        stop_after_attempt,
        stop_after_delay,
        wait_exponential,
    )

    time.sleep(0.1)
    return retry(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(RETRY_ATTEMPTS - 1) | stop_after_delay(left),
        wait=wait_exponential(multiplier=0.2, max=1.0),
        reraise=True,
    )(func)()


@contextmanager
def engine_errors(action: str) -> Iterator[None]:
    """Translate SDK and transport errors raised while doing ``action``."""
    try:
        yield
    except (EngineError, KeyboardInterrupt):
        raise
    except requests.exceptions.ConnectionError as exc:
        if _is_unreachable(exc):
            raise EngineUnreachable(
                f"Docker engine unreachable while {action}: start it (e.g. `sudo systemctl "
                "start docker` or `sudo dockerd &`) or point DOCKER_HOST at it"
            ) from None
        raise EngineError(f"connection to the Docker engine lost while {action}: {exc}") from None
    except requests.exceptions.ChunkedEncodingError as exc:  # the engine went away mid-reply
        raise EngineError(
            f"connection to the Docker engine lost while {action} (did it restart?): {exc}"
        ) from None
    except docker_errors.APIError as exc:
        detail = exc.explanation or str(exc)
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        raise EngineError(f"Docker refused {action}: {detail}") from None
    except (docker_errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EngineError(f"Docker error while {action}: {exc}") from None


class DockerClient:
    """The SDK's low-level client, the owner labels, and the probes every part needs."""

    def __init__(self, client: docker.APIClient | None = None) -> None:
        if client is None:
            with engine_errors("connecting"):
                params = docker.utils.kwargs_from_env()
                client = docker.APIClient(version=api_version(), timeout=120, **params)
        self.api = client
        self._owner_labels = labels.current_owner().labels()

    # -- probes ---------------------------------------------------------------------------

    def ping(self) -> None:
        with engine_errors("checking the engine"):
            self.api.ping()

    def image_exists(self, image: str) -> bool:
        with engine_errors(f"looking up image '{image}'"):
            try:
                self.api.inspect_image(image)  # type: ignore[no-untyped-call]
            except docker_errors.ImageNotFound:
                return False
            except docker_errors.NotFound:
                return False
        return True

    def labels_for(self, extra: dict[str, str]) -> dict[str, str]:
        """The labels every created object carries: the plan's plus the owner's, and every
        other label ``gc`` reads set to its neutral value (an image's never stands)."""
        return labels.explicit({**extra, **self._owner_labels})


def wait_exit(
    api: docker.APIClient, container: str, timeout: float | None, action: str
) -> dict[str, Any] | None:
    """The engine's answer to waiting for ``container`` to exit (its ``StatusCode`` and
    ``Error``), or None when ``timeout`` seconds pass first (the engine's own read timeout
    can surface as either exception, depending on where it hits)."""
    with engine_errors(action):
        try:
            return dict(api.wait(container, timeout=timeout))  # type: ignore[arg-type]
        except requests.exceptions.ReadTimeout:
            return None
        except requests.exceptions.ConnectionError as exc:
            if "timed out" in str(exc).lower():
                return None
            raise
