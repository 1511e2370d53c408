"""The fork server's wire protocol and checks, shared by the client and the server.

Standard library only: :mod:`orchestrator.launcher` (the console entry point) imports it
before anything else. One unix stream connection per command: the server greets with
``orchestrator-server 2 FINGERPRINT\\n``; the client sends an 8-byte big-endian length with
its three descriptors, then that many bytes of request (:func:`encode_request`); meanwhile it
may send one byte per signal to forward; the server ends with ``exit CODE\\n``. Both sides
check the socket's folder and the socket (:func:`check_private`) and the peer's uid. A
client the server will not serve (:mod:`orchestrator.cli.peer`: confined otherwise than the
server) gets ``orchestrator-server 2 refused: REASON\\n`` instead of the greeting, or
``refused REASON\\n`` instead of the exit code; nothing was started, and the client runs
the command itself. The folder also holds the server's lock (:data:`LOCK_NAME`: only its
holder binds the socket) and, after a server started on first use failed, why
(:data:`FAILED_NAME`).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import sys
import zlib

GREETING = "orchestrator-server 2"
#: The longest line either side sends (a refusal names every difference).
LINE_LIMIT = 8192
SOCKET_NAME = "server.sock"
#: Held (flock) by the one server of the folder while it starts and serves.
LOCK_NAME = "server.lock"
#: Why the last server started on first use failed (removed once one serves).
FAILED_NAME = "autostart.failed"
#: Set in a server started on first use that loads at a lowered priority: the one to
#: restore before it serves.
PRIORITY = "ORCHESTRATOR_SERVER_PRIORITY"
#: Signals a client passes on to the command running for it.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HEADER = struct.Struct(">Q")


class Unusable(Exception):
    """Why the server cannot be used for this command (the message says it)."""


class Absent(Unusable):
    """No server listens: no folder, no socket, or a stale one (one may be started)."""


def close_strays(keep: int | None) -> None:
    """Close the descriptors inherited from whoever started this process (0-2 and
    ``keep`` aside): a pipe it holds would keep its reader waiting for the end."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                if os.get_inheritable(fd):
                    os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed by now


def socket_folder() -> str:
    """The per-user private folder: ``$XDG_RUNTIME_DIR/orchestrator``, else
    ``/tmp/orchestrator-UID``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "orchestrator")
    return f"/tmp/orchestrator-{os.getuid()}"


def check_private(path: str, kind: str) -> None:
    """Raise :class:`Unusable` unless ``path`` (not followed if a link) is a ``kind``
    (``folder`` or ``socket``) owned by this user that nobody else may use."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise Absent(f"{path} does not exist") from None
    except OSError as exc:
        raise Unusable(f"{path}: {exc.strerror}") from None
    wanted = stat.S_ISDIR if kind == "folder" else stat.S_ISSOCK
    if stat.S_ISLNK(st.st_mode):
        raise Unusable(f"{path} is a symbolic link, not a {kind}")
    if not wanted(st.st_mode):
        raise Unusable(f"{path} is not a {kind}")
    if st.st_uid != os.getuid():
        raise Unusable(f"{path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o077:
        raise Unusable(
            f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; others may use it "
            f"(want {'0700' if kind == 'folder' else '0600'})"
        )


def socket_path() -> str:
    """The server's socket, once its folder and itself have been checked."""
    folder = socket_folder()
    check_private(folder, "folder")
    path = os.path.join(folder, SOCKET_NAME)
    check_private(path, "socket")
    return path


def fingerprint() -> str:
    """What a server must have been started from: this interpreter, these package files
    (their names, sizes and modification times) and the installed distributions (their
    names and versions, so that upgrading a dependency outdates the server too). Two
    checksums of that listing: it tells an outdated server from a current one, it is no
    security check (same uid on both ends)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package
    lines = [f"{sys.executable}\0{sys.version}\0{root}"]
    for entry in sys.path:
        if os.path.basename(entry) in ("site-packages", "dist-packages"):
            try:
                installed = sorted(n for n in os.listdir(entry) if n.endswith(".dist-info"))
            except OSError:
                continue
            lines.append(f"{entry}\0" + "\0".join(installed))
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".json")):
                st = os.stat(os.path.join(folder, name))
                lines.append(f"{folder}/{name}\0{st.st_size}\0{st.st_mtime_ns}")
    listing = "\n".join(lines).encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(listing):08x}{zlib.adler32(listing):08x}{len(lines):x}"


def encode_request(argv: list[str], cwd: str, env: dict[str, str]) -> bytes:
    """A command as NUL-separated fields (none can hold a NUL): cwd, the number of
    arguments, the arguments, then the environment's ``NAME=value`` entries."""
    fields = [cwd, str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    return b"\0".join(os.fsencode(field) for field in fields)


def decode_request(payload: bytes) -> tuple[list[str], str, dict[str, str]]:
    """(argv, cwd, env) from :func:`encode_request`; ValueError if malformed."""
    try:
        cwd, count, *rest = (os.fsdecode(field) for field in payload.split(b"\0"))
        size = int(count)
    except ValueError:
        raise ValueError("malformed request") from None
    argv, entries = rest[:size], rest[size:]
    if size < 0 or len(argv) != size or not all("=" in entry for entry in entries):
        raise ValueError("malformed request")
    return argv, cwd, dict(entry.split("=", 1) for entry in entries)


def peer_uid_pid(sock: socket.socket) -> tuple[int, int]:
    """The (uid, pid) of the process at the other end of a unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return uid, pid


def read_line(sock: socket.socket, limit: int = LINE_LIMIT) -> str:
    """One ``\\n``-ended line, read byte by byte (nothing after it is consumed)."""
    data = b""
    while not data.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte or len(data) >= limit:
            raise EOFError
        data += byte
    return data[:-1].decode("ascii", "replace")
