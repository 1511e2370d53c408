"""Seccomp profiles shipped with the orchestrator, and their translation for the engine.

The plan names a profile (its ``seccomp`` field: ``orchestrator-default``); this module turns
the name into the profile's JSON text, which the Docker API takes in ``security_opt``.

``seccomp.json`` is the default profile of moby/profiles (``seccomp/default.json``,
v0.2.3, the one Docker Engine 25 and later ship), kept as data. Its allow list has no
``io_uring_setup``, ``io_uring_enter`` or ``io_uring_register``, so they fail with EPERM
(the default action); Engine 20.10's built-in profile still allows them. Refresh the file
from upstream when its default changes, and keep the io_uring calls out.
"""

from __future__ import annotations

import json
from errno import ENOSYS
from functools import cache
from importlib import resources
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.plan import IMAGE_USER_SECCOMP, SECCOMP_PROFILE

#: Profile names the plan may use, and the package file holding each.
PROFILES = {SECCOMP_PROFILE: "seccomp.json", IMAGE_USER_SECCOMP: "seccomp.json"}

#: For :data:`IMAGE_USER_SECCOMP`: each call that sets a file's mode, and the index of its
#: mode argument. Each is allowed only when that mode has neither set-id bit (a masked
#: compare); ``openat2`` and ``fchmodat2``, whose mode the filter cannot see or which
#: gVisor lacks, are refused.
MODE_ARGUMENT = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "creat": 1, "open": 2, "openat": 3,
                 "mknod": 1, "mknodat": 2}  # fmt: skip
_UNSEEN_MODE = frozenset({"openat2", "fchmodat2"})
_SETID = 0o6000


#: Calls the profile answers with ``ENOSYS`` that gVisor's own kernel does not implement.
#: runsc (2022-12-19, ``--oci-seccomp``) ignores a rule's ``errnoRet`` and answers EPERM;
#: for ``clone3`` that breaks every new thread (glibc falls back to ``clone`` only on
#: ENOSYS). Allowed under gVisor, the Sentry answers ENOSYS itself, as upstream's rule
#: means (``test_the_runtime_is_really_used_and_threads_work`` checks both).
GVISOR_UNIMPLEMENTED = frozenset({"clone3"})


@cache
def profile_text(name: str, *, gvisor: bool = False) -> str:
    """The named profile as compact JSON text; ``gvisor``: its variant for runsc."""
    file = PROFILES.get(name)
    if file is None:
        known = ", ".join(sorted(PROFILES))
        raise OrchestratorError(f"unknown seccomp profile '{name}' (known: {known})")
    data = json.loads(resources.files("orchestrator.docker").joinpath(file).read_text("utf-8"))
    if name == IMAGE_USER_SECCOMP:
        _no_setid(data)
    if gvisor:
        for rule in data["syscalls"]:
            if set(rule["names"]) <= GVISOR_UNIMPLEMENTED and rule.get("errnoRet") == ENOSYS:
                rule["action"] = "SCMP_ACT_ALLOW"
                del rule["errnoRet"]
    return json.dumps(data, separators=(",", ":"))


def _no_setid(data: dict[str, Any]) -> None:
    """No call of the profile ``data`` may set a set-id bit (see :data:`MODE_ARGUMENT`)."""
    taken = set(MODE_ARGUMENT) | _UNSEEN_MODE
    for rule in data["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args"):
            rule["names"] = [n for n in rule["names"] if n not in taken]
    data["syscalls"] += [
        {
            "names": [name],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": index, "value": _SETID, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        }
        for name, index in MODE_ARGUMENT.items()
    ]


def security_opt(options: list[str], *, gvisor: bool = False) -> list[str]:
    """``options`` with each ``seccomp=<name>`` replaced by ``seccomp=<profile JSON>``
    (under gVisor, the profile's variant for runsc: see :data:`GVISOR_UNIMPLEMENTED`).

    Under gVisor, options naming no profile get the orchestrator's: the engine's built-in
    default has the same ``clone3`` rule, which runsc would turn into EPERM."""
    if gvisor and not any(option.startswith("seccomp=") for option in options):
        options = [*options, f"seccomp={SECCOMP_PROFILE}"]
    return [
        f"seccomp={profile_text(option.removeprefix('seccomp='), gvisor=gvisor)}"
        if option.startswith("seccomp=")
        else option
        for option in options
    ]


def default_security_opt() -> list[str]:
    """The options of a container the orchestrator runs for itself (e.g. the egress proxy)."""
    return security_opt(["no-new-privileges:true", f"seccomp={SECCOMP_PROFILE}"])
