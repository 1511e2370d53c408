"""``git push`` of one branch, with either the host's own credentials or exactly one.

``inherit`` (or no credential): git runs as the user would run it, with the host's SSH
agent and credential helpers; nothing is injected.

``explicit``: the value reaches the one push process and the programs it starts, and
nothing else. For that process only:

- ``GIT_ASKPASS`` names a tiny shell script, written to a private temporary folder and
  removed afterwards, that prints a user name or password taken from its environment
  (``printf`` is a shell builtin, so the value is never in any command line);
- the two variables it reads are set in that process's environment only;
- ``-c credential.helper=`` empties the helper list, so no other helper is asked (or told
  to store the value), and ``-c http.extraHeader=`` drops configured extra headers;
- ``GIT_TERMINAL_PROMPT=0``: a rejected value fails instead of prompting.

The value is never written to disk or git configuration, never put into the remote URL
and never given to a container. Git's error output is redacted before it is shown.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from orchestrator.clearance.errors import ClearanceError
from orchestrator.clearance.gitrepo import GitFailure, GitRepo
from orchestrator.credentials import Credential

__all__ = ["PUSH_TIMEOUT", "PushPlan", "can_push", "plan_push", "run_push"]

#: Seconds a push may take before it is stopped.
PUSH_TIMEOUT = 600.0
USERNAME_VAR = "ORCHESTRATOR_GIT_USERNAME"
PASSWORD_VAR = "ORCHESTRATOR_GIT_PASSWORD"  # noqa: S105 - a variable name, not a value
ASKPASS = f"""#!/bin/sh
case "$1" in
  [Uu]sername*) printf '%s\\n' "${USERNAME_VAR}" ;;
  *) printf '%s\\n' "${PASSWORD_VAR}" ;;
esac
"""
_SCP_LIKE = re.compile(r"^[^/:]+:")


class PushPlan:
    """Where a push goes and whether a credential is injected into it."""

    def __init__(self, remote: str, url: str, credential: Credential | None, inject: bool) -> None:
        self.remote = remote
        self.url = url
        self.credential = credential
        self.inject = inject


def _kind(url: str) -> str:
    """``http``, ``ssh``, ``local`` or ``other`` for a remote URL."""
    if "://" in url:
        scheme = url.split("://", 1)[0].lower()
        if scheme in ("http", "https"):
            return "http"
        if scheme == "file":
            return "local"
        if scheme in ("ssh", "git+ssh", "ssh+git"):
            return "ssh"
        return "other"
    return "ssh" if _SCP_LIKE.match(url) and not os.path.exists(url) else "local"


def can_push(path: Path, remote: str) -> bool:
    """Whether the work tree at ``path`` has a remote named ``remote`` to push to: what
    ``orchestrator clear --push`` needs besides the change set (the credential, if any,
    is read only when pushing). False also when ``path`` is no usable work tree; clearing
    says why."""
    try:
        repo = GitRepo(path, change_id="-")
    except (ClearanceError, GitFailure):
        return False
    try:
        return repo.push_url(remote) is not None
    except GitFailure:
        return False
    finally:
        repo.close()


def plan_push(repo: GitRepo, remote: str, credential: Credential | None) -> PushPlan:
    """Check the remote and how the credential can be used with it, before anything runs."""
    url = repo.push_url(remote)
    if url is None:
        raise repo.error(
            f"the repository has no remote named '{remote}'; add it with "
            f"`git remote add {remote} URL` or set clearance.remote in orchestrator.yaml"
        )
    if credential is None or not credential.explicit:
        return PushPlan(remote, url, credential, inject=False)
    kind = _kind(url)
    if kind == "http" and urlsplit(url).password:
        raise repo.error(
            f"remote '{remote}' has a password in its URL, so {credential} would not be the "
            "only one used; remove it from the URL (`git remote set-url`)"
        )
    if kind in ("ssh", "other"):
        raise repo.error(
            f"remote '{remote}' is not an HTTP(S) URL, so {credential} cannot be given to it; "
            "use an https:// URL or set the credential's mode to 'inherit'"
        )
    if kind == "http":
        status, header, _ = repo.run_full(
            "config", "--get-urlmatch", "http.extraheader", url, ok=(0, 1)
        )
        if status == 0 and header.strip():
            raise repo.error(
                f"git config sets an http.extraHeader for {url} (e.g. a CI checkout's token), "
                f"so {credential} would not be the only one used; remove it "
                "(`git config --unset-all http.<url>.extraheader`)"
            )
    return PushPlan(remote, url, credential, inject=kind == "http")


def run_push(repo: GitRepo, plan: PushPlan, branch: str, *, timeout: float = PUSH_TIMEOUT) -> str:
    """Push ``refs/heads/<branch>`` to the same name on the remote; return git's report.

    Raises :class:`~orchestrator.clearance.gitrepo.GitFailure` (already redacted).
    """
    args = (
        "push",
        "--porcelain",
        "--no-verify",
        plan.remote,
        f"refs/heads/{branch}:refs/heads/{branch}",
    )
    if not plan.inject or plan.credential is None:
        return repo.clean(repo.run(*args, timeout=timeout))
    secret = plan.credential.reveal()
    repo.redactor.add(secret)
    with tempfile.TemporaryDirectory(prefix="orchestrator-askpass-") as folder:
        script = Path(folder) / "askpass"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        with os.fdopen(fd, "w") as handle:
            handle.write(ASKPASS)
        env = {
            "GIT_ASKPASS": str(script),
            "GIT_TERMINAL_PROMPT": "0",
            USERNAME_VAR: plan.credential.username,
            PASSWORD_VAR: secret,
        }
        report = repo.run(
            *args,
            env=env,
            config=("credential.helper=", "http.extraHeader="),
            timeout=timeout,
        )
    return repo.clean(report)
