"""Dockerfile words: quotes removed and ``$VAR`` expanded, as Docker's builder does.

The parser (the ``dockerfile`` package, BuildKit's own parser) splits an instruction into
its words but leaves them as written: ``ENV B="two words"`` gives ``"two words"`` with its
quotes. What a word means is the builder's business (BuildKit's ``shell.Lex``): single
quotes are literal, double quotes let ``$`` expand, the escape character (``\\``, or the
one a ``# escape=`` directive names) escapes the next one, and ``$NAME``, ``${NAME}``,
``${NAME:-word}``, ``${NAME:+word}`` (and the forms without ``:``) expand from the build's
variables. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["WordError", "expand"]


class WordError(ValueError):
    """A word cannot be processed (an unterminated quote or ``${``); the phrase says why."""


def expand(word: str, variables: Mapping[str, str], *, escape: str = "\\") -> str:
    """``word`` with its quotes removed and its variables expanded."""
    return _Lexer(word, variables, escape).word()


class _Lexer:
    def __init__(self, text: str, variables: Mapping[str, str], escape: str) -> None:
        self.text, self.variables, self.escape = text, variables, escape
        self.at = 0

    def _peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def _take(self) -> str:
        char = self._peek()
        self.at += 1
        return char

    def word(self, stop: str = "") -> str:
        out: list[str] = []
        while self.at < len(self.text):
            char = self._peek()
            if stop and char in stop:
                break
            self.at += 1
            if char == self.escape:
                out.append(self._take())
            elif char == "'":
                out.append(self._single())
            elif char == '"':
                out.append(self._double())
            elif char == "$":
                out.append(self._variable())
            else:
                out.append(char)
        return "".join(out)

    def _single(self) -> str:
        end = self.text.find("'", self.at)
        if end < 0:
            raise WordError(f"unterminated single quote in {self.text!r}")
        value, self.at = self.text[self.at : end], end + 1
        return value

    def _double(self) -> str:
        out: list[str] = []
        while True:
            if self.at >= len(self.text):
                raise WordError(f"unterminated double quote in {self.text!r}")
            char = self._take()
            if char == '"':
                return "".join(out)
            if char == self.escape and self._peek() in ('"', "$", self.escape):
                out.append(self._take())
            elif char == "$":
                out.append(self._variable())
            else:
                out.append(char)

    def _name(self) -> str:
        start = self.at
        while self._peek() and (self._peek().isalnum() or self._peek() == "_"):
            self.at += 1
        return self.text[start : self.at]

    def _variable(self) -> str:
        if self._peek() != "{":
            name = self._name()
            return self.variables.get(name, "") if name else "$"
        self.at += 1
        name = self._name()
        if not name:
            raise WordError(f"bad substitution in {self.text!r}")
        if self._peek() == "}":
            self.at += 1
            return self.variables.get(name, "")
        colon = self._peek() == ":"
        if colon:
            self.at += 1
        operator = self._take()
        if operator not in ("-", "+", "?"):
            raise WordError(f"unsupported substitution '${{{name}{operator}' in {self.text!r}")
        argument = self.word(stop="}")
        if self._take() != "}":
            raise WordError(f"unterminated '${{' in {self.text!r}")
        value = self.variables.get(name)
        is_set = value is not None and (value != "" or not colon)
        if operator == "-":
            return value if is_set and value is not None else argument
        if operator == "+":
            return argument if is_set else ""
        if not is_set:
            raise WordError(f"{name}: {argument or 'is not set'}")
        return value or ""
