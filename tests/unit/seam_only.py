"""A backend seen through the seam alone: :class:`~orchestrator.runtime.backend.Backend`
and the :class:`~orchestrator.runtime.backend.Launch` it makes, nothing else.

:class:`SeamOnly` forwards exactly the members the two protocols declare and refuses every
other attribute, so a run, a session or a pool driven through it shows that the runtime
above the seam needs nothing more of a new backend (it would fail with an AttributeError
naming what it reached for).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.runtime.backend import Backend, Capabilities, Launch


def members(protocol: type) -> frozenset[str]:
    """The public members a protocol declares: its methods, properties and attributes."""
    declared = {name for name in vars(protocol) if not name.startswith("_")}
    return frozenset(declared | set(getattr(protocol, "__annotations__", {})))


class Only:
    """``inner`` through ``protocol``'s members alone."""

    def __init__(self, inner: Any, protocol: type) -> None:
        self._inner = inner
        self._protocol = protocol
        self._members = members(protocol)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._members:
            raise AttributeError(f"{name!r} is not a member of {self._protocol.__name__}")
        return getattr(self._inner, name)


class LaunchOnly(Only):
    def __init__(self, inner: Any) -> None:
        super().__init__(inner, Launch)


class SeamOnly(Only):
    """A backend as the runtime may see it; ``name`` and ``capabilities`` may be given
    to play another backend (one without execs, say)."""

    def __init__(
        self, inner: Any, *, name: str | None = None, capabilities: dict[str, Any] | None = None
    ) -> None:
        super().__init__(inner, Backend)
        self.name = name or inner.name
        self._capabilities = capabilities or {}
        self.launches: list[LaunchOnly] = []

    @property
    def capabilities(self) -> Capabilities:
        return replace(self._inner.capabilities, **self._capabilities)

    def launch(self, prepared: Any, *, output: bool, keep_alive: bool) -> LaunchOnly:
        made = LaunchOnly(self._inner.launch(prepared, output=output, keep_alive=keep_alive))
        self.launches.append(made)
        return made
