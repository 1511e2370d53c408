"""The builder's pure parts: Dockerfile stages and refusals, words, ``.dockerignore``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.build.context import Context
from orchestrator.build.dockerfile import BuildRefused, SecretMount, parse, secret_mounts
from orchestrator.build.words import WordError, expand

FILE = Path("/ctx/Dockerfile")


def test_stages_heredocs_continuations_and_args_before_from():
    parsed = parse(
        FILE,
        "# syntax=docker/dockerfile:1\nARG BASE=debian\nFROM --platform=linux/amd64 ${BASE} AS"
        " build\nRUN echo a && \\\n    echo b\nRUN <<EOT\nset -e\necho c\nEOT\n"
        'FROM build\nCOPY --from=build ["/a", "/b"]\n',
    )
    assert [a.words for a in parsed.global_args] == [("BASE=debian",)]
    first, second = parsed.stages
    assert (first.name, first.base, second.base) == ("build", "${BASE}", "build")
    assert first.instructions[0].words == ("echo a &&     echo b",)
    assert first.instructions[1].heredocs == (("EOT", "set -e\necho c\n"),)
    assert second.instructions[0].json and second.instructions[0].flag("from") == "build"
    assert parsed.base_of(first, {"BASE": "debian"}) == "debian"
    assert [s.index for s in parsed.needed(parsed.target(None), {})] == [0, 1]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("RUN --security=insecure true", "Dockerfile:2: RUN: --security=insecure would run"),
        ("RUN --mount=type=secret,id=t,env=T x", "Dockerfile:2: RUN: --mount=type=secret,id=t"),
        ("RUN --mount=type=secret,src=/etc/x x", "src: not an option of a secret mount"),
        ("RUN --mount=type=secret x", "Dockerfile:2: RUN: --mount=type=secret: needs id=NAME"),
        ("RUN --mount=type=secret,id=t,mode=999 x", "mode=999: expected an octal mode"),
        ("RUN --mount=type=ssh true", "Dockerfile:2: RUN: --mount=type=ssh: a build never"),
        ("RUN --mount=type=bind,target=/x true", "--mount=type=bind is not supported"),
        ("RUN --privileged true", "Dockerfile:2: RUN: --privileged runs with every privilege"),
        ("RUN --network=host true", "Dockerfile:2: RUN: --network=host: a step gets no network"),
        ("ADD git@example.org:a/b.git /x", "Dockerfile:2: ADD: git@example.org:a/b.git: ADD of a"),
        ("ADD https://example.org/a/b.git /x", "ADD: https://example.org/a/b.git: ADD of a git"),
        ("ADD ftp://example.org/x /x", "Dockerfile:2: ADD: ftp://example.org/x: only http and"),
        ("ADD --checksum=sha256:00 local /x", "Dockerfile:2: ADD: --checksum is only for a URL"),
        ("ADD --keep-git-dir=true https://example.org/x /x", "ADD: --keep-git-dir is not supp"),
        ("ONBUILD RUN true", "Dockerfile:2: ONBUILD: ONBUILD is not supported"),
        ("FROM --platform=linux/arm64 x", "Dockerfile:2: FROM: --platform=linux/arm64: only"),
    ],
)
def test_what_cannot_be_made_safe_is_refused_naming_file_line_and_instruction(line, said):
    with pytest.raises(BuildRefused) as refused:
        parse(FILE, f"FROM x\n{line}\n")
    assert said in str(refused.value)
    assert str(refused.value).startswith("/ctx/Dockerfile:2: ")


def test_secret_mounts_are_read_with_buildkit_defaults():
    parsed = parse(
        FILE,
        "FROM x\nRUN --mount=type=secret,id=token --mount=type=cache,target=/c \\\n"
        "    --mount=type=secret,target=/etc/key,required,mode=0440,uid=1000,gid=100 true\n",
    )
    (run,) = parsed.stages[0].instructions
    assert secret_mounts(parsed, run) == [
        SecretMount(id="token", target="/run/secrets/token", required=False),
        SecretMount(id="key", target="/etc/key", required=True, mode=0o440, uid=1000, gid=100),
    ]


def test_a_target_builds_only_the_stages_it_needs():
    parsed = parse(FILE, "FROM a AS one\nFROM b AS two\nCOPY --from=one /x /x\nFROM c AS three\n")
    assert [s.name for s in parsed.needed(parsed.target("two"), {})] == ["one", "two"]
    with pytest.raises(BuildRefused, match="no stage named 'four'"):
        parsed.target("four")


def test_words_lose_their_quotes_and_expand_as_docker_does():
    env = {"A": "1", "EMPTY": ""}
    assert expand('"two words"', env) == "two words"
    assert expand("'$A'", env) == "$A"
    assert expand('"$A"-${A}-\\$A', env) == "1-1-$A"
    assert expand("${EMPTY:-d} ${EMPTY-d} ${A:+set} ${B:+set}", env) == "d  set "
    with pytest.raises(WordError):
        expand('"open', env)
    with pytest.raises(WordError, match="B: needed"):
        expand("${B:?needed}", env)


def test_the_context_honours_dockerignore_and_never_follows_a_link(tmp_path):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "a.txt").write_text("a")
    (tmp_path / "keep" / "b.log").write_text("b")
    (tmp_path / "keep" / "important.log").write_text("c")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("k")
    (tmp_path / "outside").symlink_to("/etc")
    (tmp_path / ".dockerignore").write_text("secret\n**/*.log\n!keep/important.log\n")
    context = Context.open(tmp_path)
    try:
        assert sorted(context.items) == [
            "",
            ".dockerignore",
            "keep",
            "keep/a.txt",
            "keep/important.log",
            "outside",
        ]
        assert context.items["outside"].link == "/etc"
        assert [i.path for i in context.select("keep/*.txt", "here")] == ["keep/a.txt"]
        with pytest.raises(BuildRefused, match="secret/key: not found in the build context"):
            context.select("secret/key", "here")
    finally:
        context.close()


def test_a_hard_link_to_a_file_outside_the_context_is_refused(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host")
    (tmp_path / "ctx").mkdir()
    os.link(outside, tmp_path / "ctx" / "hard")
    context = Context.open(tmp_path / "ctx")
    try:
        with pytest.raises(BuildRefused, match="is a hard link to a file outside the build"):
            context.check(context.items["hard"], "Dockerfile:2: COPY")
    finally:
        context.close()


def test_add_of_an_http_url_is_read_with_its_checksum():
    parsed = parse(FILE, "FROM x\nADD --checksum=sha256:ab https://example.org/f.txt /f.txt\n")
    (add,) = parsed.stages[0].instructions
    assert add.flag("checksum") == "sha256:ab"
    assert add.words == ("https://example.org/f.txt", "/f.txt")
