"""The Inspect AI sandbox provider: ``sandbox="orchestrator"`` in an Inspect task.

Registered through the ``inspect_ai`` entry-point group (``pip install
'orchestrator[inspect]'``); its settings model, :class:`OrchestratorSandboxConfig`, needs
no Inspect import::

    from inspect_ai.util import SandboxEnvironmentSpec
    from orchestrator.integrations.inspect import OrchestratorSandboxConfig

    sandbox = SandboxEnvironmentSpec(
        "orchestrator", OrchestratorSandboxConfig(project="proj", worker="agent")
    )

See docs/inspect.md. Only :mod:`.provider` imports ``inspect_ai``.
"""

from orchestrator.integrations.inspect.config import Environment, OrchestratorSandboxConfig

__all__ = ["Environment", "OrchestratorSandboxConfig"]
