"""edgeagent: the inference agent for every device of an edge-AI fleet."""

__version__ = "0.1.0"
