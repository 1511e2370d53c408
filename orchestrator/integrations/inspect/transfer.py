"""Files in and out of a sandbox by exec, as the worker's own uid.

Inspect's file contract is the sandbox user's view of the whole container: any path the
worker can write (``/tmp``, a zone, ``/var/tmp``), a file the worker made read-only raising
``PermissionError``. The host-side file API acts with the host's authority on zones only
(it replaces files by rename, whatever their mode), so every transfer goes through a fixed
script run by exec instead: the path is its one argument (``"$1"``, never spliced into
shell text), the content travels on stdin or stdout, the script's tools come from the
system folders, and the bytes are counted on the host against a cap as they arrive.

Pure: the scripts and the mapping of their failures to Python's exceptions.
"""

from __future__ import annotations

import errno

__all__ = ["READ", "WRITE", "failure"]

_PATH = "PATH=/usr/sbin:/usr/bin:/sbin:/bin; export PATH; "
#: Writes stdin to "$1", making missing folders; a folder there is refused.
WRITE = (
    _PATH + 'if [ -d "$1" ]; then printf "%s: Is a directory\\n" "$1" >&2; exit 1; fi; '
    'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
)
#: Prints "$1"; a folder or a FIFO (which would never end) is refused.
READ = (
    _PATH + 'if [ -d "$1" ]; then printf "%s: Is a directory\\n" "$1" >&2; exit 1; fi; '
    'if [ -p "$1" ]; then printf "%s: Is a FIFO\\n" "$1" >&2; exit 1; fi; '
    'exec cat -- "$1"'
)

#: The tools' words for a failure (C locale), and the exception each stands for.
_MEANINGS: tuple[tuple[str, type[OSError], int], ...] = (
    ("Is a directory", IsADirectoryError, errno.EISDIR),
    ("No such file or directory", FileNotFoundError, errno.ENOENT),
    ("Permission denied", PermissionError, errno.EACCES),
    ("Read-only file system", PermissionError, errno.EROFS),
    ("Operation not permitted", PermissionError, errno.EPERM),
    ("Not a directory", NotADirectoryError, errno.ENOTDIR),
    ("No space left on device", OSError, errno.ENOSPC),
    ("File exists", FileExistsError, errno.EEXIST),
)


def failure(path: str, stderr: str, doing: str) -> OSError:
    """The exception for a transfer script that failed with ``stderr``; it names
    ``path`` (Inspect shows the message to the model)."""
    for words, kind, number in _MEANINGS:
        if words in stderr:
            return kind(number, words, path)
    said = stderr.strip().splitlines()[-1:] or ["no message"]
    return OSError(errno.EIO, f"{doing} failed: {said[0]}", path)
