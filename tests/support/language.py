"""The tests' language model: SmolLM2-135M-Instruct Q4_1, fetched by scripts/fetch_models.py.

Small runs only (a context of at most 1024 tokens, 2 threads), so each test takes seconds on
two shared cores.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from edgeagent.models.manifest_writer import write_table
from tests.support.helpers import REPO

MODELS = Path(os.environ.get("EDGEAGENT_THIRD_PARTY", REPO / "third-party-models"))
SMOLLM2 = "smollm2-135m-instruct-q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF's path; the test is skipped, saying how to get it, when it was not fetched."""
    path = MODELS / SMOLLM2
    if not path.is_file():
        pytest.skip(f"{SMOLLM2} not in {MODELS}: run scripts/fetch_models.py (scripts/setup.sh)")
    return path


def text_table(name: str = "smollm2", version: str = "1.0.0") -> dict[str, Any]:
    """model.toml of SmolLM2's text-generation package, as tables (what the GGUF says)."""
    return {
        "name": name,
        "version": version,
        "task": "text-generation",
        "description": "SmolLM2 135M Instruct",
        "text": {
            "architecture": "llama",
            "context": 8192,
            "chat_template": True,
            "bos": "<|im_start|>",
            "eos": "<|im_end|>",
            "stop": ["<|im_end|>"],
        },
        "variant": [{"runtime": "llama_cpp", "precision": "q4_1", "files": [SMOLLM2]}],
    }


def write_text_package(root: Path, name: str = "smollm2", version: str = "1.0.0") -> Path:
    """A text-generation package of the SmolLM2 GGUF in ``root`` (the file hard-linked where
    the file system allows, else copied: a package may not point outside itself)."""
    source = smollm2_gguf()
    root.mkdir(parents=True, exist_ok=True)
    write_table(root, text_table(name, version))
    target = root / SMOLLM2
    if not target.exists():
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    return root


def write_embedding_package(root: Path, name: str = "smollm2") -> Path:
    """SmolLM2's GGUF as an ``embedding`` package: llama.cpp's mean-pooled hidden states of
    the chat model (no embedding model is pinned in the package index for the tests)."""
    write_text_package(root, name)
    table = text_table(name)
    table["task"] = "embedding"
    table["description"] = "SmolLM2 135M Instruct, mean-pooled hidden states"
    write_table(root, table)
    return root
