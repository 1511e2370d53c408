"""The Harbor environment: ``harbor run --env orchestrator.integrations.harbor.environment:
OrchestratorEnvironment``.

Harbor (``pip install 'orchestrator[harbor]'``, Python 3.12 or newer) runs each trial of a
task in an environment it asks a provider for; this one gives the trial a session of this
project: the hardened container a run of a worker gets (gVisor for untrusted workers, no
capabilities, a read-only root, limits), Harbor's network policy mapped onto the project's
network modes (an allowlist enforced and audited by the egress proxy) and its mounts onto
zones. See docs/harbor.md. Only :mod:`.environment` imports ``harbor``; :mod:`.mapping`
(the task's settings as this project's declarations) is pure.
"""
