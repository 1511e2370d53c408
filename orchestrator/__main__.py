"""``python -m orchestrator``: through a running ``orchestrator serve`` if usable."""

from orchestrator.launcher import main

main()
