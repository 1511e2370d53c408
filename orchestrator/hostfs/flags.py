"""The open flags for host paths a worker may have planted something on.

Never through a link (``O_NOFOLLOW``), never waiting on a FIFO (``O_NONBLOCK``), never
taking a terminal (``O_NOCTTY``), never inherited by a child (``O_CLOEXEC``). A folder is
opened ``O_DIRECTORY`` too, which the kernel checks before opening anything, so a FIFO put
in its place fails with ``ENOTDIR`` instead of being opened.
"""

from __future__ import annotations

import os

__all__ = ["DIR_FLAGS", "FILE_FLAGS"]

#: Opening a folder: never through a link, never blocking.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: Opening a file for reading: never through a link, never waiting on a FIFO.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
