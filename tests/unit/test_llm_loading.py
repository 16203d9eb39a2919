"""Placing a language package (engine/language/loading.py and the plane's load): every variant
probed by generating, the fastest kept, a failing one skipped with its reason, an embedding
package served by embed only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("llama_cpp")
from edgeagent.engine.errors import InvalidInput, LoadFailed, NotReady
from edgeagent.engine.language.loading import place
from edgeagent.engine.language.plane import LanguagePlane
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.engine.text_requests import GenerationRequest
from edgeagent.models.package import load_package
from tests.support.language import SMOLLM2, write_text_package

SETTINGS = LanguageSettings(context=256, sequences=1, threads=2)
BROKEN = '\n[[variant]]\nruntime = "llama_cpp"\nprecision = "q8_0"\nfiles = ["broken.q8_0.gguf"]\n'


def _with_broken_variant(root: Path, only: bool = False) -> Path:
    (root / "broken.q8_0.gguf").write_bytes(b"GGUF" + b"\x00" * 60)  # a header, nothing more
    manifest = (root / "model.toml").read_text()
    if only:
        start = manifest.index("[[variant]]")
        manifest = manifest[:start] + BROKEN.lstrip()
    else:
        manifest += BROKEN
    (root / "model.toml").write_text(manifest)
    return root


def test_a_variant_that_cannot_load_is_skipped_with_its_reason(tmp_path: Path) -> None:
    package = load_package(_with_broken_variant(write_text_package(tmp_path / "m")))
    placed = place(package, SETTINGS)
    try:
        assert placed.variant.key == "llama_cpp/q4_1" and placed.device == "CPU"
        assert placed.tokens_per_s > 0
        first, second = map(str, placed.tried)
        assert first.startswith("llama_cpp/q4_1 on CPU: ") and "tokens/s" in first
        assert second.startswith("llama_cpp/q8_0 on CPU: llama.cpp could not load broken")
        assert placed.tried[0].tokens_per_s and placed.tried[1].tokens_per_s is None
    finally:
        placed.session.close()


async def test_a_package_no_variant_of_which_loads_fails_and_says_why(tmp_path: Path) -> None:
    root = _with_broken_variant(write_text_package(tmp_path / "m"), only=True)
    (root / SMOLLM2).unlink()
    plane = LanguagePlane(SETTINGS, metrics=CollectorRegistry())
    with pytest.raises(LoadFailed, match="smollm2 1.0.0: llama_cpp/q8_0 on CPU: llama.cpp could"):
        await plane.load(root)
    assert plane.status()["models"]["smollm2"]["state"] == "FAILED"
    with pytest.raises(NotReady, match="failed to load"):
        await plane.generate(GenerationRequest("smollm2", prompt="hi"))


async def test_an_embedding_package_embeds_and_generates_nothing(tmp_path: Path) -> None:
    root = write_text_package(tmp_path / "m")
    manifest = root / "model.toml"
    manifest.write_text(manifest.read_text().replace('"text-generation"', '"embedding"'))
    plane = LanguagePlane(SETTINGS, metrics=CollectorRegistry())
    await plane.load(root)
    try:
        result = await plane.embed(
            "smollm2", ["a cat sat on the mat", "a cat sat on the mat", "tax law"]
        )
        same, other = np.array(result.vectors[0]), np.array(result.vectors[2])
        assert same.shape == (576,) and result.vectors[0] == result.vectors[1]
        assert result.prompt_tokens > 6
        cosine = float(same @ other / np.linalg.norm(same) / np.linalg.norm(other))
        assert cosine < 0.99
        with pytest.raises(InvalidInput, match="is an embedding model: it generates no text"):
            await plane.generate(GenerationRequest("smollm2", prompt="hi"))
        with pytest.raises(InvalidInput, match="at least one text"):
            await plane.embed("smollm2", [])
    finally:
        await plane.close()
