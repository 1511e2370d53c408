"""Everyday tools, run *inside* one worker as ``python3 -c SOURCE ARGS``: do they work?

Standard library only (the worker image has python3, not the orchestrator). ``ARGS`` is a
JSON object: ``data`` (a read-only zone holding :data:`FILES`), ``out`` (an empty
writable zone) and ``git`` (the git commands to try, first found wins: the image's own,
or a copy of the host's in a read-only zone). Each operation runs once, its output is
checked here (the listing names the files, the copy has the bytes, the tar round-trips,
git status names the untracked file...), and the last line on stdout is one JSON list
of ``[operation, verdict, output]`` where the verdict is ``ok``, ``failed: WHY`` or
``skipped: WHY``.

The operations are what ordinary tools ask of a kernel: coreutils' ``statx``, directory
reads, renames, recursive copies and removals, tar, git's index, the shell's globbing,
and Python's own ``os.scandir``/``os.stat``/``shutil.copytree``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

#: What the read-only zone holds (path -> text), written by whoever sets the zone up.
FILES = {
    "notes.txt": "hello from orchestrator doctor\n",
    "names.txt": "pear\napple\nfig\n",
    "a.log": "first log\n",
    "b.log": "second log\n",
    "sub/deep/file.bin": "".join(chr(c) for c in range(32, 127)) * 8,
}
#: Every operation, in the order they run.
OPERATIONS = (
    "ls -l",
    "stat",
    "find",
    "cp -a",
    "mv",
    "rm -r",
    "mkdir -p",
    "tar c/x",
    "du",
    "sort",
    "git status",
    "shell glob",
    "os.scandir",
    "os.stat",
    "shutil.copytree",
)


class Failed(Exception):
    """An operation ran but its result is wrong."""


class Skipped(Exception):
    """An operation cannot run here (its tool is not in the image)."""


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise Failed(f"exit {done.returncode}: {said[-1] if said else ''}")
    return done.stdout


def _expect(condition: bool, why: str) -> None:
    if not condition:
        raise Failed(why)


def _same_files(left: Path, right: Path) -> None:
    for rel, text in FILES.items():
        _expect((left / rel).read_bytes() == text.encode(), f"{left / rel}: other bytes")
        _expect((right / rel).read_bytes() == text.encode(), f"{right / rel}: other bytes")


def main(args: dict[str, object]) -> list[list[str]]:
    data = Path(str(args["data"]))
    out = Path(str(args["out"]))
    gits = [str(g) for g in args.get("git", ["git"])]  # type: ignore[attr-defined]
    size = len(FILES["notes.txt"].encode())

    def ls_l() -> str:
        listing = _run("ls", "-l", str(data))
        for name in ("notes.txt", "names.txt", "sub"):
            _expect(name in listing, f"the listing lacks {name}")
        return listing

    def stat() -> str:
        said = _run("stat", "-c", "%s %F", str(data / "notes.txt"))
        _expect(said.strip() == f"{size} regular file", f"stat said {said.strip()!r}")
        return said

    def find() -> str:
        said = _run("find", str(data), "-type", "f")
        found = sorted(os.path.relpath(line, data) for line in said.split())
        _expect(found == sorted(FILES), f"find listed {found}")
        return said

    def cp_a() -> str:
        _run("cp", "-a", str(data), str(out / "copy"))
        _same_files(data, out / "copy")
        return "\n".join(sorted(str(p.relative_to(out)) for p in (out / "copy").rglob("*")))

    def mv() -> str:
        _run("mv", str(out / "copy" / "notes.txt"), str(out / "moved.txt"))
        _expect(not (out / "copy" / "notes.txt").exists(), "the source is still there")
        _expect((out / "moved.txt").read_text() == FILES["notes.txt"], "moved: other bytes")
        return "moved.txt"

    def rm_r() -> str:
        _run("rm", "-r", str(out / "copy"))
        _expect(not (out / "copy").exists(), "the folder is still there")
        return "copy removed"

    def mkdir_p() -> str:
        _run("mkdir", "-p", str(out / "a" / "b" / "c"))
        _expect((out / "a" / "b" / "c").is_dir(), "a/b/c is not a folder")
        return "a/b/c"

    def tar() -> str:
        archive = out / "data.tar"
        _run("tar", "cf", str(archive), "-C", str(data), ".")
        (out / "untarred").mkdir()
        _run("tar", "xf", str(archive), "-C", str(out / "untarred"))
        _same_files(data, out / "untarred")
        return _run("tar", "tf", str(archive))

    def du() -> str:
        said = _run("du", "-sb", str(data))
        total = sum(len(text.encode()) for text in FILES.values())
        _expect(int(said.split()[0]) >= total, f"du counted {said.split()[0]} < {total} bytes")
        return said

    def sort() -> str:
        said = _run("sort", str(data / "names.txt"))
        _expect(said == "apple\nfig\npear\n", f"sort gave {said!r}")
        return said

    def git_status() -> str:
        git = next((g for g in gits if shutil.which(g) or os.access(g, os.X_OK)), None)
        if git is None:
            raise Skipped("no git in the image")
        repo = out / "repo"
        env_home = {"HOME": str(out), "GIT_CONFIG_NOSYSTEM": "1"}
        os.environ.update(env_home)
        _run(git, "init", "-q", str(repo))
        (repo / "untracked.txt").write_text("new\n")
        said = _run(git, "-C", str(repo), "status", "--porcelain")
        _expect(said.strip() == "?? untracked.txt", f"git status said {said.strip()!r}")
        return said

    def glob() -> str:
        said = _run("sh", "-c", f"cd {data} && echo *.log")
        _expect(said.split() == ["a.log", "b.log"], f"the glob gave {said.strip()!r}")
        return said

    def scandir() -> str:
        with os.scandir(data) as entries:
            names = sorted(entry.name for entry in entries)
        top = sorted({rel.split("/")[0] for rel in FILES})
        _expect(names == top, f"scandir listed {names}")
        return " ".join(names)

    def os_stat() -> str:
        seen = os.stat(data / "notes.txt").st_size
        _expect(seen == size, f"st_size {seen}")
        return str(seen)

    def copytree() -> str:
        shutil.copytree(data, out / "tree")
        _same_files(data, out / "tree")
        return "tree"

    steps: dict[str, Callable[[], str]] = {
        "ls -l": ls_l,
        "stat": stat,
        "find": find,
        "cp -a": cp_a,
        "mv": mv,
        "rm -r": rm_r,
        "mkdir -p": mkdir_p,
        "tar c/x": tar,
        "du": du,
        "sort": sort,
        "git status": git_status,
        "shell glob": glob,
        "os.scandir": scandir,
        "os.stat": os_stat,
        "shutil.copytree": copytree,
    }
    results = []
    for name in OPERATIONS:
        try:
            results.append([name, "ok", steps[name]()])
        except Skipped as exc:
            results.append([name, f"skipped: {exc.args[0]}", ""])
        except Exception as exc:  # noqa: BLE001 -- reported, not hidden
            why = str(exc) if isinstance(exc, Failed) else f"{type(exc).__name__}: {exc}"
            results.append([name, f"failed: {why}", ""])
    return results


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
