"""Reading OOM kills from the kernel log (a plain file stands in for /dev/kmsg)."""

from __future__ import annotations

from orchestrator.docker.kernel_log import oom_kill_logged

A = "a" * 64
B = "b" * 64
LOG = (
    "6,1,100,-;eth0: link up\n"
    f"4,2,200,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={B},"
    f"mems_allowed=0,oom_memcg=/docker/{A},task_memcg=/docker/{A},task=exe,pid=7,uid=65534\n"
    " SUBSYSTEM=memory\n"
    f"3,3,300,-;Memory cgroup out of memory: Killed process 7 (exe) /docker/{B}\n"
)


def test_an_oom_kill_is_found_by_the_memory_cgroup_not_by_other_fields(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(LOG)
    assert oom_kill_logged(A, str(log)) is True
    assert oom_kill_logged(B, str(log)) is False  # named only as a cpuset and in free text
    assert oom_kill_logged("c" * 64, str(log)) is False


def test_a_record_cut_across_reads_is_still_found(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,0,1,-;" + "x" * 8190 + "\n" + LOG.splitlines()[1])  # no final newline
    assert oom_kill_logged(A, str(log)) is True


def test_without_a_readable_log_or_a_full_id_it_cannot_tell(tmp_path):
    assert oom_kill_logged(A, str(tmp_path / "missing")) is None
    log = tmp_path / "kmsg"
    log.write_text(LOG)
    assert oom_kill_logged(A[:12], str(log)) is None  # a prefix could name another container
    assert oom_kill_logged("c1", str(log)) is None
