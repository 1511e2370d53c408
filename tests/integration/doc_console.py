"""The docs' console examples, run as written: a test takes a ```console block from a
Markdown file, runs its ``$ `` commands one after another in one shell (so ``cd`` and
variables carry over), and checks every output line the doc shows against what the
command printed. A doc change that breaks its own example fails the suite.

Output lines are compared with ids, hashes, times and sizes as wildcards (they differ on
every run), whitespace runs as one space, and ``...`` standing for any lines. Ids the doc
shows in a command (a change set's) are replaced by the ones the run printed where the
doc shows them first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: What differs on every run: hex ids and hashes, and numbers (sizes, times, dates).
_VARYING = re.compile(r"\b(?P<hex>[0-9a-f]{7,64})\b|\d+(?:\.\d+)*")
#: The end of one command's output (with its exit code), as the shell prints it.
_MARK = "@@doc-console@@"


@dataclass
class Step:
    command: str
    shown: list[str] = field(default_factory=list)
    """The output lines the doc shows after the command."""


def console_block(markdown: Path, heading: str, index: int = 0) -> list[Step]:
    """The ``index``-th ```console block after ``heading`` (a whole heading line) in
    ``markdown``, as steps."""
    text = markdown.read_text()
    start = text.index(f"\n{heading}\n")
    blocks = re.findall(r"^```console\n(.*?)^```$", text[start:], re.M | re.S)
    steps: list[Step] = []
    for line in blocks[index].splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:]))
        elif line.strip():
            steps[-1].shown.append(line)
    return steps


def pattern(line: str) -> re.Pattern[str]:
    """A doc's output line as a pattern of what a run may print."""
    flat = " ".join(line.split())
    parts: list[str] = []
    end = 0
    for varying in _VARYING.finditer(flat):
        parts.append(re.escape(flat[end : varying.start()]))
        parts.append("[0-9a-f]+" if varying.group("hex") else "[0-9.]+")
        end = varying.end()
    parts.append(re.escape(flat[end:]))
    return re.compile("".join(parts))


class Shell:
    """One ``bash`` the commands run in, in order: stdout and stderr together."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, command: str) -> tuple[int, list[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{command}\nprintf '\\n{_MARK}%s\\n' $?\n")
        self.process.stdin.flush()
        lines: list[str] = []
        for line in self.process.stdout:
            if line.startswith(_MARK):
                return int(line[len(_MARK) :]), [x for x in lines if x.strip()]
            lines.append(line.rstrip("\n"))
        raise AssertionError(f"the shell ended during {command!r}: {lines[-20:]}")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)
        if self.process.stdout is not None:
            self.process.stdout.close()


def run_steps(steps: list[Step], cwd: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """Run ``steps`` as the doc shows them; assert each exits 0 and prints what the doc
    shows. Returns each command's output."""
    shell = Shell(cwd, env)
    ids: dict[str, str] = {}  # an id the doc shows -> the one this run printed
    outputs: dict[str, list[str]] = {}
    try:
        for step in steps:
            command = step.command
            for shown, real in ids.items():
                command = command.replace(shown, real)
            code, printed = shell.run(command)
            assert code == 0, f"`{command}` exited {code}:\n" + "\n".join(printed[-30:])
            flat = [" ".join(line.split()) for line in printed]
            for line in step.shown:
                if line.strip() == "...":
                    continue
                wanted = pattern(line)
                found = next((got for got in flat if wanted.fullmatch(got)), None)
                assert found is not None, f"`{command}` did not print\n  {line}\nbut:\n" + (
                    "\n".join(printed[-30:])
                )
                for doc_id, real_id in zip(
                    re.findall(r"\b[0-9a-f]{12}\b", " ".join(line.split())),
                    re.findall(r"\b[0-9a-f]{12}\b", found),
                    strict=True,
                ):
                    ids.setdefault(doc_id, real_id)
            outputs[step.command] = printed
    finally:
        shell.close()
    return outputs


def console_env(home: Path) -> dict[str, str]:
    """The environment the commands run in: this interpreter's ``orchestrator`` first on
    ``PATH``, ``home`` as ``~``, a git identity (as a user's own git set-up would give)."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
        "GIT_AUTHOR_NAME": "Doc Reader",
        "GIT_AUTHOR_EMAIL": "reader@example.invalid",
        "GIT_COMMITTER_NAME": "Doc Reader",
        "GIT_COMMITTER_EMAIL": "reader@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
