"""Shared memory regions that callers register, so tensors never travel in the request body."""
