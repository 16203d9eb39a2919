"""The llama.cpp generative plugin on the real SmolLM2 GGUF: several sequences in one decode,
logits per sequence, KV freed and shared, facts from the file's metadata, the memory budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
from edgeagent.runtimes import RuntimeLoadError, get_runtime
from edgeagent.runtimes.generative import (
    GenerativeLoadRequest,
    GenerativeRuntime,
    GenerativeSession,
    SequenceInput,
)
from tests.support.language import smollm2_gguf

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def _request(path: Path, **overrides: object) -> GenerativeLoadRequest:
    fields: dict = {"files": (path,), "context": 512, "sequences": 4, "batch_tokens": 128}
    fields["threads"] = 2
    fields.update(overrides)
    return GenerativeLoadRequest(**fields)


@pytest.fixture(scope="module")
def session() -> Iterator[GenerativeSession]:
    loaded = get_runtime("llama_cpp").load(_request(smollm2_gguf()))
    yield loaded
    loaded.close()


def _greedy(session: GenerativeSession, sequence: int, prompt: list[int], count: int) -> list[int]:
    logits = session.step([SequenceInput(sequence, tuple(prompt), 0)])[sequence]
    tokens = [int(logits.argmax())]
    for index in range(count - 1):
        step = SequenceInput(sequence, (tokens[-1],), len(prompt) + index)
        tokens.append(int(session.step([step])[sequence].argmax()))
    session.free(sequence)
    return tokens


def test_the_runtime_is_generative_and_lists_the_cpu() -> None:
    runtime = get_runtime("llama_cpp")
    assert isinstance(runtime, GenerativeRuntime)
    assert runtime.devices()[0] == "CPU"
    with pytest.raises(RuntimeLoadError, match="no device 'CUDA7'"):
        runtime.load(_request(smollm2_gguf(), device="CUDA7"))


def test_facts_are_the_files_own_metadata(session: GenerativeSession) -> None:
    """Read back independently with the gguf library (what llama.cpp's own tools use)."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(smollm2_gguf())

    def field(key: str) -> object:
        return reader.fields[key].contents()

    facts = session.facts
    assert facts.architecture == field("general.architecture") == "llama"
    assert facts.context_trained == field("llama.context_length")
    assert facts.chat_template == field("tokenizer.chat_template")
    tokens = field("tokenizer.ggml.tokens")
    assert facts.vocabulary == len(tokens)
    assert facts.eos_token == tokens[field("tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert facts.bos_token == tokens[field("tokenizer.ggml.bos_token_id")]
    assert facts.quantization == "Q4_1"
    assert facts.embedding_length == field("llama.embedding_length")


def test_end_tokens_are_the_vocabularys_end_of_generation(session: GenerativeSession) -> None:
    (im_end,) = session.tokenize("<|im_end|>", add_special=False)
    (text_end,) = session.tokenize("<|endoftext|>", add_special=False)
    assert session.is_end(im_end) and session.is_end(text_end)
    assert not any(session.is_end(t) for t in session.tokenize("Paris", add_special=False))
    # parse_special=False: the same text is plain characters, not the control token
    assert len(session.tokenize("<|im_end|>", add_special=False, parse_special=False)) > 1


def test_pieces_rebuild_the_text_byte_for_byte(session: GenerativeSession) -> None:
    text = "Grüße, 東京 🚀!"
    tokens = session.tokenize(text, add_special=False)
    assert b"".join(session.piece(t) for t in tokens).decode("utf-8") == text
    # a multi-byte character spread over tokens: some piece alone is not valid UTF-8
    rocket = session.tokenize("🚀", add_special=False)
    assert len(rocket) > 1 and b"".join(map(session.piece, rocket)) == "🚀".encode()


def test_sequences_in_one_decode_answer_as_each_alone(session: GenerativeSession) -> None:
    prompt = session.tokenize(PROMPT, add_special=False)
    other = session.tokenize("<|im_start|>user\nCount to five.<|im_end|>\n", add_special=False)
    alone_a = session.step([SequenceInput(0, tuple(prompt), 0)])[0]
    alone_b = session.step([SequenceInput(1, tuple(other), 0)])[1]
    session.free(0)
    session.free(1)
    together = session.step([SequenceInput(2, tuple(other), 0), SequenceInput(3, tuple(prompt), 0)])
    assert set(together) == {2, 3}
    assert together[3].shape == (session.facts.vocabulary,) and together[3].dtype == np.float32
    np.testing.assert_allclose(together[3], alone_a, atol=1e-2)
    np.testing.assert_allclose(together[2], alone_b, atol=1e-2)
    session.free(2)
    session.free(3)
    answer = _greedy(session, 0, prompt, 8)
    assert b"".join(map(session.piece, answer)).decode().startswith("The capital of France")


def test_free_returns_the_kv_and_copy_prefix_shares_it(session: GenerativeSession) -> None:
    prompt = session.tokenize(PROMPT, add_special=False)
    per_token = session.kv_bytes()[1] // session.context
    assert session.kv_bytes()[0] == 0
    full = session.step([SequenceInput(0, tuple(prompt), 0)])[0]
    assert session.kv_bytes()[0] == len(prompt) * per_token
    session.copy_prefix(0, 1, len(prompt) - 3)
    assert session.kv_bytes()[0] == len(prompt) * per_token  # shared cells counted once
    rest = session.step([SequenceInput(1, tuple(prompt[-3:]), len(prompt) - 3)])[1]
    np.testing.assert_allclose(rest, full, atol=1e-2)
    session.free(0)
    session.free(1)
    assert session.kv_bytes()[0] == 0
    again = session.step([SequenceInput(0, tuple(prompt), 0)])[0]  # the slot is reusable at once
    np.testing.assert_allclose(again, full, atol=1e-2)
    session.free(0)


def test_a_sequence_outside_the_context_is_refused(session: GenerativeSession) -> None:
    from edgeagent.runtimes import InferenceError

    with pytest.raises(InferenceError, match="sequence 9 is outside 0..3"):
        session.step([SequenceInput(9, (1,), 0)])


def test_a_model_over_the_memory_budget_is_refused_with_the_numbers() -> None:
    request = _request(smollm2_gguf(), context=1024, options={"memory_budget_bytes": 100 << 20})
    with pytest.raises(
        RuntimeLoadError,
        match=r"needs \d+ MiB \(weights 92 MiB \+ KV cache 22 MiB"
        r" for 1024 tokens .* budget is 100 MiB",
    ):
        get_runtime("llama_cpp").load(request)


def test_a_closed_session_refuses_instead_of_reading_freed_memory() -> None:
    from edgeagent.runtimes import InferenceError

    closed = get_runtime("llama_cpp").load(_request(smollm2_gguf(), context=64, sequences=1))
    closed.close()
    closed.close()  # twice is harmless
    with pytest.raises(InferenceError, match="closed"):
        closed.tokenize("hi", add_special=False)
    with pytest.raises(InferenceError, match="closed"):
        closed.step([SequenceInput(0, (1,), 0)])
