"""Renderers: a compiled plan written out for systems the orchestrator does not drive itself.

Pure: they take a :class:`~orchestrator.plan.ContainerSpec` and return plain data.
"""
