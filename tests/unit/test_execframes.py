"""An exec's frames read from a hijacked connection shaped as the Docker SDK hands it out:
the raw socket file under an HTTP response that has already read its headers (issue 28)."""

from __future__ import annotations

import http.client
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from orchestrator.docker import execframes
from orchestrator.docker.execframes import frames_until_stopped, read_ahead

HEADERS = (
    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


@contextmanager
def hijacked(sent: bytes, *, close: bool = True) -> Iterator[tuple[Any, socket.socket]]:
    """``sent`` from the engine's side in one write; the client's end as the SDK returns it
    (``response.raw._fp.fp.raw``, the response kept on it), after the headers were read."""
    client, server = socket.socketpair()
    client.settimeout(60)  # as the SDK's client sockets have one
    server.sendall(sent)
    if close:
        server.shutdown(socket.SHUT_WR)
    response = http.client.HTTPResponse(client)
    try:
        response.begin()
        assert response.status == 101
        sock = response.fp.raw
        sock._response = SimpleNamespace(raw=SimpleNamespace(_fp=response))
        yield sock, server
    finally:
        response.close()
        client.close()
        server.close()


def test_output_that_came_with_the_headers_is_kept() -> None:
    body = frame(2, b"orchestrator-exec-pid=7\n") + frame(1, b"the file's bytes\n")
    with hijacked(HEADERS + body) as (sock, _):
        # the cause: the response's buffer holds the whole output; the socket has none left
        ahead = read_ahead(sock)
        assert ahead == body
        assert list(frames_until_stopped(sock, None, ahead)) == [
            ("stderr", b"orchestrator-exec-pid=7\n"),
            ("stdout", b"the file's bytes\n"),
        ]


def test_without_the_read_ahead_the_output_is_lost() -> None:
    """What execs did before: the socket alone ends at once, with nothing."""
    with hijacked(HEADERS + frame(1, b"lost\n")) as (sock, _):
        assert list(frames_until_stopped(sock, None)) == []


def test_a_frame_split_between_the_buffer_and_the_socket_is_joined() -> None:
    data = bytes(range(256)) * 200  # 51,200 bytes: more than the response's buffer holds
    with hijacked(HEADERS + frame(1, data) + frame(2, b"end\n")) as (sock, _):
        ahead = read_ahead(sock)
        assert 0 < len(ahead) < len(data)
        assert list(frames_until_stopped(sock, None, ahead)) == [
            ("stdout", data),
            ("stderr", b"end\n"),
        ]


def test_nothing_read_ahead_never_waits_and_leaves_the_socket_as_it_was() -> None:
    with hijacked(HEADERS, close=False) as (sock, server):
        assert read_ahead(sock) == b""  # returns at once: nothing has come yet
        assert sock._sock.gettimeout() == 60
        server.sendall(frame(1, b"later\n"))
        server.shutdown(socket.SHUT_WR)
        assert list(frames_until_stopped(sock, None)) == [("stdout", b"later\n")]


def test_a_socket_of_another_response_is_not_read() -> None:
    with hijacked(HEADERS + frame(1, b"x")) as (sock, _), hijacked(HEADERS) as (other, _):
        other._response = sock._response
        assert read_ahead(other) == b""
        assert read_ahead(sock) == frame(1, b"x")


def test_a_stopped_container_ends_the_frames_of_a_stream_left_open(monkeypatch) -> None:
    monkeypatch.setattr(execframes, "POLL_S", 0.01)
    with hijacked(HEADERS + frame(1, b"partial"), close=False) as (sock, _):
        ahead = read_ahead(sock)
        assert list(frames_until_stopped(sock, lambda: False, ahead)) == [("stdout", b"partial")]
