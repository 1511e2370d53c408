"""The Docker adapter: the only package that imports the Docker SDK."""

from orchestrator.docker.client import is_transient
from orchestrator.docker.engine import DockerEngine

__all__ = ["DockerEngine", "is_transient"]
