"""Cameras: a transport whose client is a camera — sources decoded with PyAV, the detector
through the engine's data plane, a tracker, and events over the agent's MQTT link."""
