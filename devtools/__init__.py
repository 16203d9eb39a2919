"""Development tools shared by the test suite and the benchmark scripts.

They live outside ``tests/`` so a benchmark script never imports the test suite, and outside
``edgeagent/`` so they are not shipped: ``pyproject.toml`` packages only ``edgeagent*``.
"""
