"""The tests' language model: SmolLM2-135M-Instruct Q4_1, fetched by scripts/fetch_models.py.

Small runs only (a context of at most 1024 tokens, 2 threads), so each test takes seconds on
two shared cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.helpers import REPO

MODELS = Path(os.environ.get("EDGEAGENT_THIRD_PARTY", REPO / "third-party-models"))
SMOLLM2 = "smollm2-135m-instruct-q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF's path; the test is skipped, saying how to get it, when it was not fetched."""
    path = MODELS / SMOLLM2
    if not path.is_file():
        pytest.skip(f"{SMOLLM2} not in {MODELS}: run scripts/fetch_models.py (scripts/setup.sh)")
    return path
