"""A build's disk limits without an engine: what a step adds is counted whole (every entry
a block, a sparse file its apparent size), COPY and ADD are counted before a byte is
written and streamed (nothing staged on the host), the steps together stay within the
build's budget; and the network a ``RUN`` gets."""

from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from orchestrator.build.bases import BaseImages
from orchestrator.build.builder import HOST_RULE_WARNING, Builder, StepFailed
from orchestrator.build.context import Context
from orchestrator.build.dockerfile import BuildRefused, parse
from orchestrator.build.engine import ENTRY_BYTES, StepLimits, StepOutcome, StepSpec
from orchestrator.build.tarstream import added, count, stream
from orchestrator.runtime.engine import EgressLog

MIB = 1 << 20


class _Engine:
    """A step engine in memory: a ``RUN`` "adds" what its command says (``added=N``),
    and is stopped past the limit it is given, as the Docker engine's watch does."""

    def __init__(self) -> None:
        self.specs: list[StepSpec] = []
        self.limits: list[StepLimits] = []
        self.written: list[list[tarfile.TarInfo]] = []
        self.put_bytes = 0

    def image(self, ref: str) -> tuple[str, dict[str, Any]]:
        # One id per name: the proxies' images are told apart by id (build.bases).
        return "sha256:" + hashlib.sha256(ref.encode()).hexdigest(), {}

    def cached(self, key: str, parent: str) -> None:
        return None

    def create(self, spec: StepSpec, limits: StepLimits) -> str:
        self.specs.append(spec)
        self.limits.append(limits)
        return f"c{len(self.specs)}"

    def put_archive(self, container: str, data: Any) -> None:
        raw = b"".join(data)
        self.put_bytes += len(raw)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            self.written.append(tar.getmembers())

    def is_folder(self, container: str, path: str) -> bool:
        return False

    def exists(self, container: str, path: str) -> bool:
        return False

    def folder(self, container: str, path: str) -> None:
        return None

    def run(self, container: str, limits: StepLimits, deadline: float, output: Any) -> StepOutcome:
        command = " ".join(self.specs[int(container[1:]) - 1].command)
        size = int(command.split("added=")[1].split()[0]) if "added=" in command else 0
        return StepOutcome(exit_code=0, disk_exceeded=size > limits.disk, added=size)

    def commit(self, container: str, config: Any) -> str:
        return "sha256:" + container.ljust(64, "1")

    def remove(self, container: str) -> None:
        pass

    def open_network(self, build_id: str, allow: list[str], services: list[str]) -> str:
        return "build-net"

    def close_network(self, network: str) -> None:
        pass

    def egress_decisions(self, *args: Any) -> EgressLog:
        return EgressLog(decisions=[])

    def runtime(self) -> str:
        return "fake"

    def tag(self, image: str, name: str) -> None:
        pass


class _Audit:
    def record(self, event: str, **fields: Any) -> None:
        pass


def _build(
    context: Path, text: str, *, disk: int = 32 * MIB, total: int = 1 << 40, **extra: Any
) -> _Engine:
    (context / "Dockerfile").write_text(text)
    engine = _Engine()
    limits = StepLimits(memory=1 << 30, cpus=1.0, pids=100, timeout_s=60.0, disk=disk,
                        disk_total=total)  # fmt: skip
    folder = Context.open(context)
    try:
        builder = Builder(engine, _Audit(), folder, parse(context / "Dockerfile", text), limits,
                          cache_key=b"k" * 32, images=BaseImages(("base",)),
                          **extra)  # type: ignore[arg-type]  # fmt: skip
        builder.build(None, None)
    finally:
        folder.close()
    return engine


@pytest.fixture
def temp(tmp_path, monkeypatch):
    """The host's temporary folder, watched: nothing may be left in it (or staged there)."""
    folder = tmp_path / "host-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    assert list(folder.iterdir()) == []


def test_every_entry_counts_a_block_and_a_sparse_file_its_apparent_size():
    sparse = tarfile.TarInfo("sparse")
    sparse.size = 200 * MIB
    empty = [tarfile.TarInfo(f"e{n}") for n in range(10)]
    folder = tarfile.TarInfo("d")
    folder.type = tarfile.DIRTYPE
    link = tarfile.TarInfo("l")
    link.type, link.linkname = tarfile.SYMTYPE, "target"
    assert added(sparse) == ENTRY_BYTES + 200 * MIB
    assert count([*empty, folder, link], 1 << 40) == 12 * ENTRY_BYTES + len("target")
    # The count stops once past the limit: what comes after is never looked at.
    assert count(iter([sparse, *empty]), MIB) == ENTRY_BYTES + 200 * MIB


def test_the_stream_is_a_tar_and_refuses_content_that_is_not_its_size():
    info = tarfile.TarInfo("a")
    info.size = 3
    data = b"".join(stream([(info, [b"ab", b"c"])], 1 << 20, BuildRefused))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (member,) = tar.getmembers()
        assert tar.extractfile(member).read() == b"abc"  # type: ignore[union-attr]
    for chunks, said in (([b"ab"], "shrank"), ([b"abcd"], "grew")):
        info = tarfile.TarInfo("a")
        info.size = 3
        with pytest.raises(BuildRefused, match=said):
            b"".join(stream([(info, chunks)], 1 << 20, BuildRefused))
    with pytest.raises(BuildRefused, match="more than was counted"):
        b"".join(stream([(tarfile.TarInfo("x"), None)], 10, BuildRefused))


def test_copy_of_a_sparse_file_past_the_limit_writes_nothing(tmp_path, temp):
    context = tmp_path / "ctx"
    context.mkdir()
    with open(context / "sparse", "wb") as handle:
        handle.truncate(200 * MIB)
    with pytest.raises(BuildRefused) as refused:
        _build(context, "FROM base\nCOPY sparse /sparse\n")
    assert str(refused.value) == (
        f"{context}/Dockerfile:2: COPY: adds at least 200 MiB (apparent sizes, a block per "
        "entry): more than the step's disk limit (32 MiB, --disk) to its layer: nothing was "
        "written"
    )


def test_copy_of_many_empty_files_counts_each_of_them(tmp_path, temp):
    context = tmp_path / "ctx"
    (context / "many").mkdir(parents=True)
    for n in range(300):
        (context / "many" / f"f{n}").touch()
    with pytest.raises(BuildRefused, match="COPY: adds at least 1 MiB"):
        _build(context, "FROM base\nCOPY many /many\n", disk=MIB)
    engine = _build(context, "FROM base\nCOPY many /many\n", disk=2 * MIB)
    assert len(engine.written[0]) == 300


def test_add_of_a_gzip_bomb_is_refused_from_its_headers(tmp_path, temp):
    context = tmp_path / "ctx"
    context.mkdir()
    with tarfile.open(context / "bomb.tar.gz", mode="w:gz") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 64 * MIB

        class Zeros(io.RawIOBase):
            def readinto(self, buffer: Any) -> int:
                buffer[:] = bytes(len(buffer))
                return len(buffer)

        tar.addfile(info, Zeros())
    assert (context / "bomb.tar.gz").stat().st_size < 300 << 10
    with pytest.raises(BuildRefused) as refused:
        _build(context, "FROM base\nADD bomb.tar.gz /opt/\n")
    assert str(refused.value) == (
        f"{context}/Dockerfile:2: ADD: {context}/bomb.tar.gz unpacks to at least 64 MiB "
        "(apparent sizes, a block per entry): more than the step's disk limit (32 MiB, "
        "--disk) to its layer: nothing was written"
    )
    # Under the limit it unpacks, streamed.
    engine = _build(context, "FROM base\nADD bomb.tar.gz /opt/\n", disk=80 * MIB)
    assert [m.name for m in engine.written[0]] == ["opt/zeros"]
    assert engine.written[0][0].size == 64 * MIB


def test_steps_each_under_their_limit_stop_at_the_build_s_budget(tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    steps = "".join(f"RUN echo added={40 * MIB} step{n}\n" for n in range(4))
    with pytest.raises(StepFailed) as failed:
        _build(context, f"FROM base\n{steps}", disk=48 * MIB, total=100 * MIB)
    assert str(failed.value) == (
        f"{context}/Dockerfile:4: RUN: added more than what is left of the build's disk "
        "budget (20 MiB of 100 MiB, --disk-total; the steps before it added 80 MiB) to its "
        "layer (files, folders and links all counted): stopped"
    )
    # A step is given what is left as its limit, never more.
    engine = _build(context, f"FROM base\n{steps}", disk=48 * MIB, total=200 * MIB)
    assert {lim.disk for lim in engine.limits} == {48 * MIB}
    with pytest.raises(StepFailed, match="disk budget \\(80 MiB, --disk-total\\) is used up"):
        _build(context, f"FROM base\n{steps}", disk=48 * MIB, total=80 * MIB)


def test_run_network_none_gets_no_network_and_the_host_rule_warning_comes_once(tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    said: list[str] = []
    engine = _build(
        context,
        "FROM base\nRUN --network=none echo a\nRUN echo b\nRUN echo c\n",
        allow=["pkgs.test"],
        warn=said.append,
        host_rule_missing=lambda: True,
    )
    closed = [s for s in engine.specs if "echo a" in " ".join(s.command)]
    opened = [s for s in engine.specs if "echo b" in " ".join(s.command)]
    assert closed and all(s.network is None and "PROXY" not in " ".join(s.command) for s in closed)
    assert opened and all(s.network == "build-net" and "HTTP_PROXY" in " ".join(s.command)
                          for s in opened)  # fmt: skip
    assert said == [HOST_RULE_WARNING]
    quiet: list[str] = []
    _build(context, "FROM base\nRUN echo b\n", allow=["pkgs.test"], warn=quiet.append,
           host_rule_missing=lambda: False)  # fmt: skip
    assert quiet == []
