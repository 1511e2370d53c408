"""An image's own CA bundle, read once per image: the worker's bundle starts from it.

A run with egress credentials gets a CA bundle of the image's own certificates plus its run's
CA (:mod:`orchestrator.runtime.credproxy`). The image's bundle is read from a container
created, never started, and removed; then kept by image id (an image's files never change)
by :class:`CaBundles`, in memory and in the user's cache folder for the next process.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tarfile
import tempfile
from pathlib import Path

from docker import errors as docker_errors

from orchestrator.credproxy import WORKER_BUNDLE
from orchestrator.docker.cache import user_cache
from orchestrator.docker.client import DockerClient, engine_errors, retrying
from orchestrator.errors import ImageMissing
from orchestrator.labels import PREFIX

__all__ = ["CaBundles"]

#: The largest CA bundle read from an image.
_MAX_BUNDLE = 4 << 20
#: The role label of the container a bundle is read from.
_ROLE_LABEL = f"{PREFIX}.role"


class CaBundles:
    """Images' CA bundles already read, by image id (one per process: the engine's)."""

    def __init__(self) -> None:
        self._read: dict[str, bytes] = {}

    def clear(self) -> None:
        """Forget what was read (as a new process would; the user's cache stays)."""
        self._read.clear()

    def read(self, engine: DockerClient, image: str) -> bytes:
        """The system CA bundle inside ``image`` (empty when it has none)."""
        with engine_errors(f"inspecting image {image}"):
            try:
                image_id = str(engine.api.inspect_image(image)["Id"])  # type: ignore[no-untyped-call]
            except docker_errors.ImageNotFound:
                raise ImageMissing(image) from None
        if image_id in self._read:
            return self._read[image_id]
        cached = _cached_bundle(image_id)
        if cached is not None:
            self._read[image_id] = cached
            return cached
        with engine_errors(f"reading the CA bundle of {image}"):
            created = engine.api.create_container(
                image_id,
                command=["/nonexistent"],
                labels=engine.labels_for({_ROLE_LABEL: "ca-reader"}),
                network_disabled=True,
                host_config=engine.api.create_host_config(network_mode="none"),
            )
            try:
                try:
                    stream, _ = engine.api.get_archive(created["Id"], WORKER_BUNDLE)
                    raw = b"".join(stream)
                except docker_errors.NotFound:
                    raw = b""
            finally:
                retrying(lambda: engine.api.remove_container(created["Id"], force=True))
        bundle = _member(raw)
        self._read[image_id] = bundle
        _cache_bundle(image_id, bundle)
        return bundle


def _cache_file(image_id: str) -> Path | None:
    """The cache file of an image id (a content hash: its files never change), in a folder
    only this user may write; None when there is no such folder."""
    digest = image_id.removeprefix("sha256:")
    if not digest.isalnum():
        return None
    folder = user_cache("ca-bundles")
    return None if folder is None else folder / f"{digest}.pem"


def _cached_bundle(image_id: str) -> bytes | None:
    """A bundle read by an earlier process (a regular file of this user), else None."""
    path = _cache_file(image_id)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return None
        return handle.read(_MAX_BUNDLE + 1)[:_MAX_BUNDLE]


def _cache_bundle(image_id: str, bundle: bytes) -> None:
    """Keep a bundle for the next process (best effort: written whole, then renamed)."""
    path = _cache_file(image_id)
    if path is None:
        return
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".bundle-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(bundle)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _member(archive: bytes) -> bytes:
    """The one regular file in a ``get_archive`` tar stream (a link: its target is not
    followed; empty)."""
    if not archive:
        return b""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar:
            if member.isfile() and member.size <= _MAX_BUNDLE:
                handle = tar.extractfile(member)
                return handle.read() if handle is not None else b""
    return b""
