"""Copies of the repository's own files, as a fresh clone has them.

A user's run leaves state in the checkout (``make demo`` writes ``examples/triage/output/``
and the example's ``.sandbox/`` audit log); a test that copied the folder as it is would
read that state. :func:`copy_tracked` copies only what git tracks.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Without git (a source tarball): what a run writes into an example, left out by name.
RUN_STATE = (".sandbox", "output", "__pycache__")


def tracked_files(folder: str) -> list[str] | None:
    """The files git tracks under ``folder`` (relative to the repository), or None when
    this is not a git checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--", folder],
            capture_output=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return [name for name in done.stdout.decode().split("\0") if name]


def copy_tracked(folder: str, dest: Path) -> Path:
    """Copy the tracked files of ``folder`` (e.g. ``examples/triage``) to ``dest``; return
    ``dest``. Files a run left there (its output, its sandbox) are not copied."""
    names = tracked_files(folder)
    if names is None:
        shutil.copytree(REPO / folder, dest, ignore=shutil.ignore_patterns(*RUN_STATE))
        return dest
    base = Path(folder)
    for name in names:
        source = REPO / name
        if not source.is_file():  # deleted in the working tree
            continue
        target = dest / Path(name).relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    dest.mkdir(parents=True, exist_ok=True)
    return dest
