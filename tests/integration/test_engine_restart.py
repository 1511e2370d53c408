"""An engine that goes away for ~2 s mid-run: the container must still be removed, no gc.

The real daemon is shared and must never be restarted by a test, so the run talks to it
through a small unix-socket forwarder written here: the test closes it (dropping every
open connection and removing the socket, as a restarting dockerd does) one second after
the container starts, and reopens it two seconds later.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from orchestrator import labels
from tests.integration.conftest import cli

pytestmark = pytest.mark.docker

DOCKER_SOCKET = "/var/run/docker.sock"


class Forwarder:
    """Forwards a unix socket to the engine's; :meth:`outage` makes it vanish for a while."""

    def __init__(self, path: Path, *, target: str = DOCKER_SOCKET) -> None:
        self.path, self.target = path, target
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.trigger: bytes | None = None
        self.outages: list[float] = []
        self.closed = False

    def open(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(64)
        with self.lock:
            self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down_after(self, marker: bytes, delay: float, length: float) -> None:
        """Go down ``delay`` s after a request containing ``marker``, for ``length`` s."""
        self.trigger, self.delay, self.length = marker, delay, length

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for src, dst, watch in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, watch), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, watch: bool) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                break
            if not data:
                break
            if watch and self.trigger is not None and self.trigger in data:
                self.trigger = None
                threading.Timer(self.delay, self.outage, args=(self.length,)).start()
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            _close(sock)

    def outage(self, length: float) -> None:
        self.outages.append(time.monotonic())
        self._drop()
        time.sleep(length)
        if not self.closed:
            self.open()

    def _drop(self) -> None:
        with self.lock:
            listener, self.listener = self.listener, None
            sockets, self.sockets = self.sockets, []
        if listener is not None:
            _close(listener)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        for sock in sockets:
            _close(sock)

    def close(self) -> None:
        self.closed = True
        self._drop()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@pytest.fixture
def forwarder(tmp_path):
    folder = tmp_path / "engine"
    folder.mkdir()
    fwd = Forwarder(folder / "docker.sock")
    fwd.open()
    yield fwd
    fwd.close()


def test_container_is_removed_when_the_engine_comes_back(engine, project, forwarder):
    script = "import time; print('started', flush=True); time.sleep(60)"
    project.worker("w", f"command: {json.dumps(['python3', '-c', script])}")
    forwarder.down_after(b"/start", delay=1.0, length=2.0)
    result = cli(
        "run", "w", "--project", str(project.root),
        env={"DOCKER_HOST": f"unix://{forwarder.path}"},
        timeout=90,
    )  # fmt: skip
    assert len(forwarder.outages) == 1, "the engine never went away: the test proved nothing"
    run_id = re.search(r"run ([0-9a-f]{12}):", result.stderr)
    assert run_id, result.stderr
    left = [
        o
        for o in engine.list_managed()
        if o.kind == "container" and o.labels.get(labels.RUN_ID) == run_id.group(1)
    ]
    for obj in left:  # clean up whatever the assertion below complains about
        engine.remove_object(obj)
    assert not left, f"the container outlived the run: {result.stderr}"
    assert result.returncode == 125, result.stderr
    assert "connection to the Docker engine lost" in result.stderr, result.stderr
    assert "stopped answering while removing container" in result.stderr
    assert "left behind" not in result.stderr
