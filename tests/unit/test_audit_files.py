"""The block readers behind verify and queries: every line, in both directions."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

import orchestrator.audit.files as files

LINES = st.lists(st.sampled_from([b"", b"a", b"xa", b"bb", b"abc", b"zzzz", b"{}"]), max_size=10)


def expected_lines(content: bytes) -> list[bytes]:
    if not content:
        return []
    lines = content.split(b"\n")
    return lines[:-1] if content.endswith(b"\n") else lines


@given(
    lines=LINES,
    newline_at_end=st.booleans(),
    block=st.sampled_from([1, 2, 3, 7, 1 << 20]),
    needle=st.sampled_from([None, b"a", b"zz", b"{}", b"q"]),
)
@settings(max_examples=500, deadline=None)
def test_readers_yield_every_line_in_order(
    lines: list[bytes], newline_at_end: bool, block: int, needle: bytes | None
) -> None:
    content = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    wanted = [line for line in expected_lines(content) if needle is None or needle in line]
    with tempfile.TemporaryFile() as handle:
        handle.write(content)
        handle.flush()
        saved = files._BLOCK
        files._BLOCK = block
        try:
            forward = list(files.iter_lines(handle, len(content), needle))
        finally:
            files._BLOCK = saved
        backward = list(files.iter_lines_reverse(handle.fileno(), len(content), block, needle))
    assert forward == wanted
    assert backward == wanted[::-1]


def test_readers_stop_at_the_snapshot_size() -> None:
    with tempfile.TemporaryFile() as handle:
        handle.write(b"one\ntwo\nthr")
        handle.flush()
        assert list(files.iter_lines(handle, 8)) == [b"one", b"two"]
        assert list(files.iter_lines_reverse(handle.fileno(), 8)) == [b"two", b"one"]
        assert list(files.iter_lines_reverse(handle.fileno(), 0)) == []
        assert files.ends_with_newline(handle.fileno(), 8)
        assert not files.ends_with_newline(handle.fileno(), 11)
        assert files.ends_with_newline(handle.fileno(), 0)
