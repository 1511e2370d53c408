"""``python -m orchestrator``."""

from orchestrator.cli.main import main

main()
