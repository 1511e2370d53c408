"""An owner that has exited but is not yet reaped (a zombie) is gone: gc may collect its
containers (an orphaned session owner is reparented to an init that may reap it late)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from orchestrator import labels


def owner_labels(pid: int) -> dict[str, str]:
    me = labels.current_owner()
    return labels.Owner(pid=pid, start=labels._start_time(pid), pid_ns=me.pid_ns).labels()


def test_a_live_owner_is_alive_and_a_zombie_is_gone():
    child = subprocess.Popen(["sleep", "60"])
    try:
        held = owner_labels(child.pid)
        assert labels.owner_state(held) == "alive"
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # not reaped: it stays a zombie meanwhile
            with open(f"/proc/{child.pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert labels.owner_state(held) == "gone"
    finally:
        child.kill()
        child.wait()
    assert labels.owner_state(held) == "gone"
