"""The forward file: how the console opens a browser without its token on a command line.

A browser started with the console's address as an argument shows that address, token
included, in ``/proc/PID/cmdline`` to every local user for as long as it runs. The console
writes instead a small HTML page, mode 0600 in a fresh 0700 folder (under
``$XDG_RUNTIME_DIR`` when set, else the system's temporary folder), whose form posts the
token to ``/PREFIX/login``, and has the browser open that file: its path, not the token,
is on the command line; the token is in a POST body, not in an address the browser keeps
in its history. The file goes once the token is spent, and when the console stops.

Nothing here imports the web stack.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
import threading
from pathlib import Path

__all__ = ["ForwardFile"]

_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>orchestrator review</title></head>
<body>
<form method="post" action="{login}">
<input type="hidden" name="token" value="{token}">
<p>Opening the review console... <button type="submit">Open the review console</button></p>
</form>
<script>document.forms[0].submit();</script>
</body>
</html>
"""


def _private_folder(parents: list[str | None]) -> Path:
    """A new folder of a random name, mode 0700, in the first of ``parents`` that takes
    one (None: the system's temporary folder): mkdtemp makes it or fails, so nobody else
    can have put anything in it. Raises the last OSError when none does."""
    failed: OSError | None = None
    for parent in parents:
        try:
            return Path(tempfile.mkdtemp(prefix="orchestrator-review-", dir=parent))
        except OSError as exc:
            failed = exc
    assert failed is not None
    raise failed


class ForwardFile:
    """The forward file of one console start (see the module's docstring); removed by
    :meth:`remove` (idempotent) or on leaving the ``with`` block."""

    def __init__(self, login: str, token: str) -> None:
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        parents = [runtime] if os.path.isabs(runtime) and os.path.isdir(runtime) else []
        self.folder = _private_folder([*parents, None])
        self.path = self.folder / "open.html"
        self._lock = threading.Lock()
        self._removed = False
        page = _PAGE.format(login=html.escape(login), token=html.escape(token)).encode()
        try:
            fd = os.open(
                self.path,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            with os.fdopen(fd, "wb") as handle:
                handle.write(page)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @property
    def uri(self) -> str:
        """The ``file://`` address to open."""
        return self.path.as_uri()

    def remove(self) -> None:
        with self._lock:
            if self._removed:
                return
            self._removed = True
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ForwardFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
