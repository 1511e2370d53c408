"""The openai-agents SDK's sandbox client: sandbox sessions that are this project's sessions.

``pip install 'orchestrator[agents]'``, then::

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from orchestrator.integrations.agents import (
        OrchestratorSandboxClient,
        OrchestratorSandboxClientOptions,
    )

    options = OrchestratorSandboxClientOptions(project="proj", worker="agent")
    sandbox = SandboxRunConfig(client=OrchestratorSandboxClient(), options=options)
    config = RunConfig(sandbox=sandbox)
    result = await Runner.run(SandboxAgent(name="a", model=...), "task", run_config=config)

See docs/agents-sandbox.md. Only :mod:`.client` imports ``agents`` (the names above are
loaded from it when first used); :mod:`.mapping` is pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.integrations.agents.client import (
        OrchestratorSandboxClient,
        OrchestratorSandboxClientOptions,
        OrchestratorSandboxSession,
        OrchestratorSandboxSessionState,
    )

__all__ = [
    "OrchestratorSandboxClient",
    "OrchestratorSandboxClientOptions",
    "OrchestratorSandboxSession",
    "OrchestratorSandboxSessionState",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from orchestrator.integrations.agents import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
