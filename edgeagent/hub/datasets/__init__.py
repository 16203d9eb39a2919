"""Datasets from the samples devices captured: exported in formats other tools read."""
