"""Files in and out of a sandbox by exec, as the worker's own uid (shared by the Inspect
provider and the Harbor environment).

The harnesses' file contract is the sandbox user's view of the whole container: any path
the worker can write (``/tmp``, a zone, ``/var/tmp``, Harbor's ``/logs``), a file the
worker made read-only raising ``PermissionError``. The host-side file API acts with the
host's authority on zones only (it replaces files by rename, whatever their mode), so
every transfer goes through a fixed script run by exec instead: the path is its one
argument (``"$1"``, never spliced into shell text), the content travels on stdin or
stdout (a folder as a tar stream), the script's tools come from the system folders, and
the bytes are counted on the host against a cap as they arrive.

Pure: the scripts, the capture of an exec's output and the mapping of the scripts'
failures to Python's exceptions.
"""

from __future__ import annotations

import errno

__all__ = ["READ", "TAR", "UNTAR", "WRITE", "Capture", "TooMuch", "failure"]

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

#: Unpacks the tar stream on stdin into folder "$1", making it; owners are not restored
#: (everything belongs to the worker), modes are.
UNTAR = _PATH + 'mkdir -p -- "$1" && exec tar -x --no-same-owner -C "$1" -f -'
#: Packs folder "$1" as a tar stream on stdout (its contents, not the folder itself).
TAR = (
    _PATH + 'if [ ! -d "$1" ]; then printf "%s: Not a directory\\n" "$1" >&2; exit 1; fi; '
    'exec tar -c -C "$1" -f - .'
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


class TooMuch(Exception):
    """A stream went over its cap (raised from the output callback: the command is killed)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.stream = stream


class Capture:
    """Both streams of one exec, in full up to a cap each (its ``add`` is the exec's
    output callback)."""

    def __init__(self, stdout_cap: int, stderr_cap: int) -> None:
        self.caps = {"stdout": stdout_cap, "stderr": stderr_cap}
        self.data = {"stdout": bytearray(), "stderr": bytearray()}

    def add(self, stream: str, chunk: bytes) -> None:
        buffer = self.data[stream]
        room = self.caps[stream] - len(buffer)
        buffer += chunk[: max(room, 0)]
        if len(chunk) > room:
            raise TooMuch(stream)

    def text(self, stream: str) -> str:
        return self.data[stream].decode("utf-8", errors="replace")
