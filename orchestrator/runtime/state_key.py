"""The key that authenticates the orchestrator's own records (access records).

A record that leads root to ``chown`` and ``chmod`` files must be one the orchestrator
wrote: each carries an HMAC-SHA256 under a key that only this user can read, kept outside
every project (``~/.local/state/orchestrator/record.key`` of the effective user's home in
the password database, whatever ``$HOME`` says; ``/tmp/orchestrator-state-UID`` for a user
whose home does not exist). The key is made on first use: 32 random bytes, mode 0600, in
a folder of mode 0700, both opened without following a link and checked like the sandbox
root (:func:`orchestrator.runtime.state_root.open_private`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Any

from orchestrator.hostfs.files import read_limited
from orchestrator.runtime.state_root import StateRootRefused, open_private

__all__ = ["KEY_FILE", "derived_key", "key_folder", "key_in", "sign", "signed_by_us"]

KEY_FILE = "record.key"
_KEY_BYTES = 32
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def key_folder() -> Path:
    """Where this user's key is kept."""
    euid = os.geteuid()
    try:
        home = Path(pwd.getpwuid(euid).pw_dir)
    except KeyError:
        home = Path("/nonexistent")
    if home.is_absolute() and home.is_dir() and home != Path("/"):
        return home / ".local" / "state" / "orchestrator"
    return Path(f"/tmp/orchestrator-state-{euid}")


@functools.cache
def _key() -> bytes:
    folder = key_folder()
    fix = "or remove it so that the orchestrator makes its own"
    fd, _ = open_private(folder, f"the key folder {folder}", fix)
    try:
        return key_in(fd, KEY_FILE, folder / KEY_FILE, "the record key")
    finally:
        os.close(fd)


def key_in(folder: int, name: str, path: Path, what: str) -> bytes:
    """The key ``name`` in the private folder ``folder`` (shown as ``path``, named
    ``what``), made on first use: 32 random bytes, mode 0600, never through a link. A key
    of another owner, mode or size is refused, naming the fix."""
    try:
        file = os.open(name, _READ, dir_fd=folder)
    except FileNotFoundError:
        _make(folder, name)
        file = os.open(name, _READ, dir_fd=folder)
    except OSError as exc:
        raise StateRootRefused(
            f"{what} {path} cannot be opened ({exc.strerror}); "
            f"remove it (`rm {path}`) so that the orchestrator makes a new one"
        ) from None
    try:
        info = os.fstat(file)
        key = read_limited(file, _KEY_BYTES + 1)
    finally:
        os.close(file)
    good = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
    if not good or info.st_mode & 0o077 or len(key) != _KEY_BYTES:
        raise StateRootRefused(
            f"{what} {path} is not a {_KEY_BYTES}-byte file of yours "
            f"that only you can read; remove it (`rm {path}`) so that the "
            "orchestrator makes a new one (what was made with the old key is then refused)"
        )
    return key


def _make(folder: int, name: str) -> None:
    try:
        file = os.open(name, _CREATE, 0o600, dir_fd=folder)
    except FileExistsError:
        return  # another process made it meanwhile
    try:
        os.write(file, secrets.token_bytes(_KEY_BYTES))
        os.fsync(file)
    finally:
        os.close(file)


def derived_key(purpose: str) -> bytes:
    """A key of this user's for ``purpose``, derived from the record key."""
    return hmac.new(_key(), f"derived:{purpose}".encode(), hashlib.sha256).digest()


def sign(body: dict[str, Any], where: str) -> str:
    """The HMAC of ``body`` (JSON) written at ``where``, as hex."""
    message = json.dumps([where, body], sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(_key(), message, hashlib.sha256).hexdigest()


def signed_by_us(body: dict[str, Any], where: str, mac: object) -> bool:
    """Whether ``mac`` is :func:`sign` of ``body`` at ``where``."""
    return isinstance(mac, str) and hmac.compare_digest(sign(body, where), mac)
