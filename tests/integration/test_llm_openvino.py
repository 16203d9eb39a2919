"""OpenVINO GenAI as a second generative runtime (runtimes/openvino_genai.py): an IR converted
from SmolLM2's GGUF by GenAI itself, ranked by the probe beside llama.cpp, and served through
the scheduler's generation-level path to the stock ``openai`` client, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from devtools.agent_process import TOKEN
from edgeagent.engine.language.loading import place
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.models.manifest_writer import write_table
from edgeagent.models.package import load_package
from tests.support.language import smollm2_gguf, text_table, write_text_package
from tests.support.language_agent import (
    MODEL,
    LanguageAgent,
    language_agent,
    whole_and_streamed,
)

ovg_plugin = pytest.importorskip("edgeagent.runtimes.openvino_genai")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def ir(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """SmolLM2's IR, converted once from the GGUF by OpenVINO GenAI's own reader."""
    return ovg_plugin.ir_from_gguf(smollm2_gguf(), tmp_path_factory.mktemp("ir") / "openvino")


def _with_openvino(root: Path, ir: list[Path], *, only: bool) -> Path:
    """SmolLM2's package with the IR as an openvino_genai variant (the only one, or beside
    the GGUF's llama_cpp variant)."""
    write_text_package(root, MODEL)
    (root / "openvino").mkdir()
    for file in ir:
        (root / "openvino" / file.name).hardlink_to(file)
    table = text_table(MODEL)
    variant = {
        "runtime": "openvino_genai",
        "precision": "q4_1",
        "files": [f"openvino/{file.name}" for file in ir],
    }
    table["variant"] = [variant] if only else [*table["variant"], variant]
    write_table(root, table)
    return root


def test_the_probe_ranks_openvino_genai_beside_llama_cpp(tmp_path: Path, ir: list[Path]) -> None:
    package = load_package(_with_openvino(tmp_path / "m", ir, only=False))
    placed = place(package, LanguageSettings(context=128, sequences=1, threads=2))
    try:
        rates = {attempt.variant: attempt.tokens_per_s for attempt in placed.tried}
        assert set(rates) == {"llama_cpp/q4_1", "openvino_genai/q4_1"}
        assert all(rate and rate > 0 for rate in rates.values()), placed.tried
        assert placed.tokens_per_s == max(r for r in rates.values() if r)
        assert placed.variant.key == max(rates, key=lambda key: rates[key] or 0)
        session = placed.session
        if placed.runtime == "openvino_genai":
            assert session.facts.parameters > 100_000_000 and session.facts.vocabulary == 49152
    finally:
        placed.session.close()


def test_text_split_inside_a_character_is_released_whole(ir: list[Path]) -> None:
    import openvino_genai

    tokenizer = openvino_genai.Tokenizer(str(ir[0].parent))
    text = "héllo 😀 wörld"
    tokens = tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()
    assert len(tokens) > len(text.split())  # the emoji spans tokens
    assembled = ovg_plugin.IncrementalText(tokenizer)
    pieces = [assembled.add([token]) for token in tokens]
    assert all(piece.decode("utf-8") is not None for piece in pieces)  # whole characters
    assert b"".join(pieces).decode() == text
    assert "😀".encode() in pieces  # split over two tokens, released whole with the second


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, ir: list[Path]) -> Iterator[LanguageAgent]:
    root = tmp_path_factory.mktemp("ov-agent")
    with language_agent(root, package=lambda at: _with_openvino(at, ir, only=True)) as running:
        yield running


def test_the_openai_client_streams_from_openvino_genai(agent: LanguageAgent) -> None:
    assert agent.model_status()["runtime"] == "openvino_genai"
    client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=TOKEN, max_retries=0)
    whole, chunks = whole_and_streamed(client, messages=QUESTION, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    assert text and "Paris" in text
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
    streamed = [c.choices[0].delta.content for c in chunks if c.choices]
    assert "".join(p or "" for p in streamed) == text
    assert len([p for p in streamed if p]) > 1  # token by token, not the answer at once
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    stopped = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 7"]
    )
    assert stopped.choices[0].finish_reason == "stop" and "7" not in stopped.choices[0].text
    status = agent.model_status()
    assert status["running"] == 0 and status["kv_bytes_allocated"] > 0
