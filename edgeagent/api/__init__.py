"""Transports over the engine's data plane: HTTP (v2 + edge routes), auth, the client."""
