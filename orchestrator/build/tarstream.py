"""The tar a ``COPY`` or ``ADD`` puts into a step's container: counted first, then streamed.

What a member adds to the layer is :func:`added`: its apparent size (a sparse file's holes
count, as its copy in the layer has them all), a symbolic link's target, and
:data:`~orchestrator.build.engine.ENTRY_BYTES` for the entry itself, whatever its kind: a
thousand empty files count as the disk pays for them. The builder adds up the members a
step would write before writing any (:func:`count`: an archive's headers are read, never
its data, and the count stops as soon as it passes the limit), so a step past its limit
writes nothing.

Then :func:`stream` makes the tar chunk by chunk as the engine reads it: nothing is staged
on the host (no temporary file), and no member may bring more than it was counted for (a
file that changed in between is refused, naming it).
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO

from orchestrator.build.engine import ENTRY_BYTES

__all__ = ["Member", "added", "chunks_of", "count", "stream"]

#: A member and its content (None: a folder, a link).
Member = tuple[tarfile.TarInfo, Iterable[bytes] | None]
_CHUNK = 1 << 20


def added(info: tarfile.TarInfo) -> int:
    """The bytes ``info`` adds to a layer (see the module's docstring)."""
    if info.isreg():
        return ENTRY_BYTES + info.size
    if info.issym():
        return ENTRY_BYTES + len(info.linkname.encode("utf-8", "surrogateescape"))
    return ENTRY_BYTES


def count(members: Iterable[tarfile.TarInfo], limit: int) -> int:
    """The bytes the members add, counted until past ``limit`` (then the bytes so far,
    more than ``limit``: the rest is never read)."""
    total = 0
    for info in members:
        total += added(info)
        if total > limit:
            break
    return total


def chunks_of(handle: IO[bytes], size: int) -> Iterator[bytes]:
    """``size`` bytes of ``handle`` in chunks (fewer when it ends first)."""
    left = size
    while left > 0:
        data = handle.read(min(_CHUNK, left))
        if not data:
            return
        left -= len(data)
        yield data


def stream(
    members: Iterable[Member], limit: int, refused: Callable[[str], Exception]
) -> Iterator[bytes]:
    """The tar of ``members`` (PAX format), chunk by chunk. Raises ``refused(why)`` when
    a member's content is not its header's size, or when the members add more than
    ``limit`` (what was counted before)."""
    total = 0
    for info, content in members:
        if not info.isreg():
            info.size = 0
        total += added(info)
        if total > limit:
            raise refused(f"{info.name}: more than was counted before it was written")
        yield info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
        if not info.isreg():
            continue
        sent = 0
        for chunk in content or ():
            sent += len(chunk)
            if sent > info.size:
                raise refused(f"{info.name}: grew while it was being copied")
            yield chunk
        if sent != info.size:
            raise refused(f"{info.name}: shrank while it was being copied")
        if info.size % tarfile.BLOCKSIZE:
            yield tarfile.NUL * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)
