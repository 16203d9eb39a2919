"""Sub-commands of the edgeagent CLI that belong to no single area."""
