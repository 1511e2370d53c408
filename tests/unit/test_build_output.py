"""How a build step's output is shown: whole lines, however the engine cut it."""

from __future__ import annotations

from orchestrator.build.builder import _OutputLines


def test_a_line_written_in_pieces_is_shown_as_one_line():
    lines = _OutputLines()
    # print("answered", 5000) with PYTHONUNBUFFERED=1: four writes, four chunks.
    shown = [line for chunk in (b"answered", b" ", b"5000", b"\n") for line in lines.feed(chunk)]
    assert shown == ["answered 5000"]


def test_a_character_cut_between_chunks_is_put_together():
    lines = _OutputLines()
    text = "caf\u00e9 \u2713\n".encode()
    assert lines.feed(text[:4]) == [] and lines.feed(text[4:]) == ["caf\u00e9 \u2713"]


def test_the_last_line_without_an_end_is_shown_at_the_end_of_the_output():
    lines = _OutputLines()
    assert lines.feed(b"one\ntwo\nthr") == ["one", "two"]
    assert lines.feed(b"ee", end=True) == ["three"]
    assert lines.feed(b"", end=True) == []


def test_a_line_that_never_ends_is_shown_in_pieces_of_the_limit():
    lines = _OutputLines(limit=8)
    assert lines.feed(b"12345") == []
    assert lines.feed(b"678\r90") == ["12345678", "90"]
    assert lines.feed(b"x") == []
