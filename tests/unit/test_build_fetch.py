"""``ADD <url>``'s pure parts: the allowlist check, redirects, the fetch's answer line."""

from __future__ import annotations

import json

import pytest

from orchestrator.build.dockerfile import BuildRefused
from orchestrator.build.fetch import (
    ANSWER_MARK,
    MAX_REDIRECTS,
    Answer,
    answer_of,
    check_url,
    file_name,
    next_url,
    parse_checksum,
)

WHERE = "/ctx/Dockerfile:3: ADD"
ALLOW = ["pkgs.example.org:8000", "*.files.example.org"]


def test_a_url_on_the_allowlist_gives_its_host_and_port():
    assert check_url("http://pkgs.example.org:8000/a.whl", ALLOW, WHERE) == (
        "pkgs.example.org",
        8000,
    )
    assert check_url("https://cdn.files.example.org/x", ALLOW, WHERE) == (
        "cdn.files.example.org",
        443,
    )


@pytest.mark.parametrize(
    ("url", "allow", "said"),
    [
        ("http://pkgs.example.org/a", ALLOW, "pkgs.example.org:80 is not on the project's build"),
        ("http://other.example.org:8000/a", ALLOW, "other.example.org:8000 is not on the"),
        ("https://files.example.org/a", ALLOW, "files.example.org:443 is not on the"),
        ("http://pkgs.example.org:8000/a", [], "the project declares no build allowlist"),
        ("http://user:pw@pkgs.example.org:8000/a", ALLOW, "credentials in a URL are never sent"),
        ("ftp://pkgs.example.org:8000/a", ALLOW, "only http and https URLs are fetched"),
        ("http://pkgs.example.org:99999/a", ALLOW, "not a URL"),
    ],
)
def test_a_url_off_the_allowlist_is_refused_in_one_line_naming_the_line(url, allow, said):
    with pytest.raises(BuildRefused) as refused:
        check_url(url, allow, WHERE)
    message = str(refused.value)
    assert message.startswith(f"{WHERE}: {url}: ") and said in message
    assert "\n" not in message


def test_a_redirect_is_checked_against_the_allowlist_before_it_is_followed():
    start = "http://pkgs.example.org:8000/moved"
    assert (
        next_url(start, Answer(status=302, location="/real.txt"), ALLOW, WHERE, 0)
        == "http://pkgs.example.org:8000/real.txt"
    )
    with pytest.raises(BuildRefused) as refused:
        next_url(start, Answer(status=302, location="http://evil.example.net/x"), ALLOW, WHERE, 0)
    assert str(refused.value) == (
        f"{WHERE}: {start} redirected to http://evil.example.net/x: evil.example.net:80 is not "
        "on the project's build allowlist (build.allow): not followed"
    )
    with pytest.raises(BuildRefused, match="more than 10 redirects"):
        next_url(start, Answer(status=302, location="/a"), ALLOW, WHERE, MAX_REDIRECTS)
    with pytest.raises(BuildRefused, match="without a Location"):
        next_url(start, Answer(status=301), ALLOW, WHERE, 0)


def test_the_answer_is_the_last_marked_line_and_only_its_typed_fields():
    out = "noise\n" + ANSWER_MARK + json.dumps({"status": 200, "size": 5, "sha256": "x",
                                                "location": 7, "proxy": "yes"}) + "\n"  # fmt: skip
    assert answer_of(out) == Answer(status=200, size=5)
    assert answer_of("no answer\n") is None
    assert answer_of(ANSWER_MARK + "{not json\n") is None
    assert answer_of(ANSWER_MARK + "[1]\n") is None


def test_a_file_name_comes_from_the_url_path_and_a_checksum_is_sha256_only():
    assert file_name("http://h.example/a/b%20c.tar.gz?x=1", WHERE) == "b c.tar.gz"
    with pytest.raises(BuildRefused, match="no file name in the URL"):
        file_name("http://h.example/", WHERE)
    digest = "ab" * 32
    assert parse_checksum(f"sha256:{digest.upper()}", WHERE) == digest
    with pytest.raises(BuildRefused, match="expected sha256: and 64 hexadecimal digits"):
        parse_checksum("md5:abc", WHERE)
