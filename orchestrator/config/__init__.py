"""Declarations: strict models for the project and worker files, and their loader.

Pure: imports neither docker nor git.
"""

from orchestrator.config.loader import (
    PROJECT_FILE,
    Project,
    Worker,
    Zone,
    find_worker,
    load_model,
    load_project,
    load_worker,
)
from orchestrator.config.models import (
    Defaults,
    ProjectConfig,
    Resources,
    SandboxRequest,
    WorkerConfig,
    ZoneConfig,
    ZoneRequest,
    parse_size,
)

__all__ = [
    "PROJECT_FILE",
    "Defaults",
    "Project",
    "ProjectConfig",
    "Resources",
    "SandboxRequest",
    "Worker",
    "WorkerConfig",
    "Zone",
    "ZoneConfig",
    "ZoneRequest",
    "find_worker",
    "load_model",
    "load_project",
    "load_worker",
    "parse_size",
]
