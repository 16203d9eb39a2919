"""Where the built model zoo is: what the benchmarks read by default, like the tests.

``EDGEAGENT_ZOO`` points every reader at another zoo (a CI cache, or a test's small one), so a
bench's default model and its smoke test's tiny stand-in go through the same lookup.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def zoo_dir() -> Path:
    """``$EDGEAGENT_ZOO``, else the checkout's ``zoo/`` (scripts/build_models.py's output)."""
    return Path(os.environ.get("EDGEAGENT_ZOO", REPO / "zoo"))
