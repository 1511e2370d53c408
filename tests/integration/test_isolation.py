"""Security claims, each tried for real in a container."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.docker


def test_write_to_a_read_only_zone_fails_with_erofs(project, run_worker, isolation):
    data = project.zone("data", "ro", files={"a.txt": "original"})
    # Writable by anyone: only the read-only mount can refuse (gVisor checks permissions
    # first, so a file the worker could not write anyway would say EACCES there).
    data.chmod(0o777)
    (data / "a.txt").chmod(0o666)
    result = run_worker(
        """
        import errno
        for path in ("/data/a.txt", "/data/new.txt"):
            try:
                open(path, "w").write("tampered")
                print("WROTE", path)
            except OSError as e:
                print(path, errno.errorcode[e.errno])
        print(open("/data/a.txt").read())
        """,
        "sandbox: {zones: [{name: data, mode: ro}]}",
    )
    assert result.exit_code == 0, result.stderr
    assert "/data/a.txt EROFS" in result.stdout and "/data/new.txt EROFS" in result.stdout
    assert "WROTE" not in result.stdout and "original" in result.stdout
    assert (data / "a.txt").read_text() == "original"
    assert not (data / "new.txt").exists()


def test_undeclared_zones_are_absent(project, run_worker):
    project.zone("data", "ro", files={"a.txt": "x"})
    project.zone("secret", "ro", files={"key.txt": "HOST-SECRET"})
    result = run_worker(
        """
        import os
        print("data", sorted(os.listdir("/data")))
        print("secret", os.path.exists("/secret"))
        """,
        "sandbox: {zones: [{name: data}]}",
    )
    assert "data ['a.txt']" in result.stdout
    assert "secret False" in result.stdout
    assert "HOST-SECRET" not in result.stdout


def test_no_sandbox_means_no_zone_at_all(project, run_worker):
    project.zone("data", "rw", files={"a.txt": "x"})
    result = run_worker(
        """
        mounts = open("/proc/self/mounts").read()
        print("binds:", [l.split()[1] for l in mounts.splitlines() if l.split()[1] == "/data"])
        """
    )
    assert "binds: []" in result.stdout


def test_files_written_to_a_rw_zone_belong_to_the_host_user(project, run_worker):
    out = project.zone("out", "rw", extra="untrusted_output: true")
    result = run_worker(
        'import os; open("/out/report.txt", "w").write("ok"); print(os.getuid(), os.getgid())',
        "sandbox: {zones: [{name: out, mode: rw}]}",
    )
    uid, gid = project.identity
    assert result.stdout.split() == [str(uid), str(gid)]
    assert uid != 0
    info = (out / "report.txt").stat()
    if os.getuid() != 0:  # the worker is the user
        assert (info.st_uid, info.st_gid) == (uid, gid) and info.st_uid == os.getuid()
    else:  # as root, what the worker made is the project folder's owner's once it is over
        owner = project.root.stat()
        assert (info.st_uid, info.st_gid) == (owner.st_uid, owner.st_gid)


def test_no_capabilities_no_privileges_no_docker_socket(project, run_worker, isolation):
    result = run_worker(
        """
        import ctypes, os, errno
        status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
        for key in ("CapEff", "CapPrm", "CapBnd", "Seccomp"):
            print(key, status[key].strip())
        # prctl(PR_GET_NO_NEW_PRIVS): gVisor's /proc/self/status has no NoNewPrivs line
        print("NoNewPrivs", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))
        for sock in ("/var/run/docker.sock", "/run/docker.sock"):
            print("socket", sock, os.path.exists(sock))
        try:
            os.setuid(0); print("SETUID OK")
        except PermissionError:
            print("setuid refused")
        for path in ("/etc/evil", "/usr/evil", "/var/tmp/evil"):
            try:
                open(path, "w")
            except OSError as e:
                print(path, errno.errorcode[e.errno])
        open("/tmp/scratch", "w").write("tmp is writable")
        print("tmp ok")
        print("interfaces", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
        print("pid1", open("/proc/1/cmdline").read().split("\\0")[0])
        """
    )
    out = result.stdout
    assert result.exit_code == 0, result.stderr
    assert "CapEff 0000000000000000" in out
    assert "CapPrm 0000000000000000" in out
    assert "CapBnd 0000000000000000" in out
    assert "NoNewPrivs 1" in out
    assert "Seccomp 2" in out  # Docker's default filter is kept
    assert "socket /var/run/docker.sock False" in out and "socket /run/docker.sock False" in out
    assert "setuid refused" in out
    # /var/tmp is world-writable in the image: only the read-only root refuses there.
    # (/etc and /usr are root's: gVisor checks permissions first and says EACCES.)
    assert "/var/tmp/evil EROFS" in out
    refused = ("EROFS",) if isolation == "runc" else ("EROFS", "EACCES")
    assert any(f"/etc/evil {e}" in out for e in refused), out
    assert any(f"/usr/evil {e}" in out for e in refused), out
    assert "tmp ok" in out
    assert "interfaces ['lo']" in out
    assert "pid1 /sbin/docker-init" in out or "pid1 /dev/init" in out


def test_tmp_is_size_capped(project, run_worker, isolation):
    result = run_worker(
        """
        import errno
        try:
            with open("/tmp/fill", "wb") as f:
                for _ in range(64):
                    f.write(b"x" * (1 << 20)); f.flush()
            print("FILLED")
        except OSError as e:
            print(errno.errorcode[e.errno])
        """,
        "resources: {tmp: 8m}",
    )
    assert "ENOSPC" in result.stdout and "FILLED" not in result.stdout


def test_memory_bomb_is_killed_as_oom(project, run_worker, isolation):
    result = run_worker(
        """
        hog = []
        while True:
            hog.append(bytearray(8 << 20))
        """,
        "resources: {memory: 64m}",
    )
    assert (result.status, result.exit_code) == ("oom", 137)
    assert result.container_removed


def test_fork_bomb_is_contained_by_the_pid_limit(project, run_worker, isolation):
    result = run_worker(
        """
        import os, time
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
        except OSError as e:
            print("stopped after", children, "children:", e.strerror)
        """,
        "resources: {pids: 32, timeout: 60}",
    )
    assert result.exit_code == 0, result.stderr
    children = int(result.stdout.split()[2])
    assert children < 32
    assert "Resource temporarily unavailable" in result.stdout
    assert result.container_removed


def test_the_runtime_is_really_used_and_threads_work(project, run_worker, isolation):
    """Under gVisor the worker's system calls reach gVisor's kernel, not the host's: its
    uname is gVisor's. Threads start under both (runc answers clone3 with ENOSYS, so glibc
    falls back to clone; runsc 2024 implements clone3), and io_uring is refused."""
    result = run_worker(
        """
        import ctypes, errno, os, threading
        libc = ctypes.CDLL(None, use_errno=True)
        def call(number, *args):
            return "ok" if libc.syscall(number, *args) >= 0 else errno.errorcode[ctypes.get_errno()]
        print("release", os.uname().release)
        print("clone3", call(435, None, 0))
        print("io_uring_setup", call(425, 8, ctypes.create_string_buffer(120)))
        ran = []
        thread = threading.Thread(target=ran.append, args=(1,))
        thread.start(); thread.join()
        print("thread ran", ran == [1])
        """
    )
    assert result.exit_code == 0, result.stderr
    host_release = os.uname().release
    if isolation == "gvisor":
        assert f"release {host_release}" not in result.stdout, result.stdout
    else:
        assert f"release {host_release}\n" in result.stdout, result.stdout
    # runc: the profile's rule answers ENOSYS. gVisor: runsc 0.0~20240729 implements
    # clone3 itself, so an empty call is EINVAL (older builds answered ENOSYS).
    answers = ("clone3 ENOSYS", "clone3 EINVAL") if isolation == "gvisor" else ("clone3 ENOSYS",)
    assert any(answer in result.stdout for answer in answers), result.stdout
    assert "io_uring_setup EPERM" in result.stdout
    assert "thread ran True" in result.stdout
