"""An embedding package served to the stock ``openai`` and ``ollama`` clients, unchanged:
``/v1/embeddings`` (float and the client's default base64), ``/api/embed`` and the legacy
``/api/embeddings``. The model is SmolLM2's GGUF packaged with task ``embedding``: llama.cpp
pools its hidden states (mean), which is what the agent serves for a decoder-only model."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import ollama
import openai
import pytest

from devtools.agent_process import TOKEN
from tests.support.language import write_embedding_package
from tests.support.language_agent import MODEL, LanguageAgent, language_agent

TEXTS = ["a cat sat on the mat", "a cat sat on the mat", "the tax law of 1986"]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanguageAgent]:
    root = tmp_path_factory.mktemp("embed")
    with language_agent(root, package=lambda at: write_embedding_package(at, MODEL)) as running:
        yield running


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a), np.asarray(b)
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def test_the_openai_client_embeds_in_floats_and_base64(agent: LanguageAgent) -> None:
    client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=TOKEN, max_retries=0)
    default = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks base64
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in default.data] == [0, 1, 2]
    vectors = [d.embedding for d in floats.data]
    assert len(vectors[0]) == 576 and vectors[0] == vectors[1]
    np.testing.assert_allclose(default.data[2].embedding, vectors[2], rtol=1e-6)
    assert _cosine(vectors[0], vectors[2]) < 0.99  # different texts, different vectors
    assert default.usage.prompt_tokens > len(TEXTS)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])


def test_the_ollama_client_embeds_with_both_endpoints(agent: LanguageAgent) -> None:
    client = ollama.Client(host=agent.url, headers={"Authorization": f"Bearer {TOKEN}"})
    embedded = client.embed(model=MODEL, input=TEXTS)  # /api/embed
    assert len(embedded.embeddings) == 3 and embedded.embeddings[0] == embedded.embeddings[1]
    legacy = client.embeddings(model=MODEL, prompt=TEXTS[2])  # /api/embeddings
    np.testing.assert_allclose(legacy.embedding, embedded.embeddings[2], rtol=1e-5, atol=1e-6)
    assert client.show(MODEL).capabilities == ["embedding"]
