"""The user's repository, driven through GitPython with hooks and fsmonitor switched off.

Every git process started here gets, before its subcommand::

    -c core.hooksPath=/dev/null    no hook runs: /dev/null is not a folder, so no hook exists
    -c core.fsmonitor=false        no fsmonitor program or daemon is asked about changes
    -c core.untrackedCache=false   untracked files are found by reading the folders, not
                                   from a cache keyed on folder times a writer can fake
    --literal-pathspecs            a path is a path, never a glob or ':(magic)'
    --no-optional-locks            reading commands never rewrite the index

Options given with ``-c`` beat every configuration file and are passed on to the git
programs git itself starts (``git-remote-http``, ``pack-objects``), so a hook or fsmonitor
configured in the repository, the user's files or the work tree never runs. Only plumbing
commands are used: no clean/smudge filter, no editor, no pager, no commit hook is involved,
and what is committed is byte for byte what was reviewed.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

from orchestrator.audit.redact import TextRedactor
from orchestrator.clearance.errors import ClearanceError

__all__ = ["SAFE_CONFIG", "GitFailure", "GitRepo", "TreeEntry"]

SAFE_CONFIG: tuple[str, ...] = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
)
#: Variables that would point git at another repository, index or object store.
REDIRECTING_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
)
LOCAL_TIMEOUT = 300.0


class GitFailure(Exception):
    """A git command failed; ``detail`` is its error output, secrets already removed."""

    def __init__(self, command: str, status: object, detail: str) -> None:
        self.command = command
        self.status = status
        self.detail = detail
        super().__init__(f"git {command} failed ({status}): {detail}")


@dataclass(frozen=True)
class TreeEntry:
    """An entry of a tree or of the index: ``100644 blob <oid>`` and its stage."""

    mode: str
    oid: str
    kind: str = "blob"
    stage: int = 0


class GitRepo:
    """One work tree and its repository; every command runs with :data:`SAFE_CONFIG`."""

    def __init__(self, path: Path, *, change_id: str, redactor: TextRedactor | None = None) -> None:
        self.change_id = change_id
        self.redactor = redactor or TextRedactor()
        for name in REDIRECTING_ENV:
            if os.environ.get(name):
                raise self.error(
                    f"{name} is set in the environment and would point git elsewhere; "
                    "unset it and run the command again"
                )
        root = Path(os.path.realpath(path))
        try:
            repo = git.Repo(root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise self.error(
                f"{root} is not the top of a git work tree; set 'repo' in orchestrator.yaml "
                "to the folder holding .git"
            ) from None
        self.repo = repo
        self.root = root
        self._git = repo.git
        self._git.set_persistent_git_options(
            c=list(SAFE_CONFIG), literal_pathspecs=True, no_optional_locks=True
        )
        try:
            if repo.bare or repo.working_tree_dir is None:
                raise self.error(f"{root} is a bare repository; clearance needs a work tree")
            top = self.run("rev-parse", "--show-toplevel")
            if Path(os.path.realpath(top)) != root:
                raise self.error(
                    f"{root} is inside the work tree {top}, not its top; set 'repo' in "
                    "orchestrator.yaml to the top of the work tree"
                )
            self.git_dir = Path(os.path.realpath(root / self.run("rev-parse", "--git-dir")))
        except BaseException:
            repo.close()
            raise

    def close(self) -> None:
        """Stop GitPython's helper processes."""
        self.repo.close()

    def error(self, message: str) -> ClearanceError:
        return ClearanceError(f"change set {self.change_id}: {message}", change_id=self.change_id)

    # -- running -------------------------------------------------------------------

    def run(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        config: Sequence[str] = (),
        timeout: float = LOCAL_TIMEOUT,
        ok: Iterable[int] = (0,),
    ) -> str:
        """Run ``git <args>`` and return its output (one trailing newline removed)."""
        return self.run_full(*args, env=env, stdin=stdin, config=config, timeout=timeout, ok=ok)[1]

    def run_full(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        config: Sequence[str] = (),
        timeout: float = LOCAL_TIMEOUT,
        ok: Iterable[int] = (0,),
    ) -> tuple[int, str, str]:
        """Run ``git <args>``; return (status, stdout, stderr); other statuses raise."""
        command, *rest = args
        accepted = set(ok)
        kwargs: dict[str, Any] = {
            "with_extended_output": True,
            "with_exceptions": False,
            "stdout_as_string": False,
            "kill_after_timeout": timeout,
        }
        if env:
            kwargs["env"] = dict(env)
        runner = self._git(c=list(config)) if config else self._git
        with tempfile.TemporaryFile() as feed:
            if stdin is not None:
                feed.write(stdin)
                feed.seek(0)
                kwargs["istream"] = feed
            try:
                result = getattr(runner, command.replace("-", "_"))(*rest, **kwargs)
            except git.GitCommandError as exc:  # not started, or killed at the timeout
                raise GitFailure(command, exc.status, self.clean(str(exc.stderr))) from None
        status, out, err = result
        out_text = _text(out, "surrogateescape")
        err_text = self.clean(_text(err, "replace"))
        if status not in accepted:
            raise GitFailure(command, status, err_text.strip() or out_text.strip())
        return status, out_text, err_text

    def clean(self, text: str) -> str:
        """``text`` with every registered secret replaced."""
        return self.redactor.redact_text(text)

    # -- questions -----------------------------------------------------------------

    def current_branch(self) -> str | None:
        """The checked-out branch (``main``), or None for a detached HEAD."""
        status, out, _ = self.run_full("symbolic-ref", "-q", "HEAD", ok=(0, 1))
        if status != 0 or not out.startswith("refs/heads/"):
            return None
        return out.removeprefix("refs/heads/")

    def commit_of(self, ref: str) -> str | None:
        """The commit ``ref`` names, or None when it does not exist."""
        status, out, _ = self.run_full(
            "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", ok=(0, 1)
        )
        return out.strip() if status == 0 else None

    def valid_branch(self, name: str) -> bool:
        if name.startswith("-"):
            return False
        status, _, _ = self.run_full("check-ref-format", "--branch", name, ok=(0, 1, 128))
        return status == 0

    def branches_in_other_worktrees(self) -> dict[str, str]:
        """Branch name -> path, for branches checked out by another work tree."""
        found: dict[str, str] = {}
        where = ""
        for line in self.run("worktree", "list", "--porcelain").splitlines():
            if line.startswith("worktree "):
                where = line.removeprefix("worktree ")
            elif line.startswith("branch refs/heads/") and os.path.realpath(where) != str(
                self.root
            ):
                found[line.removeprefix("branch refs/heads/")] = where
        return found

    def zero_oid(self) -> str:
        fmt = self.run("rev-parse", "--show-object-format").strip()
        return "0" * (64 if fmt == "sha256" else 40)

    def tree_entries(self, commit: str | None, paths: Sequence[str]) -> dict[str, TreeEntry]:
        """Entries of ``commit``'s tree at ``paths`` (absent paths are missing)."""
        if commit is None or not paths:
            return {}
        found: dict[str, TreeEntry] = {}
        for record in _records(self.run("ls-tree", "-z", commit, "--", *paths)):
            info, _, path = record.partition("\t")
            mode, kind, oid = info.split(" ")
            found[path] = TreeEntry(mode, oid, kind)
        return found

    def index_entries(self, paths: Sequence[str]) -> dict[str, list[TreeEntry]]:
        """Index entries at ``paths``: one per stage (more than one in a merge conflict)."""
        found: dict[str, list[TreeEntry]] = {}
        for record in _records(self.run("ls-files", "-s", "-z", "--", *paths)):
            info, _, path = record.partition("\t")
            mode, oid, stage = info.split(" ")
            found.setdefault(path, []).append(TreeEntry(mode, oid, "blob", int(stage)))
        return found

    def changed(self, paths: Sequence[str]) -> dict[str, str]:
        """``git status`` of ``paths``: path -> two-letter code, ignored files included.

        A whole ignored folder is reported once, with a trailing slash.
        """
        out = self.run(
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignored=matching",
            "--no-renames",
            "--",
            *paths,
        )
        return {record[3:]: record[:2] for record in _records(out)}

    def config_problems(self) -> list[str]:
        """Configuration clearance refuses to run under, one line each."""
        problems: list[str] = []
        out = self.run("config", "--list", "--show-origin", "-z")
        fields = out.split("\0")
        for origin, entry in zip(fields[0::2], fields[1::2], strict=False):
            key = entry.partition("\n")[0].lower()
            if key.startswith("hook.") and key.endswith(".command"):
                problems.append(
                    f"{key} configures a hook that '-c core.hooksPath' cannot switch off; "
                    "remove it from the configuration of this repository while clearing"
                )
            if origin.startswith("file:"):
                where = Path(os.path.realpath(self.root / origin.removeprefix("file:")))
                inside = self.root == where or self.root in where.parents
                if inside and not (where == self.git_dir or self.git_dir in where.parents):
                    problems.append(
                        f"{key} is read from {where}, a file in the work tree that a worker "
                        "may have written; drop the include.path pointing there"
                    )
        return list(dict.fromkeys(problems))

    def find_trailer(self, change_id: str) -> str | None:
        """The newest commit on any local branch whose trailers carry ``Staged-Id: <id>``."""
        out = self.run(
            "log",
            "--branches",
            "-z",
            "--format=%H%x00%B",
            "--fixed-strings",
            f"--grep=Staged-Id: {change_id}",
        )
        fields = out.split("\0")
        for sha, body in zip(fields[0::2], fields[1::2], strict=False):
            last = body.strip("\n").split("\n\n")[-1]
            if f"Staged-Id: {change_id}" in last.splitlines():
                return sha.strip()
        return None

    # -- writing -------------------------------------------------------------------

    def blob_sha256(self, oid: str) -> str:
        """The sha256 of a blob's bytes (as stored: no filters applied)."""
        _, kind, _, data = self._git.get_object_data(oid)
        if _text(kind, "replace") != "blob":
            raise GitFailure("cat-file", 0, f"{oid} is not a blob")
        return hashlib.sha256(data).hexdigest()

    def hash_blobs(self, sources: Sequence[Path], *, write: bool) -> list[str]:
        """Blob ids of ``sources`` taken exactly as they are (no filters), one process for
        all; with ``write`` the blobs are also stored in the repository."""
        if not sources:
            return []
        if any("\n" in str(source) for source in sources):
            raise ValueError("a blob path holds a newline")
        feed = "".join(f"{source}\n" for source in sources).encode("utf-8", "surrogateescape")
        args = ("hash-object", *(["-w"] if write else []), "--no-filters", "--stdin-paths")
        oids = self.run(*args, stdin=feed).split()
        if len(oids) != len(sources):
            raise GitFailure("hash-object", 0, f"{len(oids)} ids for {len(sources)} files")
        return oids

    def commit_tree(
        self, base: str | None, entries: Mapping[str, TreeEntry | None], message: str
    ) -> str:
        """A commit of ``base``'s tree with ``entries`` set (None: removed). HEAD, the index
        and the work tree are not touched: a private index in a temporary folder is used."""
        with tempfile.TemporaryDirectory(prefix="orchestrator-clearance-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if base is not None:
                self.run("read-tree", base, env=env)
            self.update_index(entries, env=env)
            tree = self.run("write-tree", env=env).strip()
            message_file = Path(tmp) / "message"
            message_file.write_text(message, encoding="utf-8")
            parents = ["-p", base] if base is not None else []
            sign = ["-S"] if self.wants_signing() else []
            return self.run("commit-tree", tree, *parents, *sign, "-F", str(message_file)).strip()

    def wants_signing(self) -> bool:
        """``commit.gpgSign`` as configured (``commit-tree`` would ignore it otherwise)."""
        status, out, _ = self.run_full(
            "config", "--type=bool", "--get", "commit.gpgSign", ok=(0, 1)
        )
        return status == 0 and out.strip() == "true"

    def update_index(
        self, entries: Mapping[str, TreeEntry | None], *, env: Mapping[str, str] | None = None
    ) -> None:
        """Set index entries (the real index unless ``env`` names another)."""
        zero = self.zero_oid()
        records = [
            f"{e.mode} {e.oid}\t{p}" if e is not None else f"0 {zero}\t{p}"
            for p, e in entries.items()
        ]
        feed = "".join(f"{r}\0" for r in records).encode("utf-8", "surrogateescape")
        self.run("update-index", "-z", "--index-info", env=env, stdin=feed)

    def changed_paths(self, base: str, commit: str) -> set[str]:
        """Every path that differs between two commits (no rename detection)."""
        out = self.run("diff-tree", "-r", "--no-renames", "--name-only", "-z", base, commit)
        return {path for path in out.split("\0") if path}

    def update_ref(self, branch: str, new: str, old: str | None, reason: str) -> None:
        """Move ``refs/heads/<branch>`` to ``new`` only if it is still at ``old``."""
        self.run("update-ref", "-m", reason, f"refs/heads/{branch}", new, old or "")

    def push_url(self, remote: str) -> str | None:
        status, out, _ = self.run_full("remote", "get-url", "--push", remote, ok=(0, 2, 128))
        return out.strip() if status == 0 else None


def _text(value: object, errors: str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors)
    return str(value)


def _records(out: str) -> list[str]:
    return [record for record in out.split("\0") if record]
