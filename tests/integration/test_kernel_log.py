"""The kernel's record of OOM kills, the fallback for an OOM event the engine lost."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import replace

import pytest

from orchestrator import labels
from orchestrator.config import load_project, load_worker
from orchestrator.docker import kernel_log
from orchestrator.prepare import prepare

HOG = "hog = []\nwhile True: hog.append(bytearray(8 << 20))"


@pytest.mark.serial  # "no other": no OOM kill of another test beside it
def test_the_kernel_log_names_the_oom_killed_container_and_no_other(engine, project, isolation):
    if not os.access(kernel_log.KMSG, os.R_OK):
        pytest.skip("the kernel log is readable by root only here")  # the engine's events remain
    command = json.dumps(["python3", "-c", HOG])
    project.worker("w", f"command: {command}\nresources: {{memory: 64m}}")
    loaded = load_project(project.root)
    spec = prepare(loaded, load_worker(loaded, "w")).spec
    made = []
    try:
        for cmd in (None, ["true"]):
            run_id = uuid.uuid4().hex[:12]
            labelled = {**spec.labels, labels.RUN_ID: run_id}
            made.append(
                engine.create(
                    replace(spec, run_id=run_id, labels=labelled, command=cmd or spec.command)
                )
            )
            engine.start(made[-1])
            code = engine.wait(made[-1], timeout=60)
            # gVisor (runsc 2024) mostly refuses the allocation instead (MemoryError, 1)
            expected = (0,) if cmd else (137, 1) if isolation == "gvisor" else (137,)
            assert code in expected, code
        hog, quiet = made
        killed = engine.exit_state(hog).exit_code == 137
        if killed or isolation == "runc":
            assert kernel_log.oom_kill_logged(hog) is True
        assert kernel_log.oom_kill_logged(quiet) is False
        # also when gVisor's worker failed by itself while the host killed in its sandbox
        assert engine.exit_state(hog).oom_killed is kernel_log.oom_kill_logged(hog)
    finally:
        for container_id in made:
            engine.remove(container_id)
