"""Adapters that plug this project's sandboxes into outside evaluation harnesses.

Each harness has a package of its own here, installed by an extra of the same name
(``pip install 'orchestrator[inspect]'``), and only that package imports the harness. The
adapters use the public library API (:class:`orchestrator.Orchestrator`, sessions) like any
other caller.
"""
