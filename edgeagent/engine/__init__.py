"""The serving engine, transport-free: registry, batcher, limits, errors, metrics."""
