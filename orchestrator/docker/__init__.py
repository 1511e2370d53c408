"""The Docker adapter: the only package that imports the Docker SDK."""

from orchestrator.docker.engine import DockerEngine, is_transient

__all__ = ["DockerEngine", "is_transient"]
