"""Checks on the paths a change set names, before anything touches the repository.

A path must be relative, normalised (no ``.``, ``..`` or empty parts), free of control
characters, outside every ``.git`` folder (in any letter case, with or without trailing
dots or spaces, as some file systems fold them) and outside protected folders such as the
sandbox root. No path may be listed twice or be a folder of another listed path.
Symlinks are a property of the work tree, not of the name: :mod:`.worktree` refuses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from orchestrator.clearance.errors import ClearanceError
from orchestrator.clearance.store import FileChange

__all__ = ["check_paths", "split"]

_MAX_NAME = 255


def split(path: str) -> tuple[str, ...]:
    """The parts of a repository-relative path, or a ``ValueError`` saying what is wrong."""
    if not isinstance(path, str) or not path:
        raise ValueError("the path is empty")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise ValueError("the path holds a control character")
    if path.startswith("/"):
        raise ValueError("the path is absolute; it would land outside the work tree")
    parts = tuple(path.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError("the path is not normalised ('', '.' or '..' parts)")
        if len(part.encode("utf-8", "surrogateescape")) > _MAX_NAME:
            raise ValueError("a part of the path is longer than 255 bytes")
        if part.rstrip(". ").lower() == ".git":
            raise ValueError("the path lands in .git, which clearance never writes")
    return parts


def check_paths(
    change_id: str, changes: Sequence[FileChange], protected: Iterable[str] = ()
) -> dict[str, tuple[str, ...]]:
    """Split every path, refusing the change set at the first bad one."""
    guarded = [tuple(p.split("/")) for p in protected if p not in ("", ".")]
    parts_of: dict[str, tuple[str, ...]] = {}
    for change in changes:
        try:
            parts = split(change.path)
        except ValueError as exc:
            raise ClearanceError(
                f"change set {change_id}: path {change.path!r} is refused: {exc}; "
                "reject it and stage a fixed one",
                change_id=change_id,
            ) from None
        for folder in guarded:
            if parts[: len(folder)] == folder:
                raise ClearanceError(
                    f"change set {change_id}: {change.path} lies in {'/'.join(folder)}, "
                    "the orchestrator's own state; such a change set is never cleared",
                    change_id=change_id,
                )
        if change.path in parts_of:
            raise ClearanceError(
                f"change set {change_id}: {change.path} is listed twice; "
                "the manifest is inconsistent, stage the change set again",
                change_id=change_id,
            )
        parts_of[change.path] = parts
    folders = {parts[:i] for parts in parts_of.values() for i in range(1, len(parts))}
    for path, parts in parts_of.items():
        if parts in folders:
            raise ClearanceError(
                f"change set {change_id}: {path} is both a file and a folder of another "
                "listed file; the manifest is inconsistent, stage the change set again",
                change_id=change_id,
            )
    return parts_of
