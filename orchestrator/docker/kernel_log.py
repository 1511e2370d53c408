"""The kernel's own record of memory-cgroup OOM kills, for when the engine loses its event.

containerd learns of an OOM through the container's memory cgroup and drops the event when
the cgroup is already gone by the time it looks, which happens under load (measured here: 2
of 30 gVisor sandboxes killed at their limit at once, no ``oom`` event ever). The kernel
logs every such kill with the memory cgroup's path, which names the container's full id
(``oom_memcg=/docker/<id>``, ``.../docker-<id>.scope``, ``.../libpod-<id>``). Reading that
log needs a local engine and the right to read ``/dev/kmsg`` (root, or ``dmesg_restrict``
off); without either, :func:`oom_kill_logged` says it cannot tell.
"""

from __future__ import annotations

import errno
import os

KMSG = "/dev/kmsg"

#: How much of the log is read at most (the ring buffer is usually 128 KiB to a few MiB).
_MAX_RECORDS = 200_000


def oom_kill_logged(container_id: str, path: str = KMSG) -> bool | None:
    """Whether the kernel log holds an OOM kill in this container's memory cgroup.

    None when the log cannot be read. The id must be the engine's full id: a prefix could
    match another container's.
    """
    if len(container_id) < 32 or not all(c in "0123456789abcdef" for c in container_id):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _scan(fd, container_id.encode())
    finally:
        os.close(fd)


def _scan(fd: int, wanted: bytes) -> bool | None:
    # /dev/kmsg gives one record per read ("prio,seq,usec,flags;message\n" and continuation
    # lines); a plain file (as in the tests) gives many, possibly cut mid-line.
    rest = b""
    for _ in range(_MAX_RECORDS):
        try:
            chunk = os.read(fd, 8192)
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # overwritten while reading: go on with the next
                continue
            if exc.errno == errno.EAGAIN:  # read to the end
                break
            return None
        if not chunk:
            break
        *lines, rest = (rest + chunk).split(b"\n")
        if any(_is_oom_kill_of(line, wanted) for line in lines):
            return True
    return _is_oom_kill_of(rest, wanted)


def _is_oom_kill_of(line: bytes, wanted: bytes) -> bool:
    message = line.partition(b";")[2]
    if not message.startswith(b"oom-kill:"):
        return False
    for field in message.split(b","):
        key, _, value = field.partition(b"=")
        if key in (b"oom_memcg", b"task_memcg") and wanted in value:
            return True
    return False
